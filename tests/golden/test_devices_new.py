"""New catalog devices (datasheet figures, dense, per direction) and what their formats allow."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cli.main import app
from hardware.device import catalog_ids, load_device
from perfmodel.errors import SpecError
from perfmodel.model import load_model
from perfmodel.plan import ParallelPlan, resolve_precision
from perfmodel.step.batch import Batch
from perfmodel.step.time import step_time
from tests.golden.test_model_configs import DATA

NEW = (
    "gh200",
    "gb200",
    "b300",
    "gb300",
    "rtx-pro-6000-server",
    "gaudi2",
    "gaudi3",
    "mi325x",
    "mi355x",
    "ascend-910c",
)


def test_new_devices_are_listed_with_sources() -> None:
    assert set(NEW) <= set(catalog_ids())
    r = CliRunner().invoke(app, ["hardware", "list"])
    assert r.exit_code == 0
    for d in NEW:
        assert d in r.output
        assert len(load_device(d).sources) >= 2, d


@pytest.mark.parametrize(
    ("dev", "key", "dense"),
    [
        ("gb200", "bf16", 2.5e15),  # 5 PF sparse at 1200 W
        ("gb200", "fp4", 10e15),
        ("gb300", "fp4", 15e15),  # 1,080 PF dense NVFP4 per NVL72 / 72
        ("b300", "fp8", 4.5e15),
        ("gaudi3", "fp8", 1835e12),  # FP8 does not double on Gaudi 3
        ("gaudi2", "bf16", 432e12),
        ("mi355x", "fp4", 10066.3e12),  # 20.1 PF headline is sparse
        ("mi325x", "bf16", 1307.4e12),  # MI300X compute die
        ("ascend-910c", "bf16", 376e12),  # one die: 752 TF per package / 2
        ("rtx-pro-6000-server", "fp4", 2000e12),  # 4,000 AI TOPS headline is sparse
        ("gh200", "fp8", 1978.9e12),  # H100 rates
    ],
)
def test_dense_peaks(dev: str, key: str, dense: float) -> None:
    assert load_device(dev).peak_flops_per_s[key] == dense


def test_links_are_per_direction_and_memory_units() -> None:
    gb = load_device("gb200")
    assert gb.scale_up.bw_per_direction_bytes_per_s == 900e9  # 1.8 TB/s bidirectional
    assert gb.scale_up.peers == 71  # NVL72
    assert load_device("gaudi3").scale_up.peer_bw_per_direction_bytes_per_s == 75e9  # 3x200GbE
    assert load_device("gh200").host_link.bw_per_direction_bytes_per_s == 450e9  # C2C 900 bidir
    assert load_device("gaudi3").hbm_bytes == 128 * 2**30  # 128 GiB physical
    assert load_device("b300").hbm_bytes == 288e9  # 288 GB decimal (stated in the file)
    c = load_device("ascend-910c")
    assert c.dies_per_package == 2 and c.hbm_bytes == 64 * 2**30


def test_native_dtypes_drive_the_plan() -> None:
    ds = load_model(str(DATA / "qwen3-next-80b-a3b.json"))
    assert (
        resolve_precision(ds, load_device("gb200"), dtype="nvfp4", act_dtype="fp4").act_dtype
        == "fp4"
    )
    with pytest.raises(SpecError, match="h100-sxm has no fp4 math"):
        resolve_precision(ds, load_device("h100-sxm"), act_dtype="fp4")
    # FP8 weights on the 910C (no FP8 unit) compute in bf16 and are dequantized
    p = resolve_precision(ds, load_device("ascend-910c"), dtype="fp8", act_dtype=None)
    assert p.act_dtype == "bf16" and any("dequantized" in n for n in p.notes)
    # an FPGA with only int8 computes in int8
    assert resolve_precision(ds, load_device("alveo-u280"), dtype="int8").act_dtype == "int8"


def test_fpga_has_no_gemm_row_padding() -> None:
    m = load_model(str(DATA / "qwen2.5-1.5b.json"))
    plan = ParallelPlan(1, "int8", "int8", "int8")
    b = Batch.decode(1, 1024)
    fpga = step_time(m, load_device("alveo-u280"), b, plan=plan)
    gpu = step_time(m, load_device("h100-sxm"), b, plan=ParallelPlan(1, "int8", "int8", "int8"))
    # one token through o_proj (hidden x hidden): 2·1536·1536 executed on the FPGA,
    # 16 padded rows on the GPU
    assert float(fpga.op("o_proj").flops) == 28 * 2 * 1536 * 1536
    assert float(gpu.op("o_proj").flops) == 16 * 28 * 2 * 1536 * 1536
    assert float(fpga.by_bound()["compute"]) == 0.0  # batch-1 decode is memory-bound


@pytest.mark.slow
@pytest.mark.parametrize("dev", NEW)
def test_capacity_runs_on_every_new_device(dev: str) -> None:
    r = CliRunner().invoke(
        app, ["capacity", "--model", str(DATA / "qwen2.5-1.5b.json"), "--hardware", dev, "--json"]
    )
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["service_rate_per_s"] > 0


def test_capacity_on_an_alveo_in_int8() -> None:
    r = CliRunner().invoke(
        app,
        [
            "capacity",
            "--model",
            str(DATA / "qwen2.5-1.5b.json"),
            "--hardware",
            "alveo-u280",
            "--dtype",
            "int8",
            "--kv-dtype",
            "int8",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["dtypes"] == {"weights": "int8", "act": "int8", "kv": "int8"}
    r = CliRunner().invoke(
        app,
        [
            "capacity",
            "--model",
            str(DATA / "qwen2.5-1.5b.json"),
            "--hardware",
            "alveo-u280",
            "--act-dtype",
            "bf16",
        ],
    )
    assert r.exit_code == 2 and "alveo-u280 has no bf16 math" in r.output


def test_fpga_estimate_states_the_tp_link() -> None:
    r = CliRunner().invoke(
        app,
        [
            "estimate",
            "--model",
            str(DATA / "qwen2.5-1.5b.json"),
            "--hardware",
            "alveo-u280",
            "--tp",
            "2",
            "--batch",
            "1",
            "--output-len",
            "4",
            "--dtype",
            "int8",
            "--kv-dtype",
            "int8",
        ],
    )
    assert r.exit_code == 0, r.output
    assert "math int8" in r.output
    assert "TP all-reduce over 2 x 100 GbE QSFP28 (25 GB/s per direction)" in r.output
