"""Device catalog: dense peaks, per-direction links, ridge points, loading errors."""

from pathlib import Path

import pytest

from hardware.device import catalog_ids, load_device
from perfmodel.errors import SpecError
from perfmodel.units import GiB

REQUIRED_IDS = {
    "h100-sxm",
    "h100-pcie",
    "h200-sxm",
    "h20",
    "a100-sxm-80gb",
    "a100-40gb",
    "l40s",
    "b200",
    "mi250x",
    "mi250",
    "mi300x",
    "ascend-910b2",
    "ascend-910b3",
    "alveo-u280",
    "alveo-v80",
    "tpu-v5e",
}


def test_catalog_has_every_required_device() -> None:
    assert set(catalog_ids()) >= REQUIRED_IDS
    for i in catalog_ids():
        d = load_device(i)
        assert d.id == i
        assert d.sources, f"{i} has no sources"


# Ridge points (dense BF16 FLOP/s / HBM B/s) from shared/reference/hardware_specs.md §3.
@pytest.mark.parametrize(
    ("dev", "ridge"),
    [
        ("h100-sxm", 295),
        ("h100-pcie", 378),
        ("h200-sxm", 206),
        ("h20", 37),
        ("a100-sxm-80gb", 153),
        ("a100-40gb", 201),
        ("l40s", 419),
        ("b200", 281),
        ("mi250x", 117),
        ("mi250", 111),
        ("mi300x", 247),
        ("ascend-910b2", 221),
        ("ascend-910b3", 184),
        ("tpu-v5e", 241),
    ],
)
def test_ridge_points_match_reference(dev: str, ridge: float) -> None:
    assert load_device(dev).ridge_flop_per_byte("bf16") == pytest.approx(ridge, abs=1.0)


def test_dense_not_sparse_and_links_per_direction() -> None:
    h100 = load_device("h100-sxm")
    assert h100.peak("bf16") == pytest.approx(989.4e12)  # not the 1979 sparse headline
    assert h100.scale_up.bw_per_direction_bytes_per_s == 450e9  # not 900 bidirectional
    assert h100.hbm_bytes == 80 * GiB
    mi300x = load_device("mi300x")
    assert mi300x.scale_up.topology == "mesh"
    assert mi300x.scale_up.peer_bw_per_direction_bytes_per_s == 64e9
    assert load_device("ascend-910b2").scale_up.peer_bw_per_direction_bytes_per_s == 28e9


def test_mi250x_is_two_devices_to_software() -> None:
    d = load_device("mi250x")
    assert d.dies_per_package == 2
    assert d.hbm_bytes == 64 * GiB
    assert d.hbm_bw_bytes_per_s == pytest.approx(1.6384e12)
    assert d.peak("bf16") == pytest.approx(191.5e12)
    assert d.peak("int8") == pytest.approx(d.peak("bf16"))  # CDNA2: INT8 rate = FP16 rate


def test_missing_dtype_is_a_clear_error() -> None:
    with pytest.raises(SpecError, match="has no fp8 math"):
        load_device("a100-sxm-80gb").peak("fp8")


def test_unknown_id_lists_valid_ids() -> None:
    with pytest.raises(SpecError, match=r"unknown hardware id 'h100'.*h100-sxm"):
        load_device("h100")


def test_user_toml_file(tmp_path: Path) -> None:
    p = tmp_path / "mine.toml"
    p.write_text(
        'id = "my-npu"\nkind = "npu"\n[compute]\nbf16 = 100e12\n'
        "[memory]\ncapacity_bytes = 34359738368\nbandwidth_bytes_per_s = 1e12\n"
    )
    d = load_device(str(p))
    assert d.id == "my-npu"
    assert d.ridge_flop_per_byte("bf16") == pytest.approx(100.0)
    assert d.scale_up.topology == "none"


def test_malformed_toml_names_file(tmp_path: Path) -> None:
    p = tmp_path / "bad.toml"
    p.write_text("id = \n")
    with pytest.raises(SpecError, match=r"bad\.toml: malformed TOML"):
        load_device(str(p))


def test_missing_and_wrong_fields_are_named(tmp_path: Path) -> None:
    p = tmp_path / "nomem.toml"
    p.write_text('id = "x"\n[compute]\nbf16 = 1e12\n')
    with pytest.raises(SpecError, match="missing field 'memory'"):
        load_device(str(p))
    p.write_text(
        'id = "x"\n[compute]\nbf16 = "fast"\n[memory]\ncapacity_bytes = 1\n'
        "bandwidth_bytes_per_s = 1\n"
    )
    with pytest.raises(SpecError, match="bf16 must be a positive number"):
        load_device(str(p))
    p.write_text(
        'id = "x"\n[compute]\nbf16 = 1e12\n[memory]\ncapacity_bytes = 1\n'
        'bandwidth_bytes_per_s = 1\n[scale_up]\ntopology = "ring"\n'
    )
    with pytest.raises(SpecError, match="topology 'ring'"):
        load_device(str(p))
