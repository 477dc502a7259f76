"""Stability: the analytical stable rate against the simulator, a stable rate, a cluster size.

``kind``:

* ``sim_deviation`` — for each case in ``cases`` (each a table of setup keys, plus
  ``kv_capacity_tokens`` and ``max_batched_tokens``), ``|μ / μ_sim − 1|`` with ``μ`` from
  ``perfmodel.queueing.service_rate`` and ``μ_sim`` the simulated saturation rate
  (``perfmodel.simulate.saturation_rate_per_s``, ``requests`` requests); value: the
  ``aggregate`` (median or max) over the cases;
* ``stable_rate`` — ``μ`` (req/s) of the setup;
* ``cluster_size`` — instances for ``rate_per_s`` at ``target_utilization``.
"""

from __future__ import annotations

import statistics

from perfmodel.errors import SpecError
from reports.claims.setup import Side
from reports.claims.verdict import Outcome, num


def _service(p: Side):
    from perfmodel.serving.service import service_rate

    kv = p.get("kv_capacity_tokens")
    return service_rate(
        p.instance(),
        p.workload(),
        kv_capacity_tokens=None if kv is None else p.int("kv_capacity_tokens"),
        max_batched_tokens=p.int("max_batched_tokens", 8192),
    )


def stability(params: Side) -> Outcome:
    kind = str(params.get("kind", "sim_deviation"))
    if kind == "stable_rate":
        sr = _service(params)
        return Outcome(
            value=sr.rate_per_s,
            unit="req/s",
            inputs=params.describe(),
            steps=[
                ("compute bound μ_c (req/s)", num(sr.compute_rate_per_s)),
                ("memory bound μ_m (req/s)", num(sr.memory_rate_per_s)),
                ("μ = min, binding", f"{num(sr.rate_per_s)}, {sr.binding}"),
            ],
        )
    if kind == "cluster_size":
        from perfmodel.serving.goodput import instances_needed

        sr = _service(params)
        s = instances_needed(
            sr, params.num("rate_per_s"), target_utilization=params.num("target_utilization", 0.8)
        )
        return Outcome(
            value=float(s.instances),
            unit="instances",
            inputs=params.describe(),
            steps=[
                ("μ per instance (req/s)", num(sr.rate_per_s)),
                ("necessary (λ/N < μ) / recommended", f"{s.necessary_instances} / {s.instances}"),
            ],
        )
    if kind != "sim_deviation":
        raise SpecError("stability kind must be sim_deviation, stable_rate or cluster_size")
    from perfmodel.memory import memory_fit
    from perfmodel.sim.simulate import make_setup, saturation_rate_per_s

    cases = params.need("cases")
    errs, steps = [], []
    for i, c in enumerate(cases):
        side = params.with_values(c)
        side.what = f"{params.what} case {i}"
        sr = _service(side)
        model, dev, plan = side.model(), side.device(), side.plan()
        M = sr.kv_capacity_tokens or memory_fit(model, dev, plan).kv_capacity_tokens
        setup = make_setup(
            side.instance(), kv_capacity_tokens=M, max_batched_tokens=sr.max_batched_tokens
        )
        sim = saturation_rate_per_s(setup, side.lengths(), n_requests=params.int("requests", 1500))
        e = abs(sr.rate_per_s / sim - 1)
        errs.append(e)
        steps.append(
            (
                f"{model.id} {plan.tp}x{dev.id} M={M:,} B={sr.max_batched_tokens}: "
                "μ / μ_sim (req/s), bound",
                f"{num(sr.rate_per_s)} / {num(sim)} ({e:.1%}), {sr.binding}",
            )
        )
    agg = str(params.get("aggregate", "median"))
    v = statistics.median(errs) if agg == "median" else max(errs)
    steps.append((f"{agg} |μ / μ_sim − 1|", f"{v:.1%}"))
    return Outcome(value=v, inputs=params.describe(), steps=steps)
