"""The planner: candidates -> fleet MILP -> the recommendation, alternatives, sensitivity.

``plan_fleet`` evaluates every feasible configuration of every device type
(:mod:`solvers.fleet.candidates`), prices them (``perfmodel.cost``), solves the fleet
MILP (:mod:`solvers.fleet.milp`) for the mix, then for each device type alone, for
colocated serving alone and (with ``allow_pd``) for the best disaggregated fleet, and
re-solves at ±25 % rate. The planned demand is ``rate × headroom``. Comparisons are in
$/h when every device has a price, in devices otherwise. An infeasible request raises
``InfeasibleError`` naming the binding constraint and the smallest change that fixes it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

from hardware.device import Device
from perfmodel.cost.power import PoolUse, cost_energy
from perfmodel.cost.prices import PriceBook
from perfmodel.errors import InfeasibleError, SpecError
from perfmodel.model import ModelSpec
from perfmodel.workload.arrivals import check_rate
from perfmodel.workload.presets import Workload
from perfmodel.workload.slo import SLO
from solvers.fleet.batch import solve_fleets
from solvers.fleet.cache import run_jobs
from solvers.fleet.candidates import (
    DEFAULT_MAX_BATCHED_TOKENS,
    Candidate,
    colocated_jobs,
    colocated_results,
    size_buckets,
    with_buckets,
)
from solvers.fleet.explain import assumptions, explain, no_candidate, price_flips
from solvers.fleet.milp import FleetOption, FleetProblem, FleetSolution
from solvers.fleet.pd_roles import pd_jobs, pd_results
from solvers.fleet.results import Alternative, Fleet, PlanResult, Pool, Sensitivity
from solvers.fleet.results import merge_pools as merge_pools  # re-export
from solvers.fleet.ties import Solved, simplest

RATE_STEPS = (0.75, 1.25)
#: what the evaluations import (preloaded before the evaluation processes fork)
EVALUATION_MODULES = (
    "perfmodel.serving.service",
    "perfmodel.step.dequant",
    "perfmodel.serving.goodput",
    "solvers.pd.enumerate",
    "threadpoolctl",
)
#: what the fleet MILPs import next (in the parent, while the evaluations run)
SOLVE_MODULES = ("pulp", "highspy", "solvers.pulp_solver")


@dataclass(frozen=True)
class PlanInputs:
    """Everything the planner reads."""

    model: ModelSpec
    workload: Workload
    slo: SLO
    rate_per_s: float
    devices: tuple[Device, ...]
    prices: PriceBook
    headroom: float = 1.0
    allow_pd: bool = True
    engine: str | None = None  # resolved per device (hardware.engine.engine_for); None: none
    max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS
    time_limit_s: float = 10.0
    use_cache: bool = True
    buckets: int = 1  # > 1: route request-size buckets to pools (colocated only)
    skip_dominated: bool = True  # TPs a smaller one dominates: unsearched (dominated_by)

    def __post_init__(self) -> None:
        check_rate(self.rate_per_s)
        if self.buckets < 1:
            raise SpecError(f"--buckets must be >= 1, got {self.buckets}")
        if not (math.isfinite(self.headroom) and self.headroom >= 1.0):
            raise SpecError(f"--headroom must be a burst factor >= 1, got {self.headroom}")
        if not self.devices:
            raise SpecError("no devices to plan over; give --devices or price some devices")
        if self.time_limit_s <= 0:
            raise SpecError(f"time limit must be > 0 s, got {self.time_limit_s}")

    @cached_property
    def priced(self) -> bool:
        """Every device has a price (then comparisons are in money, else in devices)."""
        return all(self.prices.price(d.id) is not None for d in self.devices)

    @property
    def demand_per_s(self) -> float:
        return self.rate_per_s * self.headroom


def evaluate(inputs: PlanInputs) -> tuple[list[Candidate], list[str]]:
    """Every candidate (colocated, and PD roles when allowed) with its goodput.

    The evaluations missing from the cache run in parallel processes (the PD planner's,
    the longest, together with the colocated ones)."""
    cache = inputs.use_cache
    m, w, slo, devs = inputs.model, inputs.workload, inputs.slo, inputs.devices
    eng = inputs.engine
    jobs, rejected = colocated_jobs(
        m, w, slo, devs, max_batched_tokens=inputs.max_batched_tokens, engine=eng,
        skip_dominated=inputs.buckets == 1 and inputs.skip_dominated,
    )  # fmt: skip
    pd = inputs.allow_pd and inputs.buckets == 1
    extra = pd_jobs(m, w, slo, devs, eng) if pd else []
    values = run_jobs(
        [*extra, *(j for _, j in jobs)],
        enabled=cache,
        preload=EVALUATION_MODULES,
        meanwhile=SOLVE_MODULES,
    )
    cands, more = colocated_results(jobs, values[len(extra) :])
    rejected += more
    if inputs.buckets > 1:
        cands = with_buckets(
            cands, m, size_buckets(w, inputs.buckets), slo, devs,
            max_batched_tokens=inputs.max_batched_tokens, use_cache=cache, engine=eng,
        )  # fmt: skip
        return cands, rejected  # PD roles are not combined with buckets
    if pd:
        pd_cands, why = pd_results(values[: len(extra)])
        by_id = {d.id: d for d in devs}
        cands += [replace(c, device=by_id.get(c.device.id, c.device)) for c in pd_cands]
        rejected += why
    return cands, rejected


def _unit_cost(c: Candidate, inputs: PlanInputs) -> float:
    if inputs.priced:
        return float(inputs.prices.price(c.device.id) or 0.0) * c.devices
    return float(c.devices)


def build_problem(
    cands: Sequence[Candidate],
    inputs: PlanInputs,
    *,
    rate_per_s: float | None = None,
    only_type: str | None = None,
    roles: tuple[str, ...] = ("colocated", "prefill", "decode"),
    caps: bool = True,
) -> tuple[FleetProblem, dict[str, Candidate]]:
    """The MILP over the feasible candidates (optionally one device type / some roles)."""
    demand = (rate_per_s or inputs.rate_per_s) * inputs.headroom
    bucketed = inputs.buckets > 1
    demands: tuple[float, ...] = (demand,)
    if bucketed:
        demands = tuple(demand * b.weight for b in size_buckets(inputs.workload, inputs.buckets))
    opts, by_name = [], {}
    for i, c in enumerate(cands):
        if bucketed and (c.role != "colocated" or not any(c.bucket_goodput_per_s)):
            continue
        if not bucketed and not c.feasible:
            continue
        if c.role not in roles:
            continue
        if only_type is not None and c.device.id != only_type:
            continue
        name = f"o{i}"
        by_name[name] = c
        opts.append(
            FleetOption(
                name,
                c.device.id,
                c.devices,
                _unit_cost(c, inputs),
                c.role,
                c.bucket_goodput_per_s if bucketed else (c.goodput_per_instance_per_s,),
                c.link_capacity_per_s,
                c.decode_class if c.role != "colocated" else "",
            )
        )
    types = {o.device_type for o in opts}
    book = inputs.prices
    mx = {t: book.get(t).max_devices for t in types} if caps else {}
    mn = {t: book.get(t).min_devices for t in types} if caps else {}
    return (
        FleetProblem(
            tuple(opts),
            demands,
            {t: v for t, v in mx.items() if v is not None},
            {t: v for t, v in mn.items() if v},
        ),
        by_name,
    )


def _binding(sol: FleetSolution) -> str:
    names = [r.name for r in sol.rows if r.binding]
    for prefix in ("max_devices_", "min_devices_", "kv_link_", "prefill_goodput", "decode_goodput"):
        hit = [n for n in names if n.startswith(prefix)]
        if hit:
            return hit[0].rsplit("_", 1)[0] if prefix.startswith("kv") else hit[0]
    return "goodput (whole instances: rate x headroom <= sum of pool goodputs)"


def to_fleet(
    sol: FleetSolution, by_name: dict[str, Candidate], inputs: PlanInputs, rate_per_s: float
) -> Fleet:
    """Pools, in the candidates' order, with their share of ``rate_per_s`` (by goodput)."""
    if inputs.buckets > 1:
        return _bucket_fleet(sol, by_name, inputs, rate_per_s)
    chosen = merge_pools([(c, sol.counts[k]) for k, c in by_name.items() if sol.counts.get(k)])
    pd_total = sum(sol.pd_rate_per_s.values()) / inputs.headroom
    colo_rate = max(rate_per_s - pd_total, 0.0)
    pools: list[Pool] = []
    for role, share in (("colocated", colo_rate), ("prefill", pd_total), ("decode", pd_total)):
        mine = [(c, n) for c, n in chosen if c.role == role]
        cap = sum(c.goodput_per_instance_per_s * n for c, n in mine)
        for c, n in mine:
            r = share * c.goodput_per_instance_per_s * n / cap if cap > 0 else 0.0
            pools.append(Pool(c, n, r, inputs.prices.price(c.device.id)))
    return _fleet(pools, sol, inputs, rate_per_s)


def _fleet(pools: list[Pool], sol: FleetSolution, inputs: PlanInputs, rate_per_s: float) -> Fleet:
    uses = [PoolUse(p.candidate.device, p.devices, p.utilization, p.price_per_hour_usd)
            for p in pools]  # fmt: skip
    econ = cost_energy(
        uses,
        rate_per_s=rate_per_s,
        mean_output_tokens=inputs.workload.lengths.mean_output_tokens,
    )
    return Fleet(tuple(pools), econ, sol.cost, sol.status, sol.gap, _binding(sol), sol.solve_s)


def _bucket_fleet(
    sol: FleetSolution, by_name: dict[str, Candidate], inputs: PlanInputs, rate_per_s: float
) -> Fleet:
    """Pools that serve routed request-size buckets: each pool's goodput and service rate
    on its mix follow Mélange's load model, ``1/g_mix = Σ_b f_b/g_b`` (``f_b``: the share
    of the pool's requests from bucket ``b``)."""
    buckets = size_buckets(inputs.workload, inputs.buckets)
    pools = []
    for name, n in ((k, sol.counts[k]) for k in by_name if k in sol.counts):
        c = by_name[name]
        rates = [
            rate_per_s * b.weight * sol.share.get((i, name), 0.0) for i, b in enumerate(buckets)
        ]
        r = sum(rates)
        if n <= 0 or r <= 0:
            continue
        inv_g = sum(x / r / g for x, g in zip(rates, c.bucket_goodput_per_s, strict=True) if x > 0)
        inv_mu = sum(
            x / r / m for x, m in zip(rates, c.bucket_capacity_per_s, strict=True) if x > 0
        )
        share = tuple(
            (b.label, sol.share.get((i, name), 0.0)) for i, b in enumerate(buckets)
            if sol.share.get((i, name), 0.0) > 1e-9
        )  # fmt: skip
        mixed = replace(
            c, goodput_per_instance_per_s=1 / inv_g, capacity_per_instance_per_s=1 / inv_mu
        )
        pools.append(Pool(mixed, n, r, inputs.prices.price(c.device.id), share))
    return _fleet(pools, sol, inputs, rate_per_s)


def _solve_many(
    cands: Sequence[Candidate], inputs: PlanInputs, asks: Sequence[dict[str, Any]]
) -> list[Solved]:
    """The MILP of each ``build_problem`` keyword set, solved together (``solve_fleets``)."""
    built = []
    for kw in asks:
        kw = dict(kw)
        rate = kw.pop("rate_per_s", None)
        built.append(build_problem(cands, inputs, rate_per_s=rate, **kw))
    todo = [p for p, _ in built if p.options]
    sols = iter(solve_fleets(todo, time_limit_s=inputs.time_limit_s, use_cache=inputs.use_cache))
    none = FleetSolution("infeasible", {}, math.inf, None, {}, {}, (), "none", 0.0)
    return [(next(sols) if p.options else none, by_name) for p, by_name in built]


def _solve(cands: Sequence[Candidate], inputs: PlanInputs, **kw: Any) -> Solved:
    return _solve_many(cands, inputs, [kw])[0]


def _alternative(name: str, solved: Solved, inputs: PlanInputs) -> Alternative:
    sol, by_name = solved
    if sol.status == "infeasible":
        roles = sorted({c.role for c in by_name.values()})
        if not by_name:
            return Alternative(name, None, "no configuration meets the SLO")
        if roles in (["decode"], ["prefill"]):
            return Alternative(
                name,
                None,
                f"only {roles[0]} configurations meet the SLO; the other phase never does",
            )
        return Alternative(name, None, "infeasible under the availability caps")
    return Alternative(name, to_fleet(sol, by_name, inputs, inputs.rate_per_s))


def diagnose_infeasible(cands: Sequence[Candidate], inputs: PlanInputs) -> str:
    """Name the binding availability constraint and the smallest change that fixes it."""
    free, fb = _solve(cands, inputs, caps=False)
    if free.status == "infeasible":
        return "no fleet meets the demand even without availability caps"
    book = inputs.prices
    capped = {d.id: book.get(d.id).max_devices for d in inputs.devices}
    capped = {k: v for k, v in capped.items() if v is not None}
    msgs = []
    for t, cap in sorted(capped.items()):
        entries = {**book.entries, t: replace(book.get(t), max_devices=None)}
        relaxed = replace(inputs, prices=PriceBook(entries))
        sol, by = _solve(cands, relaxed)
        if sol.status == "infeasible":
            continue
        need = sum(by[k].devices * n for k, n in sol.counts.items() if by[k].device.id == t)
        msgs.append((sol.cost, t, cap, need))
    if not msgs:
        uses: dict[str, int] = {}
        for k, n in free.counts.items():
            uses[fb[k].device.id] = uses.get(fb[k].device.id, 0) + fb[k].devices * n
        caps = ", ".join(f"--max-devices {t}={uses.get(t, 0)}" for t in sorted(capped))
        return (
            f"the availability caps together are too low for {inputs.rate_per_s:g} req/s "
            f"x headroom {inputs.headroom:g} (binding constraints: "
            f"{', '.join(f'max_devices_{t}' for t in sorted(capped))}); the cheapest uncapped "
            f"fleet uses {caps}"
        )
    _, t, cap, need = min(msgs)
    return (
        f"--max-devices {t}={cap} is too few for {inputs.rate_per_s:g} req/s x headroom "
        f"{inputs.headroom:g} (binding constraint: max_devices_{t}); the cheapest feasible "
        f"fleet with the other caps kept needs {need} {t} -- raise it to --max-devices "
        f"{t}={need}, or lower the rate"
    )


def plan_fleet(
    inputs: PlanInputs,
    *,
    candidates: tuple[list[Candidate], list[str]] | None = None,
) -> PlanResult:
    """The recommendation and its alternatives (see the module docstring)."""
    cands, rejected = candidates if candidates is not None else evaluate(inputs)
    if not any(c.feasible for c in cands):
        raise InfeasibleError(no_candidate(cands, rejected, inputs))
    types = sorted({c.device.id for c in cands})
    pd_on = inputs.allow_pd and inputs.buckets == 1
    # every MILP of the answer, solved together: the fleet, each device type alone,
    # colocated only, disaggregated only, the fleet at the other rates
    asks: dict[tuple[str, str], dict[str, Any]] = {("fleet", ""): {}}
    asks.update({("single", t): {"only_type": t} for t in types})
    asks[("colocated_only", "")] = {"roles": ("colocated",)}
    if pd_on:
        asks[("disaggregated_only", "")] = {"roles": ("prefill", "decode")}
    asks.update({("rate", f"{f}"): {"rate_per_s": inputs.rate_per_s * f} for f in RATE_STEPS})
    got = dict(zip(asks, _solve_many(cands, inputs, list(asks.values())), strict=True))
    if got[("fleet", "")][0].status == "infeasible":
        raise InfeasibleError(diagnose_infeasible(cands, inputs))
    floors = {t for t in types if inputs.prices.get(t).min_devices}
    singles_solved = {t: got[("single", t)] for t in types}
    sol, by_name = simplest(got[("fleet", "")], singles_solved, floors)
    rec = to_fleet(sol, by_name, inputs, inputs.rate_per_s)
    singles = {t: _alternative(t, got[("single", t)], inputs) for t in types}
    colo = _alternative("colocated_only", got[("colocated_only", "")], inputs)
    pd = (
        _alternative("disaggregated_only", got[("disaggregated_only", "")], inputs)
        if pd_on
        else None
    )
    sens = []
    for f in RATE_STEPS:
        s, b = got[("rate", f"{f}")]
        if s.status == "infeasible":
            sens.append(Sensitivity(f"rate x{f:g}", None, None, "infeasible", None))
            continue
        fl = to_fleet(s, b, inputs, inputs.rate_per_s * f)
        same = {(p.candidate.key) for p in fl.pools} == {p.candidate.key for p in rec.pools}
        sens.append(
            Sensitivity(
                f"rate x{f:g} ({inputs.rate_per_s * f:.3g} req/s)",
                fl.economics.cost_per_hour_usd,
                fl.devices,
                fl.summary,
                same,
            )
        )
    return PlanResult(
        recommendation=rec,
        best_single_device=singles,
        colocated_only=colo,
        disaggregated=pd,
        sensitivity=tuple(sens),
        price_flips=price_flips(rec, singles, inputs.prices) if inputs.priced else (),
        why=explain(rec, singles, colo, pd, cands, inputs.prices, inputs.priced, rejected),
        candidates=tuple(cands),
        rejected=tuple(rejected),
        assumptions=assumptions(inputs),
        priced=inputs.priced,
    )
