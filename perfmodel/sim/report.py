"""``perfmodel simulate``'s answer: one instance simulated at a rate or on a trace.

:func:`simulate_instance` sizes the engine as the queueing model does (its KV capacity
per virtual engine, token budget and chunk size from ``serving.service.service_rate``),
runs the discrete-event simulation of the workload (Poisson-like arrivals at the rate,
or the trace's own arrivals) and returns a :class:`SimulationReport`, whose ``to_dict``
is the command's JSON.
"""

from __future__ import annotations

from dataclasses import dataclass

from perfmodel.serving.capacity import DEFAULT_LOAD
from perfmodel.serving.service import EngineLimits, ServiceRate
from perfmodel.sim.simulate import SimResult, make_setup, simulate_engines, simulate_workload
from perfmodel.step.instance import Instance
from perfmodel.units import MS_PER_S
from perfmodel.workload.arrivals import check_rate
from perfmodel.workload.presets import Workload


@dataclass(frozen=True)
class SimulationReport:
    """The simulated run of one instance, beside the queueing model's service rate."""

    instance: Instance
    workload: Workload
    rate_per_s: float
    service: ServiceRate
    result: SimResult

    def to_dict(self) -> dict[str, object]:
        inst, res = self.instance, self.result
        plan = inst.plan
        dists = {"ttft": res.ttft(), "tpot": res.tpot(), "e2e": res.e2e()}
        return {
            **inst.ids(),
            "devices": plan.devices,
            "workload": self.workload.name,
            "rate_per_s": self.rate_per_s,
            "predicted_service_rate_per_s": self.service.rate_per_s,
            "requests": int(res.arrival_s.size),
            "completed": int(res.completed.sum()),
            "rejected": res.rejected,
            "preemptions": res.preemptions,
            "iterations": res.iterations,
            "throughput_per_s": res.throughput_per_s,
            "queue_growth_per_s": res.queue_growth_per_s(),
            "max_queue": int(res.queue_len.max(initial=0)),
            **{
                k: {
                    "mean_ms": v.mean_s * MS_PER_S,
                    "p50_ms": v.p50_s * MS_PER_S,
                    "p90_ms": v.p90_s * MS_PER_S,
                    "p99_ms": v.p99_s * MS_PER_S,
                }
                for k, v in dists.items()
            },
            "engine": inst.engine.id if inst.engine else None,
        }


def simulate_instance(
    inst: Instance,
    workload: Workload,
    *,
    rate_per_s: float | None = None,
    time_scale: float = 1.0,
    requests: int = 20000,
    seed: int = 0,
    limits: EngineLimits = EngineLimits(),
) -> SimulationReport:
    """Simulate ``requests`` requests at ``rate_per_s`` (default: ``DEFAULT_LOAD`` of μ),
    or, with a trace and no rate, replay the trace ``time_scale`` times faster."""
    sr = limits.service_rate(inst, workload)
    setup = make_setup(
        inst,
        kv_capacity_tokens=sr.engine_kv_capacity_tokens,  # one virtual engine's share
        max_batched_tokens=sr.max_batched_tokens,
        chunk_size=sr.chunk_size,
    )
    engines = inst.plan.pp
    tr = workload.trace
    if tr is not None and rate_per_s is None:
        res = simulate_engines(
            setup,
            arrival_s=tr.replay_times_s(time_scale),
            input_tokens=tr.input_tokens,
            output_tokens=tr.output_tokens,
            engines=engines,
            seed=seed,
        )
        rate = tr.rate_per_s * time_scale
    else:
        rate = rate_per_s if rate_per_s is not None else DEFAULT_LOAD * sr.rate_per_s
        check_rate(rate)
        arrivals = workload.arrivals(rate)
        res = simulate_workload(
            setup, workload.lengths, arrivals, n_requests=requests, seed=seed, engines=engines
        )
    return SimulationReport(inst, workload, rate, sr, res)
