"""Engine models: loader, and each engine term derived by hand."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from hardware.device import load_device
from hardware.engine import Engine, device_family, load_engine
from perfmodel.errors import SpecError
from perfmodel.memory import activation_reserve_bytes, memory_fit, weight_bytes_per_device
from perfmodel.model import load_model
from perfmodel.plan import ParallelPlan
from perfmodel.serving.offline import offline_throughput
from perfmodel.step.batch import Batch
from perfmodel.step.time import HOST_OP, step_time


def test_loader_picks_the_file_by_version() -> None:
    assert load_engine("trtllm@0.5").id == "trtllm-0.5"
    assert load_engine("trtllm@0.6.1").id == "trtllm-0.5"
    assert load_engine("trtllm@0.13").id == "trtllm-0.13"
    assert load_engine("trtllm@0.14").id == "trtllm-0.13"
    assert load_engine("trtllm@0.17").id == "trtllm"
    assert load_engine("trtllm@1.0").id == "trtllm"
    assert load_engine("trtllm").id == "trtllm"  # the default file of the family
    assert load_engine(None).id == "vllm"  # the default engine
    assert load_engine("sglang").family == "sglang"
    with pytest.raises(SpecError, match="unknown engine"):
        load_engine("tgi")
    with pytest.raises(SpecError, match="covers version"):
        load_engine("trtllm@0.1")


def test_every_engine_file_states_sources() -> None:
    for name in ("trtllm", "trtllm@0.13", "trtllm@0.5", "vllm", "sglang"):
        e = load_engine(name)
        assert e.sources, name
        assert e.path.endswith(".toml")


def test_families() -> None:
    assert device_family("h100-sxm") == "hopper"
    assert device_family("a100-sxm-80gb") == "ampere"
    assert device_family("mi250") == "cdna2"
    assert device_family("my-own-chip") == "other"


def _sharing(s: float) -> Engine:
    return replace(load_engine("trtllm@0.5"), gqa_kv_sharing=s)


def test_decode_kv_reads_formula() -> None:
    # g = 8 query heads per KV head: 1 + (g − 1)(1 − s)
    assert _sharing(0.0).decode_kv_reads(64, 8) == 8.0
    assert _sharing(1.0).decode_kv_reads(64, 8) == 1.0
    assert _sharing(0.5).decode_kv_reads(64, 8) == 4.5
    assert _sharing(0.0).decode_kv_reads(32, 32) == 1.0  # MHA: nothing to share


def test_gqa_per_query_head_read_bytes_llama2_70b_tp4_bs64_ctx2048() -> None:
    """Hand-derived: Llama-2-70B (64 query heads, 8 KV heads, head_dim 128) on TP4 holds
    2 KV heads and 16 query heads per device (g = 8). A decode step of 64 requests at
    context 2,048 reads 64·2048 tokens · (2 KV heads · 2 (K,V) · 128) elements · 1 B (FP8)
    = 67,108,864 B per layer when a group shares its read; reading once per query head
    adds 7 × that = 469,762,048 B per layer, 80 layers."""
    m, d = load_model("llama-2-70b"), load_device("h100-sxm")
    plan = ParallelPlan(4, "fp8", "fp8", "fp8")
    b = Batch.decode(64, 2048)
    shared = step_time(m, d, b, plan=plan, engine=_sharing(1.0)).op("attention")
    per_head = step_time(m, d, b, plan=plan, engine=_sharing(0.0)).op("attention")
    assert per_head.count == 80
    assert float(per_head.bytes - shared.bytes) == pytest.approx(80 * 7 * 67_108_864, rel=1e-12)
    # and the engine-less model reads once per KV head, like s = 1
    none = step_time(m, d, b, plan=plan).op("attention")
    assert float(none.bytes) == pytest.approx(float(shared.bytes), rel=1e-12)


def test_host_overhead_is_fixed_plus_per_request() -> None:
    e = replace(
        load_engine("vllm"),
        iteration_overhead_by_family={"hopper": 1.5e-3},
        per_request_overhead_s=20e-6,
    )
    zero = replace(
        e, iteration_overhead_by_family={}, iteration_overhead_s=0.0, per_request_overhead_s=0.0
    )
    m, d = load_model("llama-3.1-8b"), load_device("h100-sxm")
    b = Batch.decode(np.array([1.0, 100.0]), 1000) + Batch.prefill(np.array([0.0, 2.0]), 512)
    t = step_time(m, d, b, engine=e)
    t0 = step_time(m, d, b, engine=zero)
    # 1.5 ms + 20 µs · (1 | 100 decodes + 0 | 2 prompts)
    np.testing.assert_allclose(t.total_s - t0.total_s, [1.5e-3 + 20e-6, 1.5e-3 + 102 * 20e-6])
    assert t.op(HOST_OP).bound.tolist() == ["host", "host"]
    assert set(t.by_bound()) == {"compute", "memory", "comm", "host"}
    assert set(step_time(m, d, b).by_bound()) == {"compute", "memory", "comm"}


def test_kernel_efficiencies_replace_the_roofline_defaults() -> None:
    """A 2,048-token FP8 prefill on an H100 is compute-bound: GEMM time scales as
    1/eff_compute (0.80 default -> the engine's hopper/fp8 value)."""
    e = load_engine("trtllm")
    eff = e.kernel_efficiency("h100-sxm", "fp8").gemm_compute
    m, d = load_model("llama-3.1-8b"), load_device("h100-sxm")
    plan = ParallelPlan(1, "fp8", "fp8", "fp8")
    b = Batch.prefill(1, 2048)
    a = step_time(m, d, b, plan=plan).op("mlp_up")
    c = step_time(m, d, b, plan=plan, engine=e).op("mlp_up")
    assert float(c.compute_s) == pytest.approx(float(a.compute_s) * 0.80 / eff, rel=1e-12)


def test_free_memory_basis_kv_budget() -> None:
    """TensorRT-LLM: KV = 0.9 · (HBM − weights − activation reserve), whole 64-token blocks."""
    e = load_engine("trtllm")
    m, d = load_model("llama-3.1-8b"), load_device("h100-sxm")
    plan = ParallelPlan(1)
    fit = memory_fit(m, d, plan, engine=e)
    w = weight_bytes_per_device(m, plan)
    r = activation_reserve_bytes(m, plan, e.max_num_batched_tokens)
    kv_tok = 32 * 2 * 8 * 128 * 2  # layers · (K,V) · KV heads · head_dim · bf16 bytes
    expect = int(0.9 * (d.hbm_bytes - w - r) // kv_tok) // 64 * 64
    assert fit.kv_capacity_tokens == expect
    assert fit.kv_capacity_tokens % 64 == 0


def test_offline_batch_caps() -> None:
    m, d = load_model("llama-3.1-8b"), load_device("h100-sxm")
    plan = ParallelPlan(1)
    v = offline_throughput(m, d, plan, input_len=128, output_len=128, engine=load_engine("vllm"))
    assert v.binding == "max_num_seqs" and v.batch == 256
    t = replace(load_engine("trtllm"), offline_caps="fixed")
    r = offline_throughput(m, d, plan, input_len=1000, output_len=1000, engine=t)
    cap = memory_fit(m, d, plan, engine=t).kv_capacity_tokens
    assert r.binding == "kv_cache" and r.batch == cap // 2000  # whole request reserved
    # incremental reservation admits by mean occupancy s + o/2
    inc = replace(t, kv_reservation="incremental")
    r2 = offline_throughput(m, d, plan, input_len=1000, output_len=1000, engine=inc)
    assert r2.batch == cap // 1500
    assert r.output_tokens_per_s == pytest.approx(r.batch / r.iteration_s)


def test_collective_overhead_per_call() -> None:
    """Llama-2-70B on TP4 makes 2 all-reduces per layer (80 layers) and one logits
    all-gather per iteration: 161 collective calls, each charged the engine's fixed cost."""
    e = replace(load_engine("trtllm"), collective_overhead_s=10e-6)
    e0 = replace(e, collective_overhead_s=0.0)
    m, d = load_model("llama-2-70b"), load_device("h100-sxm")
    plan = ParallelPlan(4)
    b = Batch.decode(8, 1024)
    dt = (
        step_time(m, d, b, plan=plan, engine=e).total_s
        - step_time(m, d, b, plan=plan, engine=e0).total_s
    )
    assert float(dt) == pytest.approx(161 * 10e-6, rel=1e-9)
    # one device: no collectives, nothing charged
    one = ParallelPlan(1)
    m8 = load_model("llama-3.1-8b")
    assert float(step_time(m8, d, b, plan=one, engine=e).total_s) == pytest.approx(
        float(step_time(m8, d, b, plan=one, engine=e0).total_s), rel=1e-12
    )


def test_software_dequantized_kv_reads_slower() -> None:
    """FP8 KV on an A100 (no FP8 math): decode attention streams its bytes at
    ``kv_dequant_efficiency`` of the engine's memory efficiency; on an H100 it does not."""
    e = replace(load_engine("vllm"), kv_dequant_efficiency=0.25)
    m = load_model("llama-3.1-8b")
    b = Batch.decode(64, 2048)
    plan = ParallelPlan(1, "fp16", "fp16", "fp8")
    a100 = load_device("a100-sxm-80gb")
    slow = step_time(m, a100, b, plan=plan, engine=e).op("attention")
    fast = step_time(m, a100, b, plan=plan, engine=replace(e, kv_dequant_efficiency=1.0))
    assert float(slow.memory_s) == pytest.approx(4 * float(fast.op("attention").memory_s))
    h100 = load_device("h100-sxm")
    x = step_time(m, h100, b, plan=plan, engine=e).op("attention")
    y = step_time(m, h100, b, plan=plan, engine=replace(e, kv_dequant_efficiency=1.0))
    assert float(x.memory_s) == pytest.approx(float(y.op("attention").memory_s))


def test_accuracy_note_quotes_the_stored_validation() -> None:
    prov = {
        "leave_one_model_out": {"rows": 10, "median_abs_error_pct": 7.2, "p90_abs_error_pct": 20.4},
        "leave_one_device_out": {
            "rows": 10,
            "median_abs_error_pct": 11.0,
            "p90_abs_error_pct": 31.0,
        },
    }
    e = replace(load_engine("vllm"), provenance=prov, calibrated=("hopper/fp16",))
    assert "calibrated: expect ±7 % median, ±20 % p90" in e.accuracy_note("h100-sxm", "fp16")
    note = e.accuracy_note("mi300x", "fp16")
    assert "uncalibrated on cdna3/fp16" in note and "±11 %" in note
    assert "not calibrated" in replace(e, provenance={}).accuracy_note("h100-sxm", "fp16")


def test_the_default_engine_is_the_one_calibrated_on_the_family() -> None:
    from hardware.engine import _families_file, default_engine_id, engine_files
    from perfmodel.datafile import read_data_file

    calibrated: dict[str, set[str]] = {}
    for f in engine_files():
        d = read_data_file(f, what="engine")
        if d.get("default"):
            for pair in d.get("calibrated", []):
                calibrated.setdefault(pair.partition("/")[0], set()).add(d["family"])
    by_family = _families_file()["default_engine"]["family"]
    # every family some engine is calibrated on has a default, calibrated there
    assert set(by_family) == set(calibrated)
    assert all(by_family[fam] in engines for fam, engines in calibrated.items())
    assert default_engine_id(load_device("h100-sxm")) == "trtllm"
    assert default_engine_id(load_device("a100-sxm-80gb")) == "trtllm"
    assert default_engine_id(load_device("mi250")) == "vllm"
    assert default_engine_id(load_device("mi300x")) == "vllm"  # by vendor: uncalibrated
    assert default_engine_id(load_device("tpu-v5e")) == "none"


def test_engine_for_resolves_auto_none_and_names() -> None:
    from hardware.engine import engine_for

    h100 = load_device("h100-sxm")
    assert engine_for(None, h100) is None and engine_for("none", h100) is None
    assert engine_for("auto", h100) == load_engine("trtllm")
    assert engine_for("vllm@0.5", h100) == load_engine("vllm")
    assert engine_for("auto", load_device("tpu-v5e")) is None
    with pytest.raises(SpecError, match="unknown engine"):
        engine_for("carrier-pigeon", h100)


def test_offline_prompt_ingestion_binds() -> None:
    """Mixtral-8x7B on 8 H100s, 2048/128: the KV cache admits 2,048 requests, but a
    budget of B = 8,192 tokens per iteration feeds only d = B·o/(s + o) = 8192·128/2176
    = 481.9 decoding requests with the prompts of those that finish. Every iteration
    carries d decodes and B − d prompt tokens, so prompts enter at (B − d)/t̄ per second,
    which is exactly the output rate times s/o (flow balance)."""
    m, d = load_model("mixtral-8x7b"), load_device("h100-sxm")
    plan = ParallelPlan(8, "fp8", "fp8", "fp8")
    e = replace(load_engine("trtllm"), offline_caps="fixed")  # max_num_tokens 8192
    r = offline_throughput(m, d, plan, input_len=2048, output_len=128, engine=e)
    fed = 8192 * 128 / 2176
    assert r.binding == "max_num_batched_tokens" and r.batch == 481
    assert r.output_tokens_per_s * 2048 / 128 == pytest.approx((8192 - fed) / r.iteration_s)
    b = Batch.decode(fed, 2048 + 64) + Batch.prefill((8192 - fed) / 2048, 2048)
    t = float(step_time(m, d, b, plan=plan, engine=e).total_s)
    assert r.iteration_s == pytest.approx(t, rel=1e-12)
    # a short prompt keeps the KV-cache batch: 128/2048 needs only b·(s+o)/o ≤ B
    r2 = offline_throughput(m, d, plan, input_len=128, output_len=2048, engine=e)
    assert r2.binding != "max_num_batched_tokens" and r2.batch * 2176 / 2048 <= 8192


def test_quantized_rows_keep_a_16_bit_embedding_and_head() -> None:
    """An FP8 row of Llama-3.1-70B on one H100: the decoder's linear layers in FP8, the
    embedding and LM head (2 · 128256 · 8192 = 2,101,346,304 weights) and the norms
    (2 per layer + the final one: 161 · 8192 = 1,318,912) in 16 bits, so the device holds
    2,102,665,216 bytes more than with every weight in FP8."""
    from perfmodel.validate.data import Measurement
    from perfmodel.validate.predict import plan_for

    row = Measurement(
        "h100-sxm", "llama-3.1-70b", "trtllm", "fp8", "fp8", 1, 1, 128, 128, None,
        "output_tps_total", 1.0, None, None, {},
    )  # fmt: skip
    d, m = load_device("h100-sxm"), load_model("llama-3.1-70b")
    plan = plan_for(row, d)
    assert plan.weight_bytes_of("embedding") == 2 and plan.weight_bytes_of("dense_mlp") == 1
    assert plan.act_dtype == "fp8" and plan.kv_dtype == "fp8"
    extra = weight_bytes_per_device(m, plan) - weight_bytes_per_device(
        m, ParallelPlan(1, "fp8", "fp8", "fp8")
    )
    assert extra == pytest.approx(2 * 128256 * 8192 + 161 * 8192, rel=1e-12)
    # a 16-bit row is unchanged: uniform formats
    assert plan_for(replace(row, precision="fp16", kv_precision="fp16"), d).modules is None


def test_trtllm_bench_caps_per_isl_osl() -> None:
    """trtllm-bench's build heuristic, by hand (H100: 85.899e9 B):

    * Mixtral-8x7B FP8, TP8, 2048/128: KV 32 layers · 2 · 8 heads · 128 · 1 B = 65,536 B
      per token; n = 0.95 · (8 · 85.899e9 − 46.70e9 · 1) / (65,536 · 2,176) = 4,267 →
      bs = min(n, 4096) = 4,096 → 256·⌈4096/256⌉ = 4,096; tokens = min(4096 · 17, 32768)
      = 32,768. The run then keeps d = 32768 · 128/2176 = 1,927 requests decoding.
    * Llama-3.1-70B FP8, TP8, 128/4096: 163,840 B per token; n = 0.95 · (687.19e9 −
      70.55e9) / (163,840 · 4,224) = 846.5 → 128·⌈846.5/128⌉ = 896; tokens = 846.5 ·
      (1 + 128/4096) = 873 → at least 2,048."""
    from perfmodel.serving.offline import trtllm_bench_caps

    d = load_device("h100-sxm")
    plan = ParallelPlan(8, "fp8", "fp8", "fp8")
    mix = load_model("mixtral-8x7b")
    assert trtllm_bench_caps(mix, d, plan, 2048, 128) == (4096, 32768)
    assert trtllm_bench_caps(load_model("llama-3.1-70b"), d, plan, 128, 4096) == (896, 2048)
    e = load_engine("trtllm")
    assert e.offline_caps == "trtllm-bench"
    r = offline_throughput(mix, d, plan, input_len=2048, output_len=128, engine=e)
    assert r.batch == int(32768 * 128 / 2176) == 1927


def test_moe_efficiency_scales_only_the_routed_experts() -> None:
    """``moe_efficiency = 0.5`` halves both efficiencies of the grouped expert GEMM: its
    compute and memory times double; the dense attention projections do not change."""
    m, d = load_model("mixtral-8x7b"), load_device("h100-sxm")
    plan = ParallelPlan(2, "fp8", "fp8", "fp8")
    e = replace(load_engine("trtllm"), moe_efficiency=1.0)
    half = replace(e, moe_efficiency=0.5)
    for b in (Batch.decode(64, 1024), Batch.prefill(2, 2048)):
        a, h = step_time(m, d, b, plan=plan, engine=e), step_time(m, d, b, plan=plan, engine=half)
        for f in ("compute_s", "memory_s"):
            x, y = getattr(a.op("moe_experts"), f), getattr(h.op("moe_experts"), f)
            assert float(y) == pytest.approx(2 * float(x), rel=1e-12)
        assert float(h.op("qkv_proj").total_s) == float(a.op("qkv_proj").total_s)
    with pytest.raises(SpecError):
        replace(e, moe_efficiency=0.0)


def test_chunked_attention_layers_use_the_attention_profile() -> None:
    """Llama-4-Scout's chunked-attention layers (``attention_chunked``) are attention
    kernels: halving the engine's attention compute efficiency doubles their compute
    time, as it does for the full-attention layers; the GEMMs do not change."""
    m, d = load_model("llama-4-scout"), load_device("h100-sxm")
    plan = ParallelPlan(4, "fp8", "fp8", "fp8")
    e = load_engine("trtllm")
    key = ("hopper", "fp8")
    eff = e.efficiency[key]
    slow = replace(
        e,
        efficiency={**e.efficiency, key: replace(eff, attention_compute=eff.attention_compute / 2)},
    )
    b = Batch.prefill(1, 8192)
    a, h = step_time(m, d, b, plan=plan, engine=e), step_time(m, d, b, plan=plan, engine=slow)
    for name in ("attention", "attention_chunked"):
        x, y = float(a.op(name).compute_s), float(h.op(name).compute_s)
        assert y == pytest.approx(2 * x, rel=1e-12)
    assert float(h.op("o_proj_chunked").total_s) == float(a.op("o_proj_chunked").total_s)


def test_calibration_frees_an_efficiency_pair_only_with_enough_rows() -> None:
    """Nine BF16 rows on an H100 leave its 16-bit class (hopper/fp16: bf16 and fp16 share
    one) at the file's values; ten free both of its efficiencies (``MIN_PAIR_ROWS``); a
    MoE row frees ``moe_efficiency``."""
    from perfmodel.validate.calibrate import MIN_PAIR_ROWS, free_params
    from perfmodel.validate.data import Measurement

    def row(model: str, prec: str) -> Measurement:
        return Measurement(
            "h100-sxm", model, "trtllm", prec, prec, 1, 1, 128, 128, None,
            "output_tps_total", 1.0, None, None, {},
        )  # fmt: skip

    e = load_engine("trtllm")
    fp8 = [row("llama-3.1-8b", "fp8")] * 20
    names = {p.name for p in free_params(e, fp8 + [row("llama-3.1-8b", "bf16")] * 9)}
    assert MIN_PAIR_ROWS == 10 and "gemm_compute@hopper/fp8" in names
    assert not any("hopper/fp16" in n for n in names) and "moe_efficiency" not in names
    names = {p.name for p in free_params(e, fp8 + [row("mixtral-8x7b", "bf16")] * 10)}
    assert {"gemm_compute@hopper/fp16", "memory@hopper/fp16", "moe_efficiency"} <= names
