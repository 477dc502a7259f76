"""A cache budget split evaluated: the engine's service with a share of HBM for
resident adapters (their hit ratio and paging), the combined figures and the SLO
(:mod:`perfmodel.cache.serving` evaluates the KV/expert engine itself)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from perfmodel.cache.paging import adapter_paging
from perfmodel.cache.serving import (
    BudgetContext,
    CacheBudgetSpec,
    EngineEval,
    budget_context,
    evaluate_engine,
)

Arr = NDArray[np.float64]


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
    expert_penalty_s: float  # fetch time added to the mean iteration
    adapter_hit_ratio: float
    adapter_load_s: float
    explanation: str

    def objective(self, kind: str) -> float:
        return self.slo_goodput_per_s if kind == "goodput" else -self.tpot_mean_s


def adapter_hit_ratio(ctx: BudgetContext, resident: float) -> float:
    """Hit ratio of ``resident`` adapters (1 without adapters)."""
    spec = ctx.spec
    if not spec.adapters or ctx.adapter_popularity is None:
        return 1.0
    ap = adapter_paging(
        ctx.adapter_popularity,
        resident,
        ctx.adapter_bytes,
        spec.device,
        policy=spec.adapter_policy,
        source=spec.adapter_source,
        nvme=spec.nvme,
    )
    return ap.hit_ratio


def combine(ctx: BudgetContext, eng: EngineEval, resident: float, hit: float) -> SplitEval:
    """The split of engine ``eng`` with ``resident`` adapters of hit ratio ``hit``."""
    spec = ctx.spec
    sr, lat = eng.service, eng.latency
    mu = sr.rate_per_s if sr is not None else 0.0
    bound = sr.binding if sr is not None else "memory"
    if not eng.stable or lat is None:
        inf = math.inf
        return SplitEval(
            eng.kv_bytes, eng.expert_capacity, resident, False, mu, bound, eng.utilization,
            inf, inf, inf, 0.0, 0.0, 0.0, 0.0, hit, ctx.adapter_load_s, eng.explanation,
        )  # fmt: skip
    att = eng.attainment_hit - eng.attainment_per_miss * (1.0 - hit)
    q = spec.slo.percentile
    return SplitEval(
        kv_bytes=eng.kv_bytes,
        expert_capacity=eng.expert_capacity,
        adapters_resident=resident,
        stable=True,
        service_rate_per_s=mu,
        binding=bound,
        utilization=eng.utilization,
        tpot_mean_s=lat.tpot_mean_s,
        tpot_quantile_s=lat.tpot_quantile_s(q),
        ttft_quantile_s=lat.ttft_quantile_s(q),
        attainment=att,
        slo_goodput_per_s=spec.rate_per_s * att,
        expert_misses_per_step=lat.misses_per_step,
        expert_penalty_s=lat.fetch_s,
        adapter_hit_ratio=hit,
        adapter_load_s=ctx.adapter_load_s,
        explanation=eng.explanation,
    )


def evaluate_split(
    spec: CacheBudgetSpec,
    *,
    kv_bytes: float,
    expert_capacity: float = 0.0,
    adapters_resident: float = 0.0,
    ctx: BudgetContext | None = None,
) -> SplitEval:
    """Stability, latency and SLO attainment of one split (module docstring)."""
    c = ctx or budget_context(spec)
    eng = evaluate_engine(c, kv_bytes, expert_capacity)
    return combine(c, eng, adapters_resident, adapter_hit_ratio(c, adapters_resident))
