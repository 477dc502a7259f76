"""The fleet planner's prefill and decode roles (``--allow-pd``): one cacheable evaluation
per decode device, each running ``solvers.pd.enumerate.evaluate_options`` (every prefill
configuration against that device's decode classes: prefill goodputs depend on the KV
link into the decode class), joined into :class:`~solvers.fleet.candidates.Candidate` s.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import replace

from hardware.device import Device
from hardware.engine import engine_for
from perfmodel.errors import InfeasibleError
from perfmodel.model import ModelSpec
from perfmodel.workload.presets import Workload
from perfmodel.workload.slo import SLO
from solvers.fleet.cache import Job, digest
from solvers.fleet.candidates import Candidate, _key_device, compute_dtype


def pd_jobs(
    model: ModelSpec,
    workload: Workload,
    slo: SLO,
    devices: Sequence[Device],
    engine: str | None = None,
) -> list[Job]:
    """The cacheable evaluation of every prefill and decode configuration: one job, so
    that each prefill configuration's times and memory fit are computed once for all the
    decode classes it is paired with (the prefill goodput differs per class: the KV link);
    it runs beside the colocated evaluations. :func:`pd_results` reads it."""
    lw = workload.lengths
    keys = [_key_device(d) for d in devices]
    engines = [engine_for(engine, d) for d in devices]
    key = digest("pd", model, keys, lw.input_tokens, lw.output_tokens, lw.weights, slo, engines)
    return [Job("pd", key, functools.partial(_evaluate_pd, model, workload, slo, devices, engine))]


def pd_results(
    values: Sequence[tuple[list[Candidate], list[str]]],
) -> tuple[list[Candidate], list[str]]:
    """The joined candidates of :func:`pd_jobs`; the reason only when none has any."""
    cands = [c for cs, _ in values for c in cs]
    return (cands, []) if cands else ([], values[-1][1] if values else [])


def phase_slo(slo: SLO) -> SLO:
    """The per-phase SLO of disaggregated roles that keeps the plan's attainment goal.

    The plan asks that a fraction ``goal`` of requests meet *both* targets (as the
    colocated goodput does). Prefill and decode instances are separate queues, so TTFT
    and TPOT are independent and the joint attainment is the product of the phases':
    each at ``√goal``. Per-phase p90 alone (DistServe's criterion, ``pd plan``) let it
    fall to 0.9 × 0.9: Llama-3.1-70B chat on MI300X at 50 req/s simulated 81.6 %.
    """
    return replace(slo, percentile=max(slo.percentile, math.sqrt(slo.goal)))


def _evaluate_pd(
    model: ModelSpec,
    workload: Workload,
    slo: SLO,
    devices: Sequence[Device],
    engine: str | None = None,
) -> tuple[list[Candidate], list[str]]:
    from solvers.pd.enumerate import evaluate_options

    usable = [d for d in devices if compute_dtype(d) == "bf16"]
    if not usable:
        return [], ["prefill/decode roles: no device computes in bf16"]
    try:
        opts = evaluate_options(
            model,
            workload.lengths,
            phase_slo(slo),
            prefill_devices=usable,
            decode_devices=usable,
            engine=engine,
        )
    except InfeasibleError as e:
        return [], [f"prefill/decode roles: {e}"]
    out: list[Candidate] = []
    for cls, goods in opts.decode.items():
        label = f"{cls[0]} TP{cls[1]}"
        for role, gs in (("decode", goods), ("prefill", opts.prefill.get(cls, []))):
            for g in gs:
                c = g.config
                out.append(
                    Candidate(
                        device=c.device,
                        tp=c.plan.tp,
                        pp=c.plan.pp,
                        dtype=c.plan.weight_dtype,
                        role=role,
                        goodput_per_instance_per_s=g.rate_per_s if g.feasible else 0.0,
                        capacity_per_instance_per_s=g.capacity_rate_per_s,
                        limiter=g.limiter,
                        kv_capacity_tokens=g.kv_capacity_tokens,
                        max_batched_tokens=0,
                        link_capacity_per_s=g.link_capacity_per_s,
                        decode_class=label,
                        link=opts.links.get(cls, ""),
                        note=g.note,
                        phase_config=c,
                    )
                )
    return out, []
