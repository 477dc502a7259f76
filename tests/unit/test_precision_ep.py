"""Per-module precision, checkpoint quantization defaults, dequantization, EP and DP."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from cli.main import app
from hardware.comm import collective_time_s, link_for_group
from hardware.device import load_device
from perfmodel.dtypes import ModuleDTypes
from perfmodel.errors import SpecError
from perfmodel.memory import memory_fit, weight_bytes_per_device
from perfmodel.model import model_from_config
from perfmodel.plan import ParallelPlan, resolve_precision
from perfmodel.step.batch import Batch
from perfmodel.step.ops import layer_ops
from perfmodel.step.time import step_time
from tests.conftest import shared_file
from tests.golden.test_model_configs import KIMI_INT4


def _cfg(name: str) -> dict[str, object]:
    return json.loads(shared_file("hf-configs", name).read_text())


def _v3():
    return model_from_config(_cfg("deepseek-ai--DeepSeek-V3.json"), id="ds")


def test_fp8_checkpoint_defaults_to_fp8_where_the_device_has_it() -> None:
    p = resolve_precision(_v3(), load_device("h200-sxm"))
    assert p.weights.routed_experts == p.weights.attention == "fp8" and p.act_dtype == "fp8"
    assert any("quantization_config (fp8)" in n for n in p.notes)
    a100 = resolve_precision(_v3(), load_device("a100-sxm-80gb"))
    assert a100.act_dtype == "bf16" and a100.weights.routed_experts == "fp8"
    assert any("dequantized" in n for n in a100.notes)
    forced = resolve_precision(_v3(), load_device("h200-sxm"), dtype="bf16")
    assert forced.weights.is_uniform and forced.weights.attention == "bf16" and not forced.notes
    with pytest.raises(SpecError, match="a100-sxm-80gb has no fp8 math"):
        resolve_precision(_v3(), load_device("a100-sxm-80gb"), act_dtype="fp8")


def test_int4_experts_keep_attention_bf16_in_memory() -> None:
    m = model_from_config(
        {**_cfg("moonshotai--Kimi-K2-Instruct.json"), "quantization_config": KIMI_INT4}, id="k"
    )
    p = resolve_precision(m, load_device("h200-sxm"))
    assert (p.weights.attention, p.weights.routed_experts, p.act_dtype) == ("bf16", "int4", "bf16")
    plan = ParallelPlan(8, p.weight_dtype, p.act_dtype, p.kv_dtype, modules=p.weights)
    g = m.param_groups()
    by_hand = (g["routed_experts"] * 0.5 + (m.params - g["routed_experts"]) * 2.0) / 8
    assert weight_bytes_per_device(m, plan) == pytest.approx(by_hand, rel=1e-12)
    # an int4 checkpoint of a 1T model fits one 8xH200 node (~66 GiB/device of 141)
    assert memory_fit(m, load_device("h200-sxm"), plan, batch=8, context_len=8192).fits


def test_dequant_only_when_weights_are_not_the_math_format() -> None:
    m = _v3()
    fp8 = ParallelPlan(8, "fp8", "fp8", "bf16")
    w8a16 = ParallelPlan(8, "fp8", "bf16", "bf16")
    b = Batch.decode(16, 2048)
    assert "weight_dequant" not in {o.name for o in layer_ops(m, fp8, b)}
    dq = next(o for o in layer_ops(m, w8a16, b) if o.name == "weight_dequant")
    # one conversion per weight element streamed (16 rows: one 128-row tile)
    streamed = sum(
        o.count * float(np.asarray(o.weight_elems))
        for o in layer_ops(m, w8a16, b)
        if o.weight_elems is not None and o.name not in ("router", "lm_head")
    )
    assert float(dq.flops) == pytest.approx(streamed, rel=1e-12)
    t = step_time(m, load_device("a100-sxm-80gb"), b, plan=w8a16)
    assert float(t.op("weight_dequant").compute_s) > 0


def test_module_dtypes_bytes() -> None:
    w = ModuleDTypes("bf16", "bf16", "bf16", "nvfp4", embedding="bf16")
    assert w.bytes_of("routed_experts") == 0.5625 and w.bytes_of("embedding") == 2.0
    assert not w.is_uniform


def test_wide_ep_qwen3_30b_tp1_dp4_ep4_on_h200() -> None:
    m = model_from_config(_cfg("Qwen--Qwen3-30B-A3B.json"), id="q30")
    d = load_device("h200-sxm")
    plan = ParallelPlan(1, pp=1, ep=4, dp=4)
    assert plan.devices == 4 and plan.expert_tp == 1
    b = Batch.decode(64, 2048)
    ops = {o.name: o for o in layer_ops(m, plan, b)}
    # each device dispatches its 64/4 tokens x top-8 x 2048 hidden x 2 B, per MoE layer
    assert float(ops["ep_dispatch"].bytes) == 16 * 8 * 2048 * 2
    assert ops["ep_dispatch"].count == 48 and ops["ep_dispatch"].collective == "all_to_all"
    t = step_time(m, d, b, plan=plan)
    want = collective_time_s(
        "all_to_all", np.array(16 * 8 * 2048 * 2.0), group=4, link=link_for_group(d, 4)
    )
    assert float(t.op("ep_dispatch").comm_s) == pytest.approx(48 * float(want))
    # attention runs on 16 of the 64 requests per device; experts see all 64 tokens' rows
    assert float(ops["qkv_proj"].unpadded_flops) == pytest.approx(  # type: ignore[arg-type]
        2 * 16 * (32 * 128 + 2 * 4 * 128) * 2048
    )
    g = m.param_groups()
    w = weight_bytes_per_device(m, plan)
    assert w == pytest.approx((m.params - g["routed_experts"]) * 2 + g["routed_experts"] * 2 / 4)
    fit = memory_fit(m, d, plan, batch=64, context_len=4096)
    one = memory_fit(m, d, ParallelPlan(1), batch=16, context_len=4096)
    assert fit.kv_capacity_tokens > 4 * one.kv_capacity_tokens  # dp replicas, lighter weights


def test_ep_must_divide_the_stage() -> None:
    with pytest.raises(SpecError, match="ep=3 must divide tp·dp = 4"):
        ParallelPlan(1, ep=3, dp=4)


def test_estimate_cli_says_fp8_and_shows_alltoall() -> None:
    r = CliRunner().invoke(
        app,
        [
            "estimate",
            "--model",
            str(shared_file("hf-configs", "deepseek-ai--DeepSeek-V3.json")),
            "--hardware",
            "h200-sxm",
            "--tp",
            "8",
            "--batch",
            "4",
            "--output-len",
            "4",
        ],
    )
    assert r.exit_code == 0, r.output
    assert "weights fp8, math fp8" in r.output and "quantization_config (fp8)" in r.output
    r = CliRunner().invoke(
        app,
        [
            "estimate",
            "--model",
            str(shared_file("hf-configs", "Qwen--Qwen3-30B-A3B.json")),
            "--hardware",
            "h200-sxm",
            "--tp",
            "1",
            "--dp",
            "4",
            "--ep",
            "4",
            "--batch",
            "64",
            "--output-len",
            "4",
        ],
    )
    assert r.exit_code == 0, r.output
    assert "4x h200-sxm (TP1 x DP4, EP4)" in r.output and "ep_dispatch" in r.output
    r = CliRunner().invoke(app, ["estimate", "--tp", "1", "--dp", "4", "--ep", "3"])
    assert r.exit_code == 2 and "ep=3 must divide" in r.output


def test_capacity_cli_accepts_ep_and_dp() -> None:
    r = CliRunner().invoke(
        app,
        [
            "capacity",
            "--model",
            "qwen3-30b-a3b",
            "--hardware",
            "h200-sxm",
            "--tp",
            "1",
            "--dp",
            "4",
            "--ep",
            "4",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert (out["tp"], out["ep"], out["dp"]) == (1, 4, 4)
    r1 = CliRunner().invoke(
        app, ["capacity", "--model", "qwen3-30b-a3b", "--hardware", "h200-sxm", "--json"]
    )
    one = json.loads(r1.stdout)
    # four attention replicas hold more KV than one device with all the experts
    assert out["kv_capacity_tokens"] > 4 * one["kv_capacity_tokens"]


@pytest.mark.slow
def test_pd_plan_with_wide_ep() -> None:
    r = CliRunner().invoke(
        app,
        [
            "pd",
            "plan",
            "--model",
            "qwen3-30b-a3b",
            "--hardware",
            "h200-sxm",
            "--ep",
            "4",
            "--dp",
            "4",
            "--rate-per-s",
            "20",
            "--workload",
            "chat",
        ],
    )
    assert r.exit_code == 0, r.output
    assert "h200-sxm TP1 DP4 EP4" in r.output


def test_explicit_float_dtype_sets_the_math_where_native() -> None:
    m = model_from_config(_cfg("Qwen--Qwen3-30B-A3B.json"), id="q")
    h = resolve_precision(m, load_device("h100-sxm"), dtype="fp8")
    assert h.act_dtype == "fp8"  # W8A8 on Hopper
    a = resolve_precision(m, load_device("a100-sxm-80gb"), dtype="fp8")
    assert a.act_dtype == "bf16" and any("dequantized" in n for n in a.notes)  # W8A16
    i4 = resolve_precision(m, load_device("h100-sxm"), dtype="int4")
    assert i4.act_dtype == "bf16"  # integer weights are weight-only (AWQ/GPTQ)
