"""Split one device's memory among KV cache, an offloaded-expert cache and LoRA adapters.

Entry point: :func:`plan_cache_budget` -> :class:`CachePlan`. Each pool gets one of a
few discrete levels:

* KV cache: ``kv_levels`` sizes from one longest request to the whole budget (sets ``M``);
* expert cache (``offload_experts``): ``C`` experts per MoE layer from ``top_k`` to ``E``;
* adapters: ``K`` resident adapters from 1 to the catalog size ``N`` (geometric).

Every (KV, expert) *engine* within the budget is evaluated once with the serving model
(:mod:`perfmodel.cache_serving`: the queueing layer, slowed by expert fetches), every
adapter level once (its miss ratio); the split MILP (:mod:`solvers.cache_milp`) picks
the best admissible combination — stable at ``λ`` and meeting the SLO goal — under the
memory knapsack. The marginal value of one more GiB in a pool is the change of the
objective (and of ``μ``) when that pool alone grows by 1 GiB (continuous evaluation).

The serving model and the MILP are re-exported here (``CacheBudgetSpec``,
``SplitEval``, ``evaluate_split``, ``popularity_activation``, ``SplitProblem``,
``solve_split``, ``brute_force_split``).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from perfmodel.cache.hitrate import popularity_activation
from perfmodel.cache.offload import penalized_table
from perfmodel.cache.serving import (
    OBJECTIVES,
    BudgetContext,
    CacheBudgetSpec,
    EngineEval,
    budget_context,
    evaluate_engine,
    offloaded_experts,
)
from perfmodel.cache.split import SplitEval, adapter_hit_ratio, combine, evaluate_split
from perfmodel.errors import InfeasibleError
from perfmodel.sim.simulate import SimResult
from perfmodel.units import MS_PER_S, GiB, MiB
from solvers.cache.milp import SplitProblem, SplitSolution, brute_force_split, solve_split

__all__ = [
    "OBJECTIVES",
    "CacheBudgetSpec",
    "CachePlan",
    "SplitEval",
    "SplitProblem",
    "SplitSolution",
    "brute_force_split",
    "evaluate_split",
    "plan_cache_budget",
    "popularity_activation",
    "simulate_plan",
    "solve_split",
]

Arr = NDArray[np.float64]


@dataclass(frozen=True)
class Levels:
    """Pool names, level sizes (bytes / experts per layer / adapters) and level bytes."""

    pools: tuple[str, ...]
    sizes: tuple[Arr, ...]
    nbytes: tuple[Arr, ...]

    def index(self, pool: str) -> int:
        return self.pools.index(pool)


def grid_levels(ctx: BudgetContext) -> Levels:
    """The discrete levels of every pool (module docstring)."""
    spec, m = ctx.spec, ctx.spec.model
    names, sizes, nbytes = ["kv"], [], []
    caps = np.zeros(1)
    if spec.offload_experts and m.moe is not None:
        caps = np.unique(
            np.round(np.linspace(m.moe.top_k, m.moe.num_experts, spec.expert_levels))
        ).astype(float)
    a_min = ctx.adapter_bytes if spec.adapters else 0.0
    kv = np.linspace(
        ctx.kv_min_bytes, ctx.pool_budget_bytes - ctx.e_min_bytes - a_min, spec.kv_levels
    )
    kv = np.unique(np.maximum(np.floor(kv / MiB) * MiB, ctx.kv_min_bytes))  # whole MiB
    sizes.append(kv)
    nbytes.append(kv)
    if spec.offload_experts:
        names.append("experts")
        sizes.append(caps)
        nbytes.append(m.n_moe_layers * caps * ctx.expert_bytes)
    if spec.adapters:
        k = np.unique(
            np.round(np.geomspace(1, spec.adapters, min(spec.adapter_levels, spec.adapters)))
        ).astype(float)
        names.append("adapters")
        sizes.append(k)
        nbytes.append(k * ctx.adapter_bytes)
    return Levels(tuple(names), tuple(sizes), tuple(nbytes))


@dataclass(frozen=True)
class CachePlan:
    """The chosen split, why, and what one more GiB in each pool would buy."""

    feasible: bool
    objective_kind: str
    objective: float
    usable_bytes: float
    weights_bytes: float
    reserve_bytes: float
    pool_budget_bytes: float
    split_bytes: dict[str, float]
    kv_capacity_tokens: int
    expert_capacity: float
    adapters_resident: float
    evaluation: SplitEval | None
    binding_resource: str
    marginal_per_gib: dict[str, float]  # objective change per extra GiB in the pool
    marginal_service_rate_per_gib: dict[str, float]  # change of μ (req/s) per extra GiB
    solver: str
    explanation: str
    grid_pools: tuple[str, ...]
    grid_sizes: tuple[Arr, ...]
    grid_evals: tuple[SplitEval | None, ...]  # row-major over the grid; None = over budget

    def to_dict(self) -> dict[str, Any]:
        """The JSON of ``perfmodel cache plan``: sizes in GiB, times in ms."""
        out: dict[str, Any] = {
            "feasible": self.feasible,
            "objective": self.objective_kind,
            "objective_value": self.objective,
            "explanation": self.explanation,
            "usable_gib": self.usable_bytes / GiB,
            "weights_gib": self.weights_bytes / GiB,
            "activation_reserve_gib": self.reserve_bytes / GiB,
            "pool_budget_gib": self.pool_budget_bytes / GiB,
            "split_gib": {k: v / GiB for k, v in self.split_bytes.items()},
            "kv_capacity_tokens": self.kv_capacity_tokens,
            "experts_cached_per_layer": self.expert_capacity,
            "adapters_resident": self.adapters_resident,
            "binding_resource": self.binding_resource,
            "marginal_objective_per_gib": self.marginal_per_gib,
            "marginal_service_rate_per_s_per_gib": self.marginal_service_rate_per_gib,
            "solver": self.solver,
        }
        ev = self.evaluation
        if ev is not None:
            out["at_rate"] = {
                "stable": ev.stable,
                "service_rate_per_s": ev.service_rate_per_s,
                "bound": ev.binding,
                "utilization": ev.utilization,
                "tpot_mean_ms": ev.tpot_mean_s * MS_PER_S,
                "tpot_quantile_ms": ev.tpot_quantile_s * MS_PER_S,
                "ttft_quantile_ms": ev.ttft_quantile_s * MS_PER_S,
                "slo_attainment": ev.attainment,
                "slo_goodput_per_s": ev.slo_goodput_per_s,
                "expert_misses_per_step": ev.expert_misses_per_step,
                "expert_fetch_ms_per_step": ev.expert_penalty_s * MS_PER_S,
                "adapter_hit_ratio": ev.adapter_hit_ratio,
                "adapter_load_ms": ev.adapter_load_s * MS_PER_S,
            }
        return out


def plan_cache_budget(
    spec: CacheBudgetSpec, *, time_limit_s: float = 20.0, progress: object = None
) -> CachePlan:
    """Solve the split MILP over the grid and explain the result."""
    ctx = budget_context(spec)
    lv = grid_levels(ctx)
    kv_b = lv.nbytes[0]
    ex_b = lv.nbytes[1] if spec.offload_experts else np.zeros(1)
    caps = lv.sizes[1] if spec.offload_experts else np.zeros(1)
    ad_k = lv.sizes[-1] if spec.adapters else np.zeros(1)
    ad_b = lv.nbytes[-1] if spec.adapters else np.zeros(1)
    engines: list[tuple[int, int]] = []
    evals: dict[tuple[int, int], EngineEval] = {}
    for a, b in itertools.product(range(kv_b.size), range(ex_b.size)):
        if kv_b[a] + ex_b[b] + ad_b[0] <= ctx.pool_budget_bytes:  # others are never evaluated
            engines.append((a, b))
            evals[a, b] = evaluate_engine(ctx, float(kv_b[a]), float(caps[b]))
        if callable(progress):
            progress(1)
    hits = np.array([adapter_hit_ratio(ctx, float(k)) for k in ad_k])
    kind, lam = spec.objective, spec.rate_per_s
    ee = [evals[e] for e in engines]
    gamma = np.array([e.attainment_hit for e in ee])
    delta = np.array([e.attainment_per_miss for e in ee])
    if kind == "goodput":
        value = lam * gamma + np.array([e.tie_break(kind) for e in ee])
        per_miss = lam * delta
    else:
        tpot = np.array([e.latency.tpot_mean_s if e.latency else math.inf for e in ee])
        value = np.where(np.isfinite(tpot), -tpot, 0.0) + [e.tie_break(kind) for e in ee]
        per_miss = np.zeros(len(ee))
    problem = SplitProblem(
        engine_bytes=np.array([kv_b[a] + ex_b[b] for a, b in engines]),
        engine_ok=np.array([e.stable for e in ee], dtype=bool),
        value=value,
        value_per_miss=per_miss,
        attain=gamma,
        attain_per_miss=delta,
        adapter_bytes=ad_b,
        adapter_miss=1.0 - hits,
        goal=spec.slo.goal,
        budget_bytes=ctx.pool_budget_bytes,
    )
    sol = solve_split(problem, time_limit_s=time_limit_s)
    grid = _grid_evals(ctx, lv, evals, hits)
    common = dict(
        objective_kind=kind,
        usable_bytes=ctx.usable_bytes,
        weights_bytes=ctx.weights_bytes,
        reserve_bytes=ctx.reserve_bytes,
        pool_budget_bytes=ctx.pool_budget_bytes,
        solver=sol.solver,
        grid_pools=lv.pools,
        grid_sizes=lv.sizes,
        grid_evals=grid,
    )
    if not sol.feasible or sol.engine is None or sol.adapter is None:
        return CachePlan(
            feasible=False,
            objective=-math.inf,
            split_bytes={},
            kv_capacity_tokens=0,
            expert_capacity=0.0,
            adapters_resident=0.0,
            evaluation=None,
            binding_resource="none",
            marginal_per_gib={},
            marginal_service_rate_per_gib={},
            explanation=_infeasible_reason(spec, [g for g in grid if g is not None]),
            **common,  # type: ignore[arg-type]
        )
    a, b = engines[sol.engine]
    chosen = {"kv": float(kv_b[a]), "experts": float(caps[b]), "adapters": float(ad_k[sol.adapter])}
    split = {"kv": float(kv_b[a])}
    if spec.offload_experts:
        split["experts"] = float(ex_b[b])
    if spec.adapters:
        split["adapters"] = float(ad_b[sol.adapter])
    ev = combine(ctx, evals[a, b], chosen["adapters"], float(hits[sol.adapter]))
    marg, marg_mu = _marginals(ctx, chosen, ev)
    return CachePlan(
        feasible=True,
        split_bytes={**split, "unallocated": ctx.pool_budget_bytes - sum(split.values())},
        kv_capacity_tokens=evals[a, b].kv_capacity_tokens,
        expert_capacity=chosen["experts"],
        adapters_resident=chosen["adapters"],
        evaluation=ev,
        binding_resource=_binding(marg, marg_mu, ev, kind),
        marginal_per_gib=marg,
        marginal_service_rate_per_gib=marg_mu,
        objective=ev.objective(kind),
        explanation=ev.explanation,
        **common,  # type: ignore[arg-type]
    )


def _grid_evals(
    ctx: BudgetContext, lv: Levels, evals: dict[tuple[int, int], EngineEval], hits: Arr
) -> tuple[SplitEval | None, ...]:
    """Every split of the grid (row-major over the pools), None when over the budget."""
    spec = ctx.spec
    out: list[SplitEval | None] = []
    for c in itertools.product(*(range(s.size) for s in lv.sizes)):
        eng = evals.get((c[0], c[1] if spec.offload_experts else 0))
        used = sum(float(nb[i]) for nb, i in zip(lv.nbytes, c, strict=True))
        if eng is None or used > ctx.pool_budget_bytes:
            out.append(None)
            continue
        j = c[-1] if spec.adapters else 0
        k = float(lv.sizes[-1][j]) if spec.adapters else 0.0
        out.append(combine(ctx, eng, k, float(hits[j])))
    return tuple(out)


def _marginals(
    ctx: BudgetContext, chosen: dict[str, float], ev: SplitEval
) -> tuple[dict[str, float], dict[str, float]]:
    """Objective and μ change per extra GiB in each pool, the others fixed (continuous)."""
    spec, m = ctx.spec, ctx.spec.model
    kv, cap, res = chosen["kv"], chosen["experts"], chosen["adapters"]
    grown = {"kv": (kv + GiB, cap, res)}
    if spec.offload_experts and m.moe is not None:
        c2 = min(cap + GiB / (m.n_moe_layers * ctx.expert_bytes), m.moe.num_experts)
        grown["experts"] = (kv, c2, res)
    if spec.adapters:
        grown["adapters"] = (kv, cap, min(res + GiB / ctx.adapter_bytes, spec.adapters))
    obj, mu = {}, {}
    for pool, (k, c, r) in grown.items():
        up = evaluate_split(spec, kv_bytes=k, expert_capacity=c, adapters_resident=r, ctx=ctx)
        d = up.objective(spec.objective) - ev.objective(spec.objective)
        obj[pool] = float(d) if math.isfinite(d) else 0.0
        mu[pool] = float(up.service_rate_per_s - ev.service_rate_per_s)
    return obj, mu


def _binding(obj: dict[str, float], mu: dict[str, float], ev: SplitEval, kind: str) -> str:
    """The pool whose next GiB helps most: by the objective, else by the service rate."""
    ref = (abs(ev.objective(kind)), ev.service_rate_per_s)
    for (vals, what), r in zip(((obj, "objective"), (mu, "service rate")), ref, strict=True):
        best = max(vals, key=lambda k: vals[k])
        if vals[best] > 1e-6 * max(r, 1e-12):
            return f"{best} (largest {what} gain per GiB)"
    return f"none of the pools: the instance is {ev.binding}-bound and more memory does not help"


def _infeasible_reason(spec: CacheBudgetSpec, inside: list[SplitEval]) -> str:
    if not inside:
        return "no combination of pool levels fits the memory budget"
    stable = [e for e in inside if e.stable]
    if not stable:
        mu = max(e.service_rate_per_s for e in inside)
        return (
            f"no split is stable at {spec.rate_per_s:g} req/s: the best service rate on the grid "
            f"is {mu:.3g} req/s; lower the rate or add devices"
        )
    best = max(stable, key=lambda e: e.attainment)
    return (
        f"every stable split within the budget misses the SLO goal {spec.slo.goal:.0%}: best "
        f"attainment {best.attainment:.1%} (p{spec.slo.percentile * 100:g} TTFT "
        f"{best.ttft_quantile_s * MS_PER_S:.0f} ms, "
        f"TPOT {best.tpot_quantile_s * MS_PER_S:.1f} ms); relax "
        "the SLO or lower the rate"
    )


def simulate_plan(
    spec: CacheBudgetSpec, plan: CachePlan, *, n_requests: int = 2000, seed: int = 0
) -> SimResult:
    """Run :mod:`perfmodel.simulate` on the plan's KV capacity at ``spec.rate_per_s``.

    With offloaded experts every iteration of ``T`` tokens also pays the fetches of
    :func:`perfmodel.offload_queueing.penalized_table`. Adapter loads are not simulated
    (they only delay the first token of the requests that miss).
    """
    from dataclasses import replace

    from perfmodel.sim.simulate import make_setup, simulate_workload

    if not plan.feasible:
        raise InfeasibleError("the plan is infeasible; there is nothing to simulate")
    setup = make_setup(
        spec.instance,
        kv_capacity_tokens=plan.kv_capacity_tokens,
        max_batched_tokens=spec.max_batched_tokens,
    )
    off = offloaded_experts(budget_context(spec), plan.expert_capacity)
    if off is not None:
        setup = replace(setup, table=penalized_table(setup.table, off))
    return simulate_workload(
        setup,
        spec.workload.lengths,
        spec.workload.arrivals(spec.rate_per_s),
        n_requests=n_requests,
        seed=seed,
    )
