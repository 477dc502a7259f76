"""MaxAffine evaluation, roofline-derived profiles, expert-block helpers and profile files."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hardware.device import load_device
from hardware.maxaffine import (
    GEMM_FEATURES,
    MaxAffine,
    Provenance,
    derived_gemm_profile,
    gemm_features,
    roofline_profile,
)
from hardware.profile_io import load_profile, profile_from_dict, profile_to_toml
from hardware.roofline import Roofline
from perfmodel.errors import SpecError
from perfmodel.moe.expert import (
    crossover_tokens,
    derived_expert_profile,
    grouped_padded_rows,
    moe_rank_loads,
    rank_load,
)

H100 = load_device("h100-sxm")
A100 = load_device("a100-sxm-80gb")


def test_evaluation_by_hand() -> None:
    # t = max(1 + 2u + 0v, 3 + 0u + 1v)
    p = MaxAffine(("u", "v"), np.array([1.0, 3.0]), np.array([[2.0, 0.0], [0.0, 1.0]]))
    assert p(u=[0.0, 5.0], v=[0.0, 0.0]).tolist() == [3.0, 11.0]
    assert p(np.array([[1.0, 4.0]])).tolist() == [7.0]
    assert p.active_piece(u=5.0, v=0.0) == 0


@given(
    m=st.integers(1, 70000), n=st.integers(1, 70000), k=st.integers(1, 70000),
    dev=st.sampled_from(["h100-sxm", "a100-sxm-80gb", "mi300x", "l40s"]),
)  # fmt: skip
def test_derived_gemm_profile_is_the_roofline(m: int, n: int, k: int, dev: str) -> None:
    rl = Roofline(load_device(dev))
    prof = derived_gemm_profile(rl)
    assert prof.features == GEMM_FEATURES
    got = float(prof(gemm_features(m, n, k)))
    assert got == pytest.approx(float(rl.gemm_time_s(m, n, k)), rel=1e-12)


def test_roofline_profile_on_pure_compute_and_pure_memory_ops() -> None:
    rl = Roofline(H100)
    prof = roofline_profile(rl)
    flop = 2.0 * 4096**3  # pure compute: 1.374e11 FLOP / (0.8 * 989.4e12) + 5 us
    assert float(prof(flop=flop, bytes=0.0)) == pytest.approx(flop / (0.8 * 989.4e12) + 5e-6)
    assert float(prof(flop=flop, bytes=0.0)) == pytest.approx(
        float(rl.time_s(flop, 0.0, dtype="bf16"))
    )
    nbytes = 1e9  # pure memory: 1e9 B / (0.8 * 3.35e12) + 5 us = 378.13 us
    assert float(prof(flop=0.0, bytes=nbytes)) == pytest.approx(378.134e-6, rel=1e-5)
    assert float(prof(flop=0.0, bytes=nbytes)) == pytest.approx(
        float(rl.time_s(0.0, nbytes, dtype="bf16"))
    )


def test_derived_expert_crossover_is_ridge_times_bytes_over_two() -> None:
    # n* = (peak/BW) * (eff_c/eff_m) * w/2; H100 bf16: 989.4e12/3.35e12 = 295.34
    assert crossover_tokens(derived_expert_profile(H100, 4096, 1536)) == pytest.approx(
        295.34, rel=1e-4
    )
    # A100-80GB: 312e12 / 2.039e12 = 153.02, for any expert shape
    assert crossover_tokens(derived_expert_profile(A100, 7168, 2048)) == pytest.approx(
        153.02, rel=1e-4
    )


def test_crossover_with_intercepts() -> None:
    # max(10 + 4G, 2 + 0.1N): b/beta = 40; with G = 2: (4 + 8/2)/0.1 = 80
    p = MaxAffine(("G", "N"), np.array([10.0, 2.0]), np.array([[4.0, 0.0], [0.0, 0.1]]))
    assert crossover_tokens(p) == pytest.approx(40.0)
    assert crossover_tokens(p, G=2.0) == pytest.approx(80.0)


def test_grouped_padding_formal_models_example() -> None:
    # formal_models.md 5.1: tokens (3, 1, 4, 0) on 4 experts -> 384 padded rows
    assert float(grouped_padded_rows(np.array([3.0, 1.0, 4.0, 0.0]))) == 384.0


def test_balanced_routing_loads() -> None:
    # 16 tokens, top-2 of 8 experts, stride 4: every expert gets exactly 4 tokens
    loads = moe_rank_loads(16, 8, 2, 1, "balanced", rng=np.random.default_rng(0), draws=1)
    assert loads.tolist() == [[4.0] * 8]
    r = rank_load(16, 8, 2, 2, "balanced")  # EP 2: rank 0 holds experts 0-3
    assert (r.G, r.N, r.N_padded) == (4.0, 16.0, 512.0)


def test_power_law_routing_puts_busiest_group_on_rank_zero() -> None:
    rng = np.random.default_rng(3)
    loads = moe_rank_loads(512, 64, 8, 8, "power_law_1.2", rng=rng, draws=8)
    assert loads.shape == (8, 8)
    assert np.all(loads.sum(axis=1) >= 512 * 8 / 8)  # the busiest of 8 groups >= the mean
    assert np.all(loads.sum(axis=1) <= 512 * 8) and np.all(loads <= 512)


def test_profile_toml_round_trip_and_device_check(tmp_path) -> None:
    prof = derived_gemm_profile(Roofline(H100)).with_provenance(
        Provenance("h100-sxm", "gemm_bf16", source="x.csv", rows=10, train_mape=1.5)
    )
    f = tmp_path / "p.toml"
    f.write_text(profile_to_toml(prof))
    back = load_profile(f)
    assert back.features == prof.features and back.piece_names == prof.piece_names
    np.testing.assert_array_equal(back.slopes, prof.slopes)
    assert back.provenance == prof.provenance
    assert load_profile(f, device="h100-sxm").pieces == 2
    with pytest.raises(SpecError, match="measured on 'h100-sxm', not 'a100-sxm-80gb'"):
        load_profile(f, device="a100-sxm-80gb")
    with pytest.raises(SpecError, match="missing field 'slopes'"):
        profile_from_dict({"features": ["x"], "intercepts_s": [0.0], "provenance": {}}, where="t")
    with pytest.raises(SpecError, match="no calibrated profile"):
        load_profile("h100-sxm:nonexistent_op")


def test_shipped_profiles_load_for_their_device() -> None:
    from hardware.profile_io import catalog_profiles

    names = catalog_profiles()
    assert names, "calibrated profiles are shipped in hardware/profiles"
    for name in names:
        dev = name.split(":")[0]
        prof = load_profile(name, device=dev)
        assert prof.provenance.heldout_mape is not None and prof.provenance.rows > 0
        assert np.all(prof.slopes >= 0) and np.all(prof.intercepts_s >= 0)


def test_shipped_expert_block_profiles_give_the_measured_crossover() -> None:
    """Expert blocks fitted to measured GEMMs (hardware/profiles) load by device:op; their
    n* sits near each device's bf16 ridge x 2 B / 2 (A100 153, H100 295 tokens/expert)."""
    a100 = load_profile("a100-sxm-80gb:moe_expert_4096x1536x3", device="a100-sxm-80gb")
    h100 = load_profile("h100-sxm:moe_expert_4096x1536x3", device="h100-sxm")
    assert a100.features == ("G", "N") and a100.provenance.source == "a100_sxm__gemm.csv"
    assert 140 < crossover_tokens(a100) < 180
    assert 260 < crossover_tokens(h100) < 330
