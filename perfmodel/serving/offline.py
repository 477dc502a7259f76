"""Offline saturation throughput: every request queued at once, fixed lengths.

This is what ``trtllm-bench throughput`` and vLLM's offline benchmark measure. The
engine keeps ``b`` requests in flight, the largest batch its caps allow::

    b = min(max_num_seqs, max_num_batched_tokens, ⌊M / kv_per_request⌋)   (per virtual engine)

with ``M`` the KV capacity of one virtual engine (``memory_fit`` with the engine) and
``kv_per_request = s + o`` when the scheduler reserves a request's whole KV at admission
(TensorRT-LLM's guaranteed-no-evict), ``s + o/2`` — the mean occupancy — when blocks are
allocated as the request grows (vLLM, preempting when the cache runs out).

In steady state every iteration decodes ``b`` requests at the mean context ``s + o/2``
and ``b/o`` requests finish and are replaced, so ``p = b·s/o`` prompt tokens enter per
iteration on average. Where prompts share iterations with decodes (in-flight batching,
chunked prefill), a fraction ``φ = p/(B − b)`` of iterations carries a full budget of
``B − b`` prompt tokens::

    t̄ = (1 − φ)·t(b decodes) + φ·t(b decodes + (B − b) prompt tokens)

That needs ``φ ≤ 1``, i.e. ``b·(s + o)/o ≤ B``: the token budget must ingest the prompts
of the requests that finish. Beyond it (long prompts, short outputs, a large KV cache)
prompt ingestion binds: only ``d = B·o/(s + o)`` requests can be kept decoding, every
iteration carries ``d`` decodes and ``B − d`` prompt tokens (``φ = 1``), and the batch
is ``d`` (binding ``max_num_batched_tokens``). Costing ``b`` decodes with only ``B − b``
prompt tokens instead would let ``p − (B − b)`` prompt tokens per iteration go free.

Otherwise (prefill-first scheduling, vLLM V0) prompts run in their own iterations of
``k = max(1, ⌊B/s⌋)`` whole prompts: ``t̄ = t(b decodes) + (b/o)/k · t(k prompts)``.
Averaging iteration times (not the time of the average batch) keeps the jump from a
memory-bound decode step to a compute-bound mixed step. Output tokens per second are
``pp·b/t̄`` (``pp`` virtual engines, each with its own batch).

The caps are the engine's defaults unless it sizes them per run (``offline_caps =
"trtllm-bench"``: :func:`trtllm_bench_caps`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hardware.device import Device
from hardware.engine import Engine
from perfmodel.dtypes import get_dtype
from perfmodel.errors import InfeasibleError, SpecError
from perfmodel.memory import (
    DEFAULT_MAX_BATCHED_TOKENS,
    describe_shortfall,
    layer_kv_elems_per_device,
)
from perfmodel.model import ModelSpec
from perfmodel.plan import ParallelPlan
from perfmodel.step.batch import Batch
from perfmodel.step.instance import Instance


@dataclass(frozen=True)
class OfflineThroughput:
    """Saturation throughput of one instance and the batch that sets it."""

    output_tokens_per_s: float
    total_tokens_per_s: float  # (input + output) tokens/s
    requests_per_s: float
    batch: int  # requests in flight per virtual engine
    binding: str  # "kv_cache" | "max_num_seqs" | "max_num_batched_tokens"
    kv_capacity_tokens: int
    iteration_s: float  # mean iteration time t̄
    decode_step_s: float
    prefill_share: float  # fraction of t̄ due to prompt tokens
    engine: str  # engine id, "" for the engine-less model

    def to_dict(self) -> dict[str, object]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class OfflineReport:
    """``perfmodel estimate --offline``'s answer: the instance and its saturation throughput."""

    instance: Instance
    offline: OfflineThroughput

    def to_dict(self) -> dict[str, object]:
        inst = self.instance
        return {
            **inst.ids(),
            "engine": inst.engine.id if inst.engine else None,
            "engine_accuracy": inst.engine_accuracy,
            "offline": self.offline.to_dict(),
        }


#: trtllm-bench's bounds: at most 4,096 requests (decoder buffers) and 32,768 tokens
#: (activation buffer) per engine, a 0.95 KV fraction of the memory left by the weights
BENCH_MAX_REQUESTS = 4096
BENCH_MAX_TOKENS = 32768
BENCH_KV_FRACTION = 0.95
#: trtllm-bench's rounding: (below this, round up to this step), and the least value
BENCH_BATCH_ROUNDING = (((256, 32), (1024, 128), (math.inf, 256)), 64)
BENCH_TOKEN_ROUNDING = (((4096, 256), (8192, 512), (math.inf, 1024)), 2048)


def _round_up(x: float, rounding: tuple[tuple[tuple[float, int], ...], int]) -> int:
    """``x`` rounded up to the step of the first tier it is below, at least the least value."""
    tiers, least = rounding
    step = next(step for below, step in tiers if x < below)
    return max(least, step * math.ceil(x / step))


def trtllm_bench_caps(
    model: ModelSpec, device: Device, plan: ParallelPlan, input_len: int, output_len: int
) -> tuple[int, int]:
    """``(max_batch_size, max_num_tokens)`` that ``trtllm-bench build`` picks for a run.

    TensorRT-LLM's benchmark (``tensorrt_llm/bench/build/tuning.py``) estimates the
    requests its KV cache holds from the whole group's memory: ``n = 0.95·(tp·pp·HBM −
    params·w) / (kv_token·(s + o))`` with ``w`` bytes per weight (1 for FP8, 2 for 16-bit)
    and ``kv_token`` the KV bytes of one token over all layers (KV heads counted at least
    once per TP rank). Then ``bs = min(n, 4096)/pp`` and ``tokens = min(bs·(1 + s/o),
    32768)`` — the budget that keeps ``bs`` decodes fed with prompts — each rounded up:
    the batch to 32 (at least 64) below 256, to 128 below 1,024, else to 256; the tokens
    to 256 (at least 2,048) below 4,096, to 512 below 8,192, else to 1,024. The run itself
    is still bounded by the KV cache it really gets (:func:`offline_throughput`).
    """
    s, o = input_len, output_len
    w = min(get_dtype(plan.weight_dtype).bytes, 2.0)
    kv_b = min(plan.kv_bytes, 2.0)
    kv_token = sum(
        layer_kv_elems_per_device(model, ls, plan.tp) * plan.tp for ls in model.layer_plan
    )
    free = plan.tp * plan.pp * device.hbm_bytes - model.params * w
    n = BENCH_KV_FRACTION * free / (kv_token * kv_b * (s + o)) if kv_token > 0 else math.inf
    bs = min(n, BENCH_MAX_REQUESTS) / plan.pp
    tokens = min(bs * (1 + s / o), BENCH_MAX_TOKENS)
    return _round_up(bs, BENCH_BATCH_ROUNDING), _round_up(tokens, BENCH_TOKEN_ROUNDING)


def offline_throughput(
    model: ModelSpec,
    device: Device,
    plan: ParallelPlan,
    *,
    input_len: int,
    output_len: int,
    engine: Engine | None = None,
) -> OfflineThroughput:
    """Throughput with every request queued (see the module docstring).

    ``engine=None``: no batch cap, a budget of ``DEFAULT_MAX_BATCHED_TOKENS``, mixed
    iterations and whole-request KV reservation.
    """
    for name, v in (("input length", input_len), ("output length", output_len)):
        if not (isinstance(v, int | np.integer) and v > 0):
            raise SpecError(f"{name} must be a positive integer, got {v!r}")
    s, o = int(input_len), int(output_len)
    inst = Instance(model, device, plan, engine=engine)
    fit = inst.memory_fit()
    if fit.kv_capacity_tokens <= 0:
        raise InfeasibleError(describe_shortfall(fit, model, device, plan.tp))
    B = engine.max_num_batched_tokens if engine else DEFAULT_MAX_BATCHED_TOKENS
    cap: float = engine.max_num_seqs if engine else math.inf
    if engine is not None and engine.offline_caps == "trtllm-bench":
        cap, B = trtllm_bench_caps(model, device, plan, s, o)
    mixed = engine.chunked_prefill if engine else True
    per_req = s + o if engine is None or engine.kv_reservation == "full" else s + o / 2
    m_ve = fit.kv_capacity_tokens // plan.pp
    limits = {
        "kv_cache": m_ve // per_req,
        "max_num_seqs": cap,
        "max_num_batched_tokens": B if mixed else math.inf,
    }
    binding = min(limits, key=lambda k: limits[k])
    b = int(limits[binding])
    if b < 1:
        raise InfeasibleError(
            f"one request of {s}+{o} tokens needs {per_req:.0f} KV tokens; "
            f"{model.id} on {device.id} holds {m_ve} per virtual engine"
        )

    def t(batch: Batch) -> float:
        return float(inst.iteration_s(batch))

    ctx = s + o / 2
    d = float(b)  # requests decoding in every iteration
    if mixed:
        fed = B * o / (s + o)  # the most the budget keeps fed with prompts
        if fed < d:
            d, binding = fed, "max_num_batched_tokens"
    dec = Batch.decode(d, ctx)
    t_dec = t(dec)
    p = d * s / o  # prompt tokens entering per iteration
    room = B - d
    if mixed:
        chunk = float(room)
        phi = min(1.0, p / chunk)
        if s <= chunk:
            prompts = Batch.prefill(chunk / s, s)
        else:  # a chunk of a long prompt over the half already cached, on average
            prompts = Batch.prefill(1, chunk, (s - chunk) / 2)
        t_bar = (1 - phi) * t_dec + phi * t(dec + prompts)
    else:
        k = max(1, B // s)
        t_bar = t_dec + (b / o) / k * t(Batch.prefill(k, s))
    out = plan.pp * d / t_bar
    return OfflineThroughput(
        output_tokens_per_s=out,
        total_tokens_per_s=out * (s + o) / o,
        requests_per_s=out / o,
        batch=max(1, int(d)),
        binding=binding,
        kv_capacity_tokens=fit.kv_capacity_tokens,
        iteration_s=t_bar,
        decode_step_s=t_dec,
        prefill_share=max(0.0, 1 - t_dec / t_bar),
        engine=engine.id if engine else "",
    )
