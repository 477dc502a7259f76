"""The serving engine reaches the PD planner's phase times and memory fits (issue 12 item 2)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hardware.device import load_device
from hardware.engine import Engine, KernelEfficiency, engine_for, load_engine
from hardware.roofline import DEFAULT_EFF_COMPUTE, DEFAULT_EFF_MEMORY
from perfmodel.memory import memory_fit
from perfmodel.model import load_model
from perfmodel.pd.decode import decode_kv_capacity
from perfmodel.units import from_ms
from perfmodel.workload.lengths import fixed_lengths
from perfmodel.workload.slo import SLO
from solvers.pd.enumerate import evaluate_options, parallel_plan

HOST_S = 2e-3


def _host_only_engine() -> Engine:
    """An engine equal to the engine-less roofline except a fixed 2 ms per iteration."""
    roof = KernelEfficiency(DEFAULT_EFF_COMPUTE, DEFAULT_EFF_MEMORY, DEFAULT_EFF_COMPUTE)
    return replace(
        load_engine("trtllm"),
        efficiency={},
        default_efficiency=roof,
        gqa_kv_sharing=1.0,
        collective_overhead_s=0.0,
        per_request_overhead_s=0.0,
        iteration_overhead_s=HOST_S,
        iteration_overhead_by_family={},
    )


def _options(engine: object):  # type: ignore[no-untyped-def]
    dev = load_device("h100-sxm")
    return evaluate_options(
        load_model("llama-3.1-8b"),
        fixed_lengths(512, 128),
        SLO(from_ms(500), from_ms(50), percentile=0.9),
        prefill_devices=[dev],
        decode_devices=[dev],
        tp_candidates=(1,),
        engine=engine,  # type: ignore[arg-type]
    )


def test_host_overhead_shifts_the_unloaded_prefill_and_decode_floors_by_itself() -> None:
    # a 512-token prompt is one iteration (budget 8192): its unloaded TTFT is one prefill
    # iteration plus the KV transfer, so the engine's fixed host time adds exactly 2 ms;
    # the unloaded TPOT is the mean of one-request decode steps: also +2 ms
    none, eng = _options(None), _options(_host_only_engine())
    [p0], [p1] = none.prefill[("h100-sxm", 1)], eng.prefill[("h100-sxm", 1)]
    assert p1.floor_s - p0.floor_s == pytest.approx(HOST_S, rel=1e-6)
    [d0], [d1] = none.decode[("h100-sxm", 1)], eng.decode[("h100-sxm", 1)]
    assert d1.floor_s - d0.floor_s == pytest.approx(HOST_S, rel=1e-6)
    assert p1.config.engine is not None and p0.config.engine is None


def test_the_decode_kv_capacity_is_the_engines_memory_fit() -> None:
    # TensorRT-LLM: 0.9 of the memory free after weights and activations, 64-token blocks
    m, dev = load_model("llama-3.1-8b"), load_device("a100-sxm-80gb")
    trt = load_engine("trtllm")
    opts = evaluate_options(
        m,
        fixed_lengths(512, 128),
        SLO(from_ms(500), from_ms(50), percentile=0.9),
        prefill_devices=[dev],
        decode_devices=[dev],
        tp_candidates=(1,),
        engine="auto",
    )
    [d] = opts.decode[("a100-sxm-80gb", 1)]
    assert d.config.engine == trt  # auto: TensorRT-LLM on an A100 (calibrated on ampere)
    fit = memory_fit(m, dev, parallel_plan(1, "bf16", "bf16"), engine=trt)
    assert d.kv_capacity_tokens == fit.kv_capacity_tokens
    assert d.kv_capacity_tokens % trt.kv_block_tokens == 0
    assert decode_kv_capacity(m, d.config, fixed_lengths(512, 128)) == fit.kv_capacity_tokens


def test_calibrated_engine_lowers_pd_goodput_on_a100() -> None:
    # TensorRT-LLM on ampere: 0.83 ms host time per iteration and bf16 GEMMs at 64 % of
    # peak (below the roofline's 80 %): both phases serve less than the engine-less model
    dev = load_device("a100-sxm-80gb")
    kw = dict(prefill_devices=[dev], decode_devices=[dev], tp_candidates=(1,))
    args = (
        load_model("llama-3.1-8b"),
        fixed_lengths(2048, 256),
        SLO(from_ms(500), from_ms(50), percentile=0.9),
    )
    none = evaluate_options(*args, **kw)  # type: ignore[arg-type]
    trt = evaluate_options(*args, **kw, engine=engine_for("auto", dev))  # type: ignore[arg-type]
    key = ("a100-sxm-80gb", 1)
    assert trt.prefill[key][0].rate_per_s < none.prefill[key][0].rate_per_s
    assert trt.decode[key][0].floor_s > none.decode[key][0].floor_s
