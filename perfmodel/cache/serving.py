"""The serving model of one split of device memory: stability, TTFT/TPOT and SLO attainment.

The budget is ``HBM · utilization − resident weights − activation reserve``; a split
gives the KV cache ``kv_bytes`` (sets ``M``), an offloaded-expert cache ``C`` experts per
MoE layer, and ``K`` resident LoRA adapters. At the arrival rate ``λ``:

* the *engine* (KV, experts) is the queueing layer's instance
  (:func:`perfmodel.queueing.service_rate` at ``M``), slowed by the fetches of missed
  experts when they are offloaded (:mod:`perfmodel.offload_queueing`): its stability
  ``λ < μ``, TPOT and TTFT distributions;
* the *adapters* add one adapter fetch (:func:`perfmodel.paging.adapter_paging`) to the
  TTFT of the requests whose adapter is not resident (miss ratio ``m(K)``, Che/LRU or
  static top-K under Zipf popularity).

SLO attainment, with ``τ_t, τ_p`` the TTFT/TPOT targets and ``t_load`` one adapter fetch::

    att = P(TPOT ≤ τ_p)·[(1 − m)·P(TTFT ≤ τ_t) + m·P(TTFT ≤ τ_t − t_load)]
        = γ − δ·m,   γ = P(TPOT ≤ τ_p)·P(TTFT ≤ τ_t),
                     δ = P(TPOT ≤ τ_p)·[P(TTFT ≤ τ_t) − P(TTFT ≤ τ_t − t_load)]

(independence of TTFT and TPOT, as in :func:`perfmodel.queueing.slo_attainment`).
``γ`` and ``δ`` depend on the engine only and ``m`` on the adapters only, which the
split MILP (:mod:`solvers.cache_milp`) exploits. SLO goodput is ``λ·att``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from hardware.device import Device, Link
from hardware.engine import Engine
from perfmodel.cache.footprint import (
    DEFAULT_LORA_TARGETS,
    expert_bytes,
    lora_adapter_bytes,
    weight_footprint,
)
from perfmodel.cache.offload import OffloadLatency, offload_latency, slowed_service_rate
from perfmodel.cache.paging import OffloadedExperts, expert_fetch, fetch_time_s
from perfmodel.errors import InfeasibleError, SpecError
from perfmodel.memory import (
    DEFAULT_GPU_MEMORY_UTILIZATION,
    DEFAULT_MAX_BATCHED_TOKENS,
    activation_reserve_bytes,
    kv_bytes_per_token_per_device,
)
from perfmodel.model import ModelSpec
from perfmodel.plan import ParallelPlan
from perfmodel.serving.service import ServiceRate, service_rate, stability
from perfmodel.step.instance import Instance
from perfmodel.units import GiB
from perfmodel.workload.arrivals import check_rate
from perfmodel.workload.popularity import zipf_popularity
from perfmodel.workload.presets import Workload
from perfmodel.workload.slo import SLO

Arr = NDArray[np.float64]
OBJECTIVES = ("goodput", "tpot")


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
    # the serving engine: its kernel efficiencies and host overheads cost every iteration
    # (None: the engine-less roofline); the memory split is this planner's own question,
    # so the budget stays ``budget_bytes`` / ``gpu_memory_utilization``
    engine: Engine | None = field(default=None, compare=False)

    @property
    def instance(self) -> Instance:
        """The instance every iteration of this spec is costed on."""
        return Instance(self.model, self.device, self.plan, engine=self.engine)

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
class BudgetContext:
    """What every split of one spec shares: the budget and the per-unit sizes."""

    spec: CacheBudgetSpec
    pool_budget_bytes: float
    weights_bytes: float
    reserve_bytes: float
    usable_bytes: float
    kv_bytes_per_token: float
    kv_min_bytes: float  # the longest request
    e_min_bytes: float  # top_k experts per MoE layer (0 when not offloading)
    expert_bytes: float  # one cached expert on this device
    adapter_bytes: float
    adapter_load_s: float  # one adapter fetched on a miss
    activation: Arr | None
    adapter_popularity: Arr | None


def budget_context(spec: CacheBudgetSpec) -> BudgetContext:
    """The pool budget and unit sizes; raises when even the smallest split cannot fit."""
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
    e_bytes, act, e_min = 0.0, None, 0.0
    if spec.offload_experts and m.moe is not None:
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
    a_bytes, load, pop = 0.0, 0.0, None
    if spec.adapters:
        a_bytes = lora_adapter_bytes(m, spec.adapter_rank, targets=spec.adapter_targets, tp=plan.tp)
        if a_bytes > pool - kv_min - e_min:
            raise InfeasibleError(
                f"one rank-{spec.adapter_rank} adapter ({a_bytes / GiB:.2f} GiB) cannot fit even "
                f"alone: {max(pool - kv_min - e_min, 0) / GiB:.2f} GiB remain after the minimum "
                "KV and expert cache; lower --adapter-rank or use more devices"
            )
        pop = zipf_popularity(spec.adapters, spec.adapter_zipf)
        load = fetch_time_s(a_bytes, spec.device, source=spec.adapter_source, nvme=spec.nvme)
    return BudgetContext(
        spec=spec,
        pool_budget_bytes=pool,
        weights_bytes=wf.resident_bytes,
        reserve_bytes=reserve,
        usable_bytes=usable,
        kv_bytes_per_token=kv_tok,
        kv_min_bytes=kv_min,
        e_min_bytes=e_min,
        expert_bytes=e_bytes,
        adapter_bytes=a_bytes,
        adapter_load_s=load,
        activation=act,
        adapter_popularity=pop,
    )


def offloaded_experts(ctx: BudgetContext, capacity: float) -> OffloadedExperts | None:
    """The expert cache of ``capacity`` experts per layer (None when not offloading)."""
    spec = ctx.spec
    if not spec.offload_experts or ctx.activation is None:
        return None
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


@dataclass(frozen=True)
class EngineEval:
    """The (KV, expert cache) part of a split at the arrival rate."""

    kv_bytes: float
    kv_capacity_tokens: int
    expert_capacity: float
    service: ServiceRate | None  # None: the longest request does not fit
    stable: bool
    utilization: float
    latency: OffloadLatency | None
    tpot_attainment: float  # P(TPOT ≤ τ_p)
    ttft_attainment: float  # P(TTFT ≤ τ_t)
    ttft_attainment_on_miss: float  # P(TTFT ≤ τ_t − t_load)
    explanation: str

    @property
    def attainment_hit(self) -> float:
        """``γ``: attainment when every adapter is resident."""
        return self.tpot_attainment * self.ttft_attainment

    @property
    def attainment_per_miss(self) -> float:
        """``δ``: attainment lost per unit of adapter miss ratio (≥ 0)."""
        return self.tpot_attainment * max(self.ttft_attainment - self.ttft_attainment_on_miss, 0.0)

    def tie_break(self, kind: str) -> float:
        """A small bonus for the stability margin ``1 − λ/μ`` (ties between equal splits)."""
        if not self.stable or self.latency is None:
            return 0.0
        scale = self.latency.rate_per_s if kind == "goodput" else self.latency.tpot_mean_s
        return 1e-4 * scale * (1.0 - self.utilization)


def evaluate_engine(ctx: BudgetContext, kv_bytes: float, capacity: float) -> EngineEval:
    """Stability and latency of the engine with ``kv_bytes`` of KV and ``capacity`` experts."""
    spec, lam, slo = ctx.spec, ctx.spec.rate_per_s, ctx.spec.slo
    M = int(kv_bytes // ctx.kv_bytes_per_token)
    need = spec.workload.lengths.max_total_tokens
    if need > M:
        why = f"unstable: the KV cache ({M} tokens) cannot hold the longest request ({need} tokens)"
        return EngineEval(kv_bytes, M, capacity, None, False, math.inf, None, 0.0, 0.0, 0.0, why)
    base = service_rate(
        spec.instance,
        spec.workload,
        kv_capacity_tokens=M,
        max_batched_tokens=spec.max_batched_tokens,
    )
    off = offloaded_experts(ctx, capacity)
    sr = slowed_service_rate(base, off)
    st = stability(sr, lam)
    if not st.stable:
        return EngineEval(
            kv_bytes, M, capacity, sr, False, st.utilization, None, 0.0, 0.0, 0.0, st.explanation
        )
    lat = offload_latency(base, off, lam)
    if not lat.stable:
        why = (
            f"unstable: with the expert fetches the engine has no steady iteration at "
            f"{lam:g} req/s (the unslowed engine saturates first); {st.explanation}"
        )
        return EngineEval(
            kv_bytes, M, capacity, sr, False, st.utilization, None, 0.0, 0.0, 0.0, why
        )
    return EngineEval(
        kv_bytes=kv_bytes,
        kv_capacity_tokens=M,
        expert_capacity=capacity,
        service=sr,
        stable=True,
        utilization=st.utilization,
        latency=lat,
        tpot_attainment=lat.tpot_cdf(slo.tpot_s),
        ttft_attainment=lat.ttft_cdf(slo.ttft_s),
        ttft_attainment_on_miss=lat.ttft_cdf(slo.ttft_s - ctx.adapter_load_s),
        explanation=st.explanation,
    )
