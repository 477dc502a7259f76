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
from perfmodel.plan import ParallelPlan
from perfmodel.step.batch import Batch
from perfmodel.step.instance import Instance
from perfmodel.step.time import StepTime


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
