"""Check the recommended fleet in the discrete-event simulator.

Each colocated pool is simulated as one instance at its per-instance share of the rate
(a random split of Poisson arrivals is Poisson; ``perfmodel.sim.simulate``), on the
workload's full-resolution length distribution (the plan used a coarser grid), and its
simulated SLO attainment — the fraction of requests with TTFT and TPOT both within
target, the first 10 % of arrivals discarded as warm-up — is set against the queueing
model's prediction at that rate. The disaggregated part, all its prefill and decode
pools together with the KV transfers, is simulated by ``perfmodel.pd.simulate`` at the
rate it carries. Agreement is a consistency check of the plan against the same cost
model, not a validation against real engines.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from perfmodel.workload.lengths import LengthDistribution
from perfmodel.workload.presets import PRESETS, preset
from solvers.fleet.results import PlanResult, Pool

WARMUP_FRACTION = 0.1
DEFAULT_REQUESTS = 3000


@dataclass(frozen=True)
class PoolCheck:
    """Predicted vs simulated SLO attainment of one pool (or of the PD part)."""

    pools: str
    rate_per_s: float  # per instance (colocated) or of the whole PD part
    predicted_attainment: float | None  # None: the PD model gives per-phase percentiles
    simulated_attainment: float
    simulated_ttft_quantile_s: float
    simulated_tpot_quantile_s: float
    goal: float
    requests: int

    @property
    def meets_goal(self) -> bool:
        return self.simulated_attainment >= self.goal

    @property
    def summary(self) -> str:
        pred = (
            ""
            if self.predicted_attainment is None
            else f"predicted {self.predicted_attainment:.1%}, "
        )
        return (
            f"{self.pools} at {self.rate_per_s:.3g} req/s: {pred}simulated "
            f"{self.simulated_attainment:.1%} ({'meets' if self.meets_goal else 'misses'} the "
            f"{self.goal:.0%} goal, {self.requests} requests)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {**vars(self), "meets_goal": self.meets_goal, "summary": self.summary}


def _sim_lengths(inputs: Any) -> LengthDistribution:
    w = inputs.workload
    if w.trace is None and w.name in PRESETS:
        return preset(w.name).lengths
    lengths: LengthDistribution = w.lengths
    return lengths


def _attainment(
    arr: Any, first: Any, finish: Any, out: Any, slo: Any
) -> tuple[float, float, float]:
    keep = arr >= WARMUP_FRACTION * arr[-1]
    ttft = first[keep] - arr[keep]
    o = out[keep]
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(o >= 2, (finish[keep] - first[keep]) / np.maximum(o - 1, 1), 0.0)
    ok = (ttft <= slo.ttft_s) & (tpot <= slo.tpot_s)
    q = slo.percentile
    tq = float(np.quantile(np.where(np.isfinite(ttft), ttft, np.inf), q))
    pq = float(np.quantile(np.where(np.isfinite(tpot), tpot, np.inf), q))
    return float(np.mean(ok)), tq, pq


def check_colocated(pool: Pool, inputs: Any, *, requests: int, seed: int) -> PoolCheck:
    from hardware.engine import engine_for
    from perfmodel.serving.goodput import slo_attainment
    from perfmodel.serving.service import latency, service_rate
    from perfmodel.sim.simulate import make_setup, simulate_workload
    from perfmodel.step.instance import Instance

    c = pool.candidate
    plan = _plan(c)
    w = inputs.workload
    if pool.buckets:
        from perfmodel.workload.presets import Workload

        w = Workload("bucket mix", bucket_mix(pool, inputs), w.arrival_cv)
    inst = Instance(inputs.model, c.device, plan, engine=engine_for(inputs.engine, c.device))
    sr = service_rate(inst, w, max_batched_tokens=c.max_batched_tokens)
    r = pool.per_instance_rate_per_s
    pred = slo_attainment(latency(sr, r), inputs.slo).attainment
    setup = make_setup(
        inst,
        kv_capacity_tokens=sr.engine_kv_capacity_tokens,
        max_batched_tokens=sr.max_batched_tokens,
        chunk_size=sr.chunk_size,
    )
    lengths = bucket_mix(pool, inputs) if pool.buckets else _sim_lengths(inputs)
    res = simulate_workload(
        setup, lengths, w.arrivals(r), n_requests=requests, seed=seed, engines=plan.pp
    )
    a, tq, pq = _attainment(
        res.arrival_s, res.first_token_s, res.finish_s, res.output_tokens, inputs.slo
    )
    label = f"{pool.devices}x {c.device.id} TP{c.tp} colocated (1 of {pool.instances} instances)"
    return PoolCheck(label, r, pred, a, tq, pq, inputs.slo.goal, requests)


def bucket_mix(pool: Pool, inputs: Any) -> LengthDistribution:
    """The lengths a bucket-routed pool sees: its buckets' atoms, weighted by the traffic
    each bucket sends it (prediction and simulation then both use this mix)."""
    from solvers.fleet.candidates import size_buckets

    got = dict(pool.buckets)
    parts = [(b, b.weight * got[b.label]) for b in size_buckets(inputs.workload, inputs.buckets)
             if b.label in got]  # fmt: skip
    tot = sum(w for _, w in parts)
    s = np.concatenate([b.workload.lengths.input_tokens for b, _ in parts])
    o = np.concatenate([b.workload.lengths.output_tokens for b, _ in parts])
    wt = np.concatenate([b.workload.lengths.weights * (w / tot) for b, w in parts])
    return LengthDistribution("bucket mix", s, o, wt / wt.sum())


def _plan(c: Any) -> Any:
    from perfmodel.plan import ParallelPlan

    return ParallelPlan(tp=c.tp, weight_dtype=c.dtype, act_dtype=c.dtype, kv_dtype=c.dtype, pp=c.pp)


def check_pd(pools: list[Pool], inputs: Any, *, requests: int, seed: int) -> PoolCheck:
    from perfmodel.pd.simulate import Deployment, run_at_rate, sample_requests
    from perfmodel.pd.simulate import Pool as PDPool

    pre = [p for p in pools if p.candidate.role == "prefill"]
    dec = [p for p in pools if p.candidate.role == "decode"]
    mk = lambda ps: tuple(  # noqa: E731
        PDPool(p.candidate.phase_config, p.instances, p.candidate.goodput_per_instance_per_s)
        for p in ps
    )
    dep = Deployment(inputs.model, mk(pre), mk(dec))
    rate = sum(p.rate_per_s for p in pre)
    lengths = _sim_lengths(inputs)
    res = run_at_rate(dep, lengths, sample_requests(lengths, requests, seed=seed), rate)
    a, tq, pq = _attainment(
        res.arrival_s, res.first_token_s, res.finish_s, res.output_tokens, inputs.slo
    )
    label = " + ".join(f"{p.devices}x {p.candidate.device.id} TP{p.candidate.tp} {p.candidate.role}"
                       for p in pre + dec)  # fmt: skip
    return PoolCheck(label, rate, None, a, tq, pq, inputs.slo.goal, requests)


def verify_fleet(
    result: PlanResult, inputs: Any, *, requests: int = DEFAULT_REQUESTS, seed: int = 0
) -> PlanResult:
    """The result with one :class:`PoolCheck` per colocated pool and one for the PD part."""
    checks = []
    pools = result.recommendation.pools
    for p in pools:
        if p.candidate.role == "colocated" and p.rate_per_s > 0:
            checks.append(check_colocated(p, inputs, requests=requests, seed=seed))
    pd = [p for p in pools if p.candidate.role != "colocated" and p.rate_per_s > 0]
    if pd:
        checks.append(check_pd(pd, inputs, requests=requests, seed=seed))
    return replace(result, verification=tuple(checks))
