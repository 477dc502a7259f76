"""Split one device's memory among KV cache, an offloaded-expert cache and LoRA adapters.

The budget is ``HBM · utilization − resident weights − activation reserve``. Each pool
gets one of a few discrete levels:

* KV cache: ``n_kv`` sizes from one longest request to the whole budget (sets ``M``);
* expert cache (``offload_experts``): ``C`` experts per MoE layer from ``top_k`` to ``E``;
* adapters: ``K`` resident adapters from 1 to the catalog size ``N``.

Every (KV, expert) pair is evaluated with the queueing layer (:mod:`perfmodel.queueing`)
at the arrival rate ``λ``; expert misses add a per-iteration fetch time
(:class:`perfmodel.paging.OffloadedExperts`) to the full-budget and KV-full iterations
that set ``μ`` (re-using the Li–Dai–Peng and Nie–Si–Zhou rate formulas of
:mod:`perfmodel.classic_queues`) and to the mean iteration that sets TPOT; the request's
own prefill iterations carry it into TTFT. Adapter misses add one adapter fetch to the
TTFT of the requests that miss. SLO attainment is
``P(TPOT ≤ τ_p)·[(1 − m)·P(TTFT ≤ τ_t) + m·P(TTFT ≤ τ_t − t_load)]``.

The MILP (PuLP, HiGHS): one-hot level variables ``x_{p,l}``, one binary ``w_c`` per
admissible combination ``c`` (stable at ``λ`` and meeting the SLO goal) linked by
``Σ_{c ∋ (p,l)} w_c = x_{p,l}``, the memory knapsack ``Σ bytes_{p,l}·x_{p,l} ≤ budget``,
and objective ``max Σ value_c·w_c`` — SLO goodput ``λ·attainment`` (requests/s served
within the SLO) or ``−mean TPOT``. It is exact on the grid: the tests compare it with
brute force. The marginal value of one more GiB in a pool is the change of the
objective when that pool alone grows by 1 GiB (continuous evaluation).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field, fields, replace

import numpy as np
from numpy.typing import NDArray

from hardware.device import Device, Link
from perfmodel.classic_queues import nie_memory_rate_per_s, work_conserving_capacity_tokens_per_s
from perfmodel.errors import InfeasibleError, SolverError, SpecError
from perfmodel.footprint import (
    DEFAULT_LORA_TARGETS,
    expert_bytes,
    lora_adapter_bytes,
    weight_footprint,
)
from perfmodel.hitrate import inclusion_probabilities, zipf_popularity
from perfmodel.memory import (
    DEFAULT_GPU_MEMORY_UTILIZATION,
    DEFAULT_MAX_BATCHED_TOKENS,
    activation_reserve_bytes,
    kv_bytes_per_token_per_device,
)
from perfmodel.model import ModelSpec
from perfmodel.paging import OffloadedExperts, adapter_paging, expert_fetch, step_with_misses_s
from perfmodel.parallel import ParallelPlan
from perfmodel.queueing import ServiceRate, latency, service_rate, stability
from perfmodel.servemix import mix_batch
from perfmodel.simulate import SimResult
from perfmodel.step import step_time
from perfmodel.steptable import StepTable
from perfmodel.units import GiB, MiB
from perfmodel.workload import SLO, Workload, check_rate
from solvers.pulp_solver import pulp_solver

Arr = NDArray[np.float64]
OBJECTIVES = ("goodput", "tpot")
_BANNER_MUTED: list[bool] = []


# ---- the combinatorial core: one level per pool under a memory knapsack ----------------------


@dataclass(frozen=True)
class SplitProblem:
    """Levels per pool, and per combination of levels its value and admissibility."""

    pools: tuple[str, ...]
    level_bytes: tuple[Arr, ...]
    value: Arr  # shape = (levels of pool 0, levels of pool 1, ...); maximized
    admissible: NDArray[np.bool_]  # same shape
    budget_bytes: float

    def __post_init__(self) -> None:
        shape = tuple(len(b) for b in self.level_bytes)
        if len(self.pools) != len(shape) or not shape or min(shape) < 1:
            raise SpecError("a split problem needs at least one level for every pool")
        if np.shape(self.value) != shape or np.shape(self.admissible) != shape:
            raise SpecError(f"value and admissible must have shape {shape}")

    def combo_bytes(self, levels: tuple[int, ...]) -> float:
        return float(sum(b[i] for b, i in zip(self.level_bytes, levels, strict=True)))


@dataclass(frozen=True)
class SplitSolution:
    feasible: bool
    levels: tuple[int, ...] | None
    objective: float
    bytes_used: float
    solver: str
    message: str


def brute_force_split(problem: SplitProblem) -> SplitSolution:
    """Best admissible combination within the budget by enumeration (the reference)."""
    best: tuple[int, ...] | None = None
    for c in itertools.product(*(range(len(b)) for b in problem.level_bytes)):
        if not problem.admissible[c] or problem.combo_bytes(c) > problem.budget_bytes:
            continue
        if best is None or problem.value[c] > problem.value[best]:
            best = c
    if best is None:
        return SplitSolution(False, None, -math.inf, 0.0, "brute-force", "no admissible split")
    return SplitSolution(
        True, best, float(problem.value[best]), problem.combo_bytes(best), "brute-force", "optimal"
    )


def solve_split(problem: SplitProblem, *, time_limit_s: float = 20.0) -> SplitSolution:
    """The MILP of the module docstring; infeasibility is a result, not an exception."""
    import pulp

    combos = [
        c
        for c in itertools.product(*(range(len(b)) for b in problem.level_bytes))
        if problem.admissible[c]
    ]
    if not combos:
        return SplitSolution(False, None, -math.inf, 0.0, "milp", "no admissible split")
    prob = pulp.LpProblem("cache_budget", pulp.LpMaximize)

    def binary(name: str) -> pulp.LpVariable:
        if hasattr(prob, "add_variable"):  # PuLP >= 3.3; LpVariable(...) is deprecated there
            return prob.add_variable(name, cat="Binary")
        return pulp.LpVariable(name, cat="Binary")  # pragma: no cover

    x = {
        (p, i): binary(f"x_{name}_{i}")
        for p, name in enumerate(problem.pools)
        for i in range(len(problem.level_bytes[p]))
    }
    w = {c: binary("w_" + "_".join(map(str, c))) for c in combos}
    prob += pulp.lpSum(float(problem.value[c]) * w[c] for c in combos)
    for p, name in enumerate(problem.pools):
        n = len(problem.level_bytes[p])
        prob += pulp.lpSum(x[p, i] for i in range(n)) == 1, f"one_level_{name}"
        for i in range(n):
            prob += (
                pulp.lpSum(w[c] for c in combos if c[p] == i) == x[p, i],
                f"link_{name}_{i}",
            )
    scale = max(problem.budget_bytes, 1.0)  # bytes are ~1e10: keep the row well scaled
    prob += (
        pulp.lpSum(
            float(problem.level_bytes[p][i]) / scale * x[p, i]
            for p in range(len(problem.pools))
            for i in range(len(problem.level_bytes[p]))
        )
        <= problem.budget_bytes / scale + 1e-12,
        "memory_budget",
    )
    prob.solve(pulp_solver(time_limit_s)[0])
    status = pulp.LpStatus[prob.status]
    if status == "Infeasible":
        return SplitSolution(
            False, None, -math.inf, 0.0, "milp", "no admissible split fits the memory budget"
        )
    if status != "Optimal":
        raise SolverError(f"cache-budget MILP ended with status {status!r} (time limit?)")
    chosen = [c for c in combos if (w[c].value() or 0.0) > 0.5]
    if len(chosen) != 1:
        raise SolverError("cache-budget MILP returned a non-integral split")
    c = chosen[0]
    return SplitSolution(
        True, c, float(problem.value[c]), problem.combo_bytes(c), "milp", "optimal"
    )


# ---- the serving model of one split --------------------------------------------------------


@dataclass(frozen=True)
class CacheBudgetSpec:
    """What to serve, at which rate, and the pools to size."""

    model: ModelSpec
    device: Device
    plan: ParallelPlan
    workload: Workload
    rate_per_s: float
    slo: SLO
    objective: str = "goodput"
    max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    budget_bytes: float | None = None  # default: HBM · utilization
    # experts
    offload_experts: bool = False
    expert_cache_dtype: str = "bf16"
    expert_activation: Arr | None = None  # π per token (Σ = top_k); default: uniform
    expert_policy: str = "lru"
    low_precision_dtype: str | None = None
    low_fraction: float = 0.0
    prefetched: float = 0.0
    # adapters
    adapters: int = 0
    adapter_rank: int = 16
    adapter_targets: tuple[str, ...] = DEFAULT_LORA_TARGETS
    adapter_zipf: float = 1.0
    adapter_source: str = "host"
    adapter_policy: str = "lru"
    nvme: Link | None = None
    # grid
    kv_levels: int = 6
    expert_levels: int = 5
    adapter_levels: int = 5

    def __post_init__(self) -> None:
        check_rate(self.rate_per_s)
        if self.objective not in OBJECTIVES:
            raise SpecError(f"unknown objective {self.objective!r}; valid: {', '.join(OBJECTIVES)}")
        if self.offload_experts and self.model.moe is None:
            raise SpecError(f"{self.model.id} is dense: --offload-experts needs an MoE model")
        if self.adapters < 0:
            raise SpecError(f"number of adapters must be >= 0, got {self.adapters}")
        for name in ("kv_levels", "expert_levels", "adapter_levels"):
            if getattr(self, name) < 1:
                raise SpecError(f"{name} must be >= 1")
        cap = self.device.hbm_bytes
        if self.budget_bytes is not None and not 0 < self.budget_bytes <= cap:
            raise SpecError(
                f"memory budget {self.budget_bytes / GiB:.1f} GiB is not in (0, "
                f"{cap / GiB:.1f}] GiB, the capacity of one {self.device.id}; lower it"
            )


@dataclass(frozen=True)
class SplitEval:
    """One split at the arrival rate: stability, latency and SLO attainment."""

    kv_bytes: float
    expert_capacity: float  # experts per layer cached (0 when not offloading)
    adapters_resident: float
    stable: bool
    service_rate_per_s: float
    binding: str  # compute | memory (from the queueing layer)
    utilization: float
    tpot_mean_s: float
    tpot_quantile_s: float
    ttft_quantile_s: float  # without adapter loads
    attainment: float
    slo_goodput_per_s: float  # λ · attainment (0 when unstable)
    expert_misses_per_step: float
    expert_penalty_s: float  # added to the mean iteration
    adapter_hit_ratio: float
    adapter_load_s: float
    explanation: str

    def objective(self, kind: str) -> float:
        return self.slo_goodput_per_s if kind == "goodput" else -self.tpot_mean_s

    def score(self, kind: str) -> float:
        """The objective, ties broken towards the larger stability margin ``1 − λ/μ``."""
        scale = (
            self.slo_goodput_per_s / max(self.attainment, 1e-300)
            if kind == "goodput"
            else self.tpot_mean_s
        )
        return self.objective(kind) + 1e-4 * scale * (1.0 - self.utilization)


@dataclass(frozen=True)
class _Context:
    spec: CacheBudgetSpec
    pool_budget_bytes: float
    weights_bytes: float
    reserve_bytes: float
    usable_bytes: float
    kv_bytes_per_token: float
    kv_min_bytes: float
    expert_bytes: float  # one cached expert on this device
    adapter_bytes: float
    activation: Arr | None
    adapter_popularity: Arr | None


def _context(spec: CacheBudgetSpec) -> _Context:
    m, plan = spec.model, spec.plan
    usable = (
        spec.budget_bytes
        if spec.budget_bytes is not None
        else spec.device.hbm_bytes * spec.gpu_memory_utilization
    )
    wf = weight_footprint(m, plan, offload_experts=spec.offload_experts)
    reserve = activation_reserve_bytes(m, plan, spec.max_batched_tokens)
    pool = usable - wf.resident_bytes - reserve
    if pool <= 0:
        raise InfeasibleError(
            f"{m.id} on {plan.tp}x {spec.device.id}: weights ({wf.resident_bytes / GiB:.1f} GiB) "
            f"and activation reserve ({reserve / GiB:.1f} GiB) exceed the "
            f"{usable / GiB:.1f} GiB budget"
            + ("" if spec.offload_experts or m.moe is None else "; try --offload-experts")
        )
    kv_tok = kv_bytes_per_token_per_device(m, plan)
    kv_min = spec.workload.lengths.max_total_tokens * kv_tok
    e_bytes = act = None
    e_min = 0.0
    if spec.offload_experts:
        assert m.moe is not None
        e_bytes = expert_bytes(m, spec.expert_cache_dtype, tp=plan.tp)
        act = (
            np.full(m.moe.num_experts, m.moe.top_k / m.moe.num_experts)
            if spec.expert_activation is None
            else np.asarray(spec.expert_activation, dtype=np.float64)
        )
        if act.size != m.moe.num_experts:
            raise SpecError(
                f"expert popularity has {act.size} entries, {m.id} has {m.moe.num_experts} experts"
            )
        e_min = m.n_moe_layers * m.moe.top_k * e_bytes
    if kv_min + e_min > pool:
        raise InfeasibleError(
            f"the longest request's KV ({kv_min / GiB:.2f} GiB)"
            + (f" plus the smallest expert cache ({e_min / GiB:.2f} GiB)" if e_min else "")
            + f" does not fit in the {pool / GiB:.2f} GiB left after weights; use more "
            "devices (tp) or a smaller KV dtype"
        )
    a_bytes, pop = 0.0, None
    if spec.adapters:
        a_bytes = lora_adapter_bytes(m, spec.adapter_rank, targets=spec.adapter_targets, tp=plan.tp)
        if a_bytes > pool - kv_min - e_min:
            raise InfeasibleError(
                f"one rank-{spec.adapter_rank} adapter ({a_bytes / GiB:.2f} GiB) cannot fit even "
                f"alone: {max(pool - kv_min - e_min, 0) / GiB:.2f} GiB remain after the minimum "
                "KV and expert cache; lower --adapter-rank or use more devices"
            )
        pop = zipf_popularity(spec.adapters, spec.adapter_zipf)
    return _Context(
        spec,
        pool,
        wf.resident_bytes,
        reserve,
        usable,
        kv_tok,
        kv_min,
        e_bytes or 0.0,
        a_bytes,
        act,
        pop,
    )


@dataclass(frozen=True)
class _Instance:
    service: ServiceRate | None
    eval_base: dict[str, float] = field(default_factory=dict)


def evaluate_split(
    spec: CacheBudgetSpec,
    *,
    kv_bytes: float,
    expert_capacity: float = 0.0,
    adapters_resident: float = 0.0,
    _ctx: _Context | None = None,
) -> SplitEval:
    """Stability, latency and SLO attainment of one split (module docstring)."""
    ctx = _ctx or _context(spec)
    inst = _instance(ctx, kv_bytes, expert_capacity)
    return _with_adapters(ctx, inst, kv_bytes, expert_capacity, adapters_resident)


def _offload(ctx: _Context, capacity: float) -> OffloadedExperts | None:
    spec = ctx.spec
    if not spec.offload_experts:
        return None
    assert ctx.activation is not None
    low = (
        expert_bytes(spec.model, spec.low_precision_dtype, tp=spec.plan.tp)
        if spec.low_precision_dtype
        else None
    )
    fetch = expert_fetch(
        ctx.expert_bytes, spec.device.host_link, low_bytes=low, low_fraction=spec.low_fraction
    )
    return OffloadedExperts(
        ctx.activation,
        spec.model.n_moe_layers,
        capacity,
        spec.expert_policy,
        fetch,
        spec.prefetched,
    )


def _instance(ctx: _Context, kv_bytes: float, capacity: float) -> _Instance:
    spec = ctx.spec
    M = int(kv_bytes // ctx.kv_bytes_per_token)
    if spec.workload.lengths.max_total_tokens > M:
        return _Instance(None, {"M": M})
    sr = service_rate(
        spec.model,
        spec.device,
        spec.plan,
        spec.workload,
        kv_capacity_tokens=M,
        max_batched_tokens=spec.max_batched_tokens,
    )
    off = _offload(ctx, capacity)
    if off is not None:
        B, mo = sr.max_batched_tokens, sr.moments
        t_full = sr.full_step_s + off.penalty_s(B, sr.full_step_s)
        t_mem_tokens = min(B, M / mo.lifetime_kv_token_steps * mo.tokens)
        t_mem = sr.memory_step_s + off.penalty_s(t_mem_tokens, sr.memory_step_s)
        mu_c = work_conserving_capacity_tokens_per_s(B, t_full) / mo.tokens
        mu_m = nie_memory_rate_per_s(M, t_mem, mo.lifetime_kv_token_steps)
        mu = min(mu_c, mu_m)
        sr = replace(
            sr,
            rate_per_s=mu,
            compute_rate_per_s=mu_c,
            memory_rate_per_s=mu_m,
            binding="compute" if mu_c <= mu_m else "memory",
            guaranteed_rate_per_s=mu * max(0.0, 1.0 - sr.delta),
            full_step_s=t_full,
            memory_step_s=t_mem,
            capacity_tokens_per_s=B / t_full,
        )
    return _Instance(sr, {"M": M})


def _with_adapters(
    ctx: _Context, inst: _Instance, kv_bytes: float, capacity: float, resident: float
) -> SplitEval:
    spec, lam, slo = ctx.spec, ctx.spec.rate_per_s, ctx.spec.slo
    hit, load = 1.0, 0.0
    if spec.adapters:
        assert ctx.adapter_popularity is not None
        ap = adapter_paging(
            ctx.adapter_popularity,
            resident,
            ctx.adapter_bytes,
            spec.device,
            policy=spec.adapter_policy,
            source=spec.adapter_source,
            nvme=spec.nvme,
        )
        hit, load = ap.hit_ratio, ap.load_s
    sr = inst.service
    if sr is None:
        return SplitEval(
            kv_bytes,
            capacity,
            resident,
            False,
            0.0,
            "memory",
            math.inf,
            math.inf,
            math.inf,
            math.inf,
            0.0,
            0.0,
            0.0,
            0.0,
            hit,
            load,
            f"unstable: the KV cache ({inst.eval_base['M']} tokens) cannot hold the longest "
            f"request ({spec.workload.lengths.max_total_tokens} tokens)",
        )
    st = stability(sr, lam)
    if not st.stable:
        return SplitEval(
            kv_bytes,
            capacity,
            resident,
            False,
            sr.rate_per_s,
            sr.binding,
            st.utilization,
            math.inf,
            math.inf,
            math.inf,
            0.0,
            0.0,
            0.0,
            0.0,
            hit,
            load,
            st.explanation,
        )
    lat = latency(sr, lam)
    off = _offload(ctx, capacity)
    delta = misses = 0.0
    if off is not None:
        step = _penalized_mean_step_s(spec, sr, off, lat.step_s)
        misses = off.misses_per_step(lam * step * sr.moments.tokens)
        delta = step - lat.step_s
    shift = sr.moments.prefill_chunks * delta
    p_tpot = lat.tpot_cdf(slo.tpot_s - delta)
    miss = 1.0 - hit
    p_ttft = (1.0 - miss) * lat.ttft_cdf(slo.ttft_s - shift) + miss * lat.ttft_cdf(
        slo.ttft_s - shift - load
    )
    att = p_tpot * p_ttft
    return SplitEval(
        kv_bytes=kv_bytes,
        expert_capacity=capacity,
        adapters_resident=resident,
        stable=True,
        service_rate_per_s=sr.rate_per_s,
        binding=sr.binding,
        utilization=st.utilization,
        tpot_mean_s=lat.tpot_mean_s + delta,
        tpot_quantile_s=lat.tpot_quantile_s(slo.percentile) + delta,
        ttft_quantile_s=lat.ttft_quantile_s(slo.percentile) + shift,
        attainment=att,
        slo_goodput_per_s=lam * att,
        expert_misses_per_step=misses,
        expert_penalty_s=delta,
        adapter_hit_ratio=hit,
        adapter_load_s=load,
        explanation=st.explanation,
    )


def _penalized_mean_step_s(
    spec: CacheBudgetSpec, sr: ServiceRate, off: OffloadedExperts, base_s: float
) -> float:
    """Mean iteration ``b`` with expert fetches: the fixed point of
    ``b = t(mix(λ·b)) + penalty(λ·b·E[tokens])`` (``mix`` = :func:`perfmodel.servemix.mix_batch`,
    the average iteration when ``λ·b`` requests complete per iteration). The fetches
    lengthen every iteration, which grows the batch, which needs more experts. Bracketed by
    the full-budget iteration (``λ < μ`` puts the root below it).
    """
    from scipy.optimize import brentq

    lam, mo = spec.rate_per_s, sr.moments

    def gap(b: float) -> float:
        t = float(
            step_time(spec.model, spec.device, mix_batch(lam * b, mo), plan=spec.plan).total_s
        )
        return t + off.penalty_s(lam * b * mo.tokens, t) - b

    lo, hi = base_s * 1e-3, max(sr.full_step_s, base_s) * 1.5
    if gap(hi) > 0:  # no fixed point below the full budget: report the full iteration
        return hi
    return float(brentq(gap, lo, hi, xtol=1e-9, rtol=1e-6))


# ---- levels, the plan and its explanation ----------------------------------------------------


def _levels(ctx: _Context) -> tuple[tuple[str, ...], tuple[Arr, ...], tuple[Arr, ...]]:
    """Pool names, level sizes (experts per layer / adapters / bytes) and level bytes."""
    spec, m = ctx.spec, ctx.spec.model
    e_min = 0.0
    names, sizes, nbytes = ["kv"], [], []
    if spec.offload_experts:
        assert m.moe is not None
        caps = np.unique(
            np.round(np.linspace(m.moe.top_k, m.moe.num_experts, spec.expert_levels))
        ).astype(float)
        e_min = m.n_moe_layers * caps[0] * ctx.expert_bytes
    a_min = ctx.adapter_bytes if spec.adapters else 0.0
    kv = np.linspace(ctx.kv_min_bytes, ctx.pool_budget_bytes - e_min - a_min, spec.kv_levels)
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
    return tuple(names), tuple(sizes), tuple(nbytes)


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


def plan_cache_budget(
    spec: CacheBudgetSpec, *, time_limit_s: float = 20.0, progress: object = None
) -> CachePlan:
    """Solve the split MILP over the grid and explain the result."""
    ctx = _context(spec)
    pools, sizes, nbytes = _levels(ctx)
    shape = tuple(len(s) for s in sizes)
    n_exp = len(sizes[1]) if spec.offload_experts else 1
    a_min = float(nbytes[-1][0]) if spec.adapters else 0.0
    insts: dict[tuple[int, int], _Instance] = {}
    for a, b in itertools.product(range(shape[0]), range(n_exp)):
        cap = float(sizes[1][b]) if spec.offload_experts else 0.0
        used = nbytes[0][a] + (nbytes[1][b] if spec.offload_experts else 0.0) + a_min
        if used <= ctx.pool_budget_bytes:  # pairs over the budget are never evaluated
            insts[a, b] = _instance(ctx, float(sizes[0][a]), cap)
        if callable(progress):
            progress(1)
    evals: list[SplitEval | None] = []
    value = np.zeros(shape)
    ok = np.zeros(shape, dtype=bool)
    i_ad = pools.index("adapters") if spec.adapters else -1
    for c in itertools.product(*(range(n) for n in shape)):
        b = c[1] if spec.offload_experts else 0
        cap = float(sizes[1][b]) if spec.offload_experts else 0.0
        res = float(sizes[i_ad][c[i_ad]]) if spec.adapters else 0.0
        if (c[0], b) not in insts or problem_bytes(nbytes, c) > ctx.pool_budget_bytes:
            evals.append(None)
            continue
        ev = _with_adapters(ctx, insts[c[0], b], float(sizes[0][c[0]]), cap, res)
        evals.append(ev)
        value[c] = ev.score(spec.objective) if ev.stable else 0.0
        ok[c] = ev.stable and ev.attainment >= spec.slo.goal
    problem = SplitProblem(pools, nbytes, value, ok, ctx.pool_budget_bytes)
    sol = solve_split(problem, time_limit_s=time_limit_s)
    common = dict(
        objective_kind=spec.objective,
        usable_bytes=ctx.usable_bytes,
        weights_bytes=ctx.weights_bytes,
        reserve_bytes=ctx.reserve_bytes,
        pool_budget_bytes=ctx.pool_budget_bytes,
        solver=sol.solver,
        grid_pools=pools,
        grid_sizes=sizes,
        grid_evals=tuple(evals),
    )
    if not sol.feasible or sol.levels is None:
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
            explanation=_infeasible_reason(spec, evals),
            **common,  # type: ignore[arg-type]
        )
    lv = sol.levels
    split = {p: float(nbytes[i][lv[i]]) for i, p in enumerate(pools)}
    chosen = {p: float(sizes[i][lv[i]]) for i, p in enumerate(pools)}
    found = evals[int(np.ravel_multi_index(lv, shape))]
    if found is None:  # pragma: no cover - admissible combinations are always evaluated
        raise SolverError("the MILP chose a split that was not evaluated")
    ev = found
    marg, marg_mu = _marginals(ctx, chosen, ev)
    binding = _binding(marg, marg_mu, ev, spec.objective)
    free = ctx.pool_budget_bytes - sum(split.values())
    return CachePlan(
        feasible=True,
        split_bytes={**split, "unallocated": free},
        kv_capacity_tokens=int(chosen["kv"] // ctx.kv_bytes_per_token),
        expert_capacity=chosen.get("experts", 0.0),
        adapters_resident=chosen.get("adapters", 0.0),
        evaluation=ev,
        binding_resource=binding,
        marginal_per_gib=marg,
        marginal_service_rate_per_gib=marg_mu,
        objective=ev.objective(spec.objective),
        explanation=ev.explanation,
        **common,  # type: ignore[arg-type]
    )


def _marginals(
    ctx: _Context, chosen: dict[str, float], ev: SplitEval
) -> tuple[dict[str, float], dict[str, float]]:
    """Objective and μ change per extra GiB in each pool, the others fixed (continuous)."""
    spec, m = ctx.spec, ctx.spec.model
    kv, cap, res = chosen["kv"], chosen.get("experts", 0.0), chosen.get("adapters", 0.0)
    grown = {"kv": (kv + GiB, cap, res)}
    if spec.offload_experts and m.moe is not None:
        c2 = min(cap + GiB / (m.n_moe_layers * ctx.expert_bytes), m.moe.num_experts)
        grown["experts"] = (kv, c2, res)
    if spec.adapters:
        grown["adapters"] = (kv, cap, min(res + GiB / ctx.adapter_bytes, spec.adapters))
    obj, mu = {}, {}
    for pool, (k, c, r) in grown.items():
        up = evaluate_split(spec, kv_bytes=k, expert_capacity=c, adapters_resident=r, _ctx=ctx)
        d = up.objective(spec.objective) - ev.objective(spec.objective)
        obj[pool] = d if math.isfinite(d) else 0.0
        mu[pool] = up.service_rate_per_s - ev.service_rate_per_s
    return obj, mu


def _binding(obj: dict[str, float], mu: dict[str, float], ev: SplitEval, kind: str) -> str:
    """The pool whose next GiB helps most: by the objective, else by the service rate."""
    ref = (abs(ev.objective(kind)), ev.service_rate_per_s)
    for (vals, what), r in zip(((obj, "objective"), (mu, "service rate")), ref, strict=True):
        best = max(vals, key=lambda k: vals[k])
        if vals[best] > 1e-6 * max(r, 1e-12):
            return f"{best} (largest {what} gain per GiB)"
    return f"none of the pools: the instance is {ev.binding}-bound and more memory does not help"


def problem_bytes(nbytes: tuple[Arr, ...], levels: tuple[int, ...]) -> float:
    """Bytes of a combination of levels."""
    return float(sum(b[i] for b, i in zip(nbytes, levels, strict=True)))


def _infeasible_reason(spec: CacheBudgetSpec, evals: list[SplitEval | None]) -> str:
    inside = [e for e in evals if e is not None]
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
        f"{best.ttft_quantile_s * 1e3:.0f} ms, TPOT {best.tpot_quantile_s * 1e3:.1f} ms); relax "
        "the SLO or lower the rate"
    )


def popularity_activation(model: ModelSpec, zipf_exponent: float, *, seed: int = 0) -> Arr:
    """π per token for Zipf(``s``)-popular experts (ranks seeded-permuted, as in routing)."""
    from perfmodel.routing import expert_popularity

    if model.moe is None:
        raise SpecError(f"{model.id} is not a mixture-of-experts model")
    p = expert_popularity(model.moe.num_experts, dist="zipf", exponent=zipf_exponent, seed=seed)
    return inclusion_probabilities(p, model.moe.top_k)


# ---- discrete-event check of a plan ------------------------------------------------------------


def simulate_plan(
    spec: CacheBudgetSpec, plan: CachePlan, *, n_requests: int = 2000, seed: int = 0
) -> SimResult:
    """Run :mod:`perfmodel.simulate` on the plan's KV capacity at ``spec.rate_per_s``.

    With offloaded experts every iteration of ``T`` tokens also pays the fetch penalty
    of :class:`perfmodel.paging.OffloadedExperts` (tabulated over ``T``). Adapter loads
    are not simulated (they only delay the first token of the requests that miss).
    """
    from perfmodel.simulate import make_setup, simulate_workload

    if not plan.feasible:
        raise InfeasibleError("the plan is infeasible; there is nothing to simulate")
    setup = make_setup(
        spec.model,
        spec.device,
        spec.plan,
        kv_capacity_tokens=plan.kv_capacity_tokens,
        max_batched_tokens=spec.max_batched_tokens,
    )
    off = _offload(_context(spec), plan.expert_capacity)
    if off is not None:
        setup = replace(setup, table=_penalized(setup.table, off))
    return simulate_workload(
        setup,
        spec.workload.lengths,
        spec.workload.arrivals(spec.rate_per_s),
        n_requests=n_requests,
        seed=seed,
    )


@dataclass(frozen=True)
class _PenalizedTable(StepTable):
    """A step table whose iterations also fetch missed experts."""

    misses: Arr = field(default_factory=lambda: np.zeros(1))
    fetch_s: float = 0.0
    prefetched: float = 0.0

    def time_s(self, tokens: int, rows: int, *args: float, **kw: int) -> float:  # type: ignore[override]
        t = StepTable.time_s(self, tokens, rows, *args, **kw)
        if tokens <= 0:
            return t
        x = float(self.misses[min(tokens, self.misses.size - 1)]) * self.fetch_s
        return step_with_misses_s(t, x, prefetched=self.prefetched)


def _penalized(table: StepTable, off: OffloadedExperts) -> StepTable:
    base = {f.name: getattr(table, f.name) for f in fields(table)}
    return _PenalizedTable(
        **base,
        misses=off.miss_table(table.max_tokens),
        fetch_s=off.fetch.mean_s,
        prefetched=off.prefetched,
    )
