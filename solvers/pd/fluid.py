"""Rate-free optimum (fractional instances) and DistServe's one-node unit search."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from perfmodel.errors import InfeasibleError
from perfmodel.model import ModelSpec
from perfmodel.pd.config import PhaseGoodput
from perfmodel.pd.decode import DecodeProfile
from perfmodel.pd.prefill import PrefillProfile
from perfmodel.workload.slo import SLO
from solvers.pd.enumerate import PhaseOptions, ProfiledOptions, goodput_of


@dataclass(frozen=True)
class FluidOptimum:
    """Best goodput per GPU as λ → ∞ (instance counts fractional): DistServe's ratio."""

    prefill: PhaseGoodput
    decode: PhaseGoodput
    per_gpu_rate_per_s: float  # 1 / (tp_p/g_p + tp_d/g_d)
    instance_ratio: float  # prefill : decode instances = g_d / g_p
    gpu_ratio: float  # prefill : decode GPUs


def _pair(p: PhaseGoodput, d: PhaseGoodput) -> FluidOptimum:
    """A feasible prefill/decode pair's goodput per GPU with fractional instance counts."""
    gp = min(p.rate_per_s, p.link_capacity_per_s)
    gd = min(d.rate_per_s, d.link_capacity_per_s)
    a, b = p.config.gpus / gp, d.config.gpus / gd
    return FluidOptimum(p, d, 1.0 / (a + b), gd / gp, a / b)


def fluid_optimum(opts: PhaseOptions) -> FluidOptimum:
    """The pair maximizing goodput per GPU with fractional instance counts."""
    best: FluidOptimum | None = None
    for c in set(opts.prefill) & set(opts.decode):
        for p in opts.prefill[c]:
            for d in opts.decode[c]:
                if not (p.feasible and d.feasible):
                    continue
                best = _better(best, _pair(p, d))
    return _found(best)


def _better(best: FluidOptimum | None, f: FluidOptimum) -> FluidOptimum:
    return f if best is None or f.per_gpu_rate_per_s > best.per_gpu_rate_per_s else best


def _found(best: FluidOptimum | None) -> FluidOptimum:
    if best is None:
        raise InfeasibleError("no prefill/decode pair of configurations meets both SLOs")
    return best


def _bound(profile: PrefillProfile | DecodeProfile) -> float:
    """Above the goodput ``min(rate, link capacity)`` of a profile at any SLO: the
    bisections of :func:`perfmodel.pd.prefill.prefill_goodput` and
    :func:`perfmodel.pd.decode.decode_goodput` stay below their tops (the capacity, and
    1.05 × the decode capacity, itself below its Little's-law bound: no bisection for a
    decode class that loses), and the link capacity caps it too."""
    if isinstance(profile, PrefillProfile):
        return min(profile.capacity_rate_per_s, profile.link_capacity_per_s)
    link = 1.0 / profile.receive_s_mean if profile.receive_s_mean > 0 else math.inf
    return min(profile.capacity_bound_per_s * 1.05, link)


def fluid_best(
    po: ProfiledOptions, slo: SLO, *, model: ModelSpec, memo: dict[tuple[Any, ...], Any]
) -> FluidOptimum:
    """:func:`fluid_optimum` of the options at ``slo`` without the goodputs that cannot
    win: pairs in the order of an upper bound on their goodput per GPU (:func:`_bound` of
    both sides), each side's goodput computed (:func:`goodput_of`, memoized in ``memo``)
    only while the bound beats the best pair so far. The same best pair."""
    pairs = []
    for c in (c for c in po.decode if c in po.prefill):
        for pk, p in po.prefill[c]:
            for dk, d in po.decode[c]:
                up, ud = _bound(p), _bound(d)
                top = 1.0 / (p.config.gpus / up + d.config.gpus / ud) if up > 0 < ud else 0.0
                pairs.append((top, pk, p, dk, d))
    pairs.sort(key=lambda t: -t[0])
    best: FluidOptimum | None = None
    for top, pk, p, dk, d in pairs:
        if best is not None and top <= best.per_gpu_rate_per_s:
            break
        gp, gd = goodput_of(memo, pk, p, slo, model), goodput_of(memo, dk, d, slo, model)
        if gp.feasible and gd.feasible:
            best = _better(best, _pair(gp, gd))
    return _found(best)


@dataclass(frozen=True)
class UnitChoice:
    """DistServe's search inside one node: one prefill + one decode instance, replicated."""

    tp_prefill: int
    tp_decode: int
    per_gpu_rate_per_s: float
    prefill_goodput_per_s: float
    decode_goodput_per_s: float
    table: tuple[tuple[int, int, float], ...]  # every (tp_p, tp_d, per-GPU rate) tried


def distserve_unit_search(opts: PhaseOptions, *, gpus_per_node: int) -> UnitChoice:
    """``max min(g_p, g_d)/(tp_p + tp_d)`` over ``tp_p + tp_d ≤ gpus_per_node`` (PP = 1).

    DistServe's low-node-affinity placement (Alg. 2 with one pipeline stage): a prefill
    and a decode instance share a node and the unit is replicated.
    """
    rows = []
    best = None
    for c in opts.decode:
        for d in opts.decode[c]:
            for p in opts.prefill.get(c, []):
                tp_p, tp_d = p.config.gpus, d.config.gpus
                if tp_p + tp_d > gpus_per_node:
                    continue
                r = min(p.rate_per_s, d.rate_per_s) / (tp_p + tp_d)
                rows.append((tp_p, tp_d, r))
                if best is None or r > best[2]:
                    best = (tp_p, tp_d, r, p.rate_per_s, d.rate_per_s)
    if best is None:
        raise InfeasibleError(f"no prefill + decode pair fits in {gpus_per_node} GPUs")
    return UnitChoice(best[0], best[1], best[2], best[3], best[4], tuple(sorted(rows)))
