"""End-to-end estimate of a static batch: TTFT, TPOT, throughput, memory fit.

The batch's ``batch`` requests arrive together, are prefilled in one iteration (TTFT
is that iteration) and then decode in lock-step; the first output token comes from
the prefill, so there are ``output_len − 1`` decode steps at contexts
``input_len … input_len + output_len − 2``, all evaluated in one vectorized call.

With pipeline parallelism (``plan.pp > 1``) the requests are spread over the ``pp``
virtual engines (vLLM assigns each new request to the least-loaded one), so every
iteration is that of a micro-batch of ``⌈batch/pp⌉`` requests (the largest) and the
steps are ``perfmodel.step.step_time``'s virtual-engine iterations; memory is checked
for the whole batch (every stage caches every request's KV for its layers).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hardware.device import Device
from perfmodel.errors import SpecError
from perfmodel.memory import MemoryFit
from perfmodel.model import ModelSpec
from perfmodel.plan import ParallelPlan, Precision
from perfmodel.step.batch import Batch
from perfmodel.step.instance import Instance
from perfmodel.step.time import StepTime
from perfmodel.units import ms


@dataclass(frozen=True)
class Estimate:
    model: ModelSpec
    device: Device
    plan: ParallelPlan
    batch: int
    input_len: int
    output_len: int
    ttft_s: float
    tpot_s: float
    e2e_s: float
    output_tokens_per_s: float
    prefill: StepTime
    decode_mid: StepTime  # decode step at the middle context
    decode_arith_intensity: float  # FLOP / HBM byte of the middle decode step
    ridge_flop_per_byte: float
    memory: MemoryFit
    micro_batch: int = 0  # requests per virtual engine: ⌈batch/pp⌉ (= batch when pp = 1)

    def to_dict(self) -> dict[str, object]:
        e = self
        f = e.memory
        return {
            "fits": e.memory.fits,
            "model": e.model.id,
            "hardware": e.device.id,
            "tp": e.plan.tp,
            "pp": e.plan.pp,
            "devices": e.plan.devices,
            "micro_batch": e.micro_batch,
            "dtypes": {
                "weight": e.plan.weight_dtype,
                "act": e.plan.act_dtype,
                "kv": e.plan.kv_dtype,
            },
            "batch": e.batch,
            "input_len": e.input_len,
            "output_len": e.output_len,
            "ttft_ms": ms(e.ttft_s),
            "tpot_ms": ms(e.tpot_s),
            "e2e_ms": ms(e.e2e_s),
            "output_tokens_per_s": e.output_tokens_per_s,
            "decode_arith_intensity_flop_per_byte": e.decode_arith_intensity,
            "ridge_flop_per_byte": e.ridge_flop_per_byte,
            "decode_bound_s": {k: float(v) for k, v in e.decode_mid.by_bound().items()},
            "prefill_bound_s": {k: float(v) for k, v in e.prefill.by_bound().items()},
            "memory": {
                "fits": f.fits,
                "capacity_bytes": f.capacity_bytes,
                "usable_bytes": f.usable_bytes,
                "weight_bytes_per_device": f.weight_bytes,
                "activation_reserve_bytes": f.reserve_bytes,
                "kv_bytes_per_token_per_device": f.kv_bytes_per_token,
                "kv_capacity_tokens": f.kv_capacity_tokens,
                "max_batch_at_context": f.max_batch(e.input_len + e.output_len),
                "shortfall_bytes": f.shortfall_bytes,
                "min_tp": f.min_tp,
                "min_pp": f.min_pp,
                "binding_stage": f.stage,
            },
            "decode_breakdown": op_breakdown(e.decode_mid),
            "prefill_breakdown": op_breakdown(e.prefill),
        }


@dataclass(frozen=True)
class EstimateReport:
    """``perfmodel estimate``'s answer: the estimate, the formats chosen and why, the engine."""

    instance: Instance
    estimate: Estimate
    precision: Precision

    def to_dict(self) -> dict[str, object]:
        inst = self.instance
        return {
            **self.estimate.to_dict(),
            "precision": self.precision.to_dict(),
            "ep": inst.plan.ep,
            "dp": inst.plan.dp,
            "warnings": list(inst.model.warnings),
            "engine": inst.engine.id if inst.engine else None,
            "engine_accuracy": inst.engine_accuracy,
        }


def estimate(
    inst: Instance,
    *,
    batch: int,
    input_len: int,
    output_len: int,
) -> Estimate:
    for name, v in (("batch", batch), ("input length", input_len), ("output length", output_len)):
        if not (isinstance(v, int | np.integer) and v > 0):
            raise SpecError(f"{name} must be a positive integer, got {v!r}")
    model, device, plan = inst.model, inst.device, inst.plan
    fit = inst.memory_fit(batch=batch, context_len=input_len + output_len)
    mb = -(-batch // plan.pp)  # ⌈batch/pp⌉: the largest virtual engine's micro-batch
    prefill = inst.step(Batch.prefill(mb, input_len))
    ctx = input_len + np.arange(max(output_len - 1, 1), dtype=np.float64)
    decode_s = inst.iteration_s(Batch.decode(mb, ctx))
    n_dec = output_len - 1
    decode_total = float(decode_s[:n_dec].sum())
    ttft = float(inst.iteration_s(Batch.prefill(mb, input_len)))
    tpot = float(decode_s.mean()) if n_dec > 0 else 0.0
    e2e = ttft + decode_total
    mid_ctx = input_len + n_dec // 2
    mid = inst.step(Batch.decode(mb, mid_ctx))
    ai = float(mid.flops / mid.bytes) if float(mid.bytes) > 0 else float("inf")
    return Estimate(
        model=model,
        device=device,
        plan=plan,
        batch=batch,
        input_len=input_len,
        output_len=output_len,
        ttft_s=ttft,
        tpot_s=tpot,
        e2e_s=e2e,
        output_tokens_per_s=batch * output_len / e2e,
        prefill=prefill,
        decode_mid=mid,
        decode_arith_intensity=ai,
        ridge_flop_per_byte=device.ridge_flop_per_byte(plan.act_dtype),
        memory=fit,
        micro_batch=mb,
    )


def op_breakdown(step: StepTime) -> list[dict[str, object]]:
    """Per-operator times of a step (ms) and what bounds each, for reports and JSON."""
    return [
        {
            "op": o.name,
            "count": o.count,
            "compute_ms": ms(float(o.compute_s)),
            "memory_ms": ms(float(o.memory_s)),
            "comm_ms": ms(float(o.comm_s)),
            "total_ms": ms(float(o.total_s)),
            "bound": str(o.bound),
        }
        for o in step.ops
    ]
