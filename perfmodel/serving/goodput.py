"""SLO attainment, goodput (the largest rate meeting an attainment goal) and sizing.

Built on :mod:`perfmodel.serving.service` (service rate, stability, latency at a rate).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property, partial

from perfmodel.errors import InfeasibleError, SpecError
from perfmodel.serving.latency import LatencyEstimate
from perfmodel.serving.search import FalsePosition
from perfmodel.serving.service import ServiceRate, latency
from perfmodel.units import MS_PER_S
from perfmodel.workload.arrivals import check_rate
from perfmodel.workload.slo import SLO


@dataclass(frozen=True)
class Attainment:
    """SLO check at one rate (the percentiles are computed when first read: a goodput
    search needs only the attainment at most of the rates it tries)."""

    rate_per_s: float
    attainment: float  # P(TTFT ≤ target)·P(TPOT ≤ target) (independence approximation)
    meets_goal: bool
    estimate: LatencyEstimate = field(repr=False, compare=False)
    slo: SLO = field(repr=False, compare=False)

    @cached_property
    def ttft_quantile_s(self) -> float:
        """TTFT at ``slo.percentile``."""
        return self.estimate.ttft_quantile_s(self.slo.percentile)

    @cached_property
    def tpot_quantile_s(self) -> float:
        """TPOT at ``slo.percentile``."""
        return self.estimate.tpot_quantile_s(self.slo.percentile)

    @property
    def meets_percentiles(self) -> bool:
        return self.ttft_quantile_s <= self.slo.ttft_s and self.tpot_quantile_s <= self.slo.tpot_s


def slo_attainment(est: LatencyEstimate, slo: SLO) -> Attainment:
    """Fraction of requests meeting both targets, and the percentile check."""
    a = est.ttft_cdf(slo.ttft_s) * est.tpot_cdf(slo.tpot_s) if est.stable else 0.0
    return Attainment(
        rate_per_s=est.rate_per_s, attainment=a, meets_goal=a >= slo.goal, estimate=est, slo=slo
    )


@dataclass(frozen=True)
class Goodput:
    """Largest rate meeting the SLO goal; when none does, the best achievable."""

    feasible: bool
    rate_per_s: float  # 0 when infeasible
    per_device_rate_per_s: float
    slo: SLO
    at_goodput: Attainment | None
    explanation: str
    #: the SLO check at a vanishing rate, when first read (a search that started from a
    #: rate known to meet the goal did not need it)
    unloaded: Callable[[], Attainment] = field(repr=False, compare=False)

    @cached_property
    def low(self) -> Attainment:
        """The SLO check at a vanishing rate (``μ·10⁻⁴``; its percentiles are computed
        when first read)."""
        return self.unloaded()

    @property
    def best_attainment(self) -> float:
        """The attainment at a vanishing rate."""
        return self.low.attainment

    @property
    def best_ttft_quantile_s(self) -> float:
        """TTFT at ``slo.percentile`` at a vanishing rate."""
        return self.low.ttft_quantile_s

    @property
    def best_tpot_quantile_s(self) -> float:
        """TPOT at ``slo.percentile`` at a vanishing rate."""
        return self.low.tpot_quantile_s


class GoodputAtMost(Exception):
    """The goodput is proven at most ``bound_per_s`` (a rate that misses the SLO, or μ),
    below the ``ceiling`` the caller asked :func:`goodput` to stop at."""

    def __init__(self, bound_per_s: float) -> None:
        super().__init__(f"goodput below {bound_per_s:.6g} req/s")
        self.bound_per_s = bound_per_s


def goodput(
    service: ServiceRate,
    slo: SLO,
    *,
    rel_tol: float = 1e-3,
    low: Attainment | None = None,
    ceiling: float | None = None,
    known: Attainment | None = None,
) -> Goodput:
    """The largest rate in (0, μ) with attainment ≥ ``slo.goal``, to ``rel_tol·μ``.

    The bracket ``[μ·10⁻⁴, μ]`` is closed by Illinois false-position steps on
    ``g(λ) = ln(1 − A(λ)) − ln(1 − goal)`` (``A`` the attainment): the miss probability
    grows about exponentially with the rate, so ``g`` is nearly linear and 4-6 latency
    estimates close it where halving the bracket takes 10 (after ``_BISECT_AFTER``
    steps the bracket is halved). The guarantee is the bisection's: the answer meets the
    goal and a failing rate lies within ``rel_tol·μ`` above it (λ = μ is unstable: it fails
    without an estimate). Each estimate starts from the one at the bracket's low end
    (``warm``: the highest rate met so far, below every rate tried next). ``low``: the
    attainment at ``μ·10⁻⁴`` when the caller has it already (one at another rate is not
    used). ``ceiling``: raise :class:`GoodputAtMost` as soon as a rate at most this misses
    the SLO (the goodput cannot exceed it: a caller that only needs to know whether it
    does, the planner's dominance test, stops there). ``known``: the SLO check at a rate
    in ``(μ·10⁻⁴, μ)`` the caller has estimated already (``capacity``'s operating point):
    one end of the bracket — the low one when it meets the goal (the unloaded check is
    then not estimated unless read), else the high one. The guarantee is the same; the
    answer may move within the tolerance, as the search's path is another."""
    mu = service.rate_per_s
    lo = mu * 1e-4
    if known is not None and not lo < known.rate_per_s < mu:
        known = None
    if low is not None and low.rate_per_s != lo:
        low = None
    top = (mu, _miss(0.0, slo.goal))  # the bracket's high end: μ fails without an estimate
    if known is not None and known.meets_goal and service.largest_request_fits:
        best = known
        unloaded: Callable[[], Attainment] = (
            partial(_unloaded, service, slo, lo) if low is None else partial(_given, low)
        )
    else:
        best = low = low or _unloaded(service, slo, lo)
        unloaded = partial(_given, low)
    answer = partial(Goodput, slo=slo, unloaded=unloaded)
    if best is low:
        if not low.meets_goal or not service.largest_request_fits:
            return answer(
                feasible=False,
                rate_per_s=0.0,
                per_device_rate_per_s=0.0,
                at_goodput=None,
                explanation=_no_rate(low, slo),
            )
        if known is not None:  # a miss: the goodput is below it
            top = (known.rate_per_s, max(_miss(known.attainment, slo.goal), 1e-12))
    b = FalsePosition(best.rate_per_s, top[0], _miss(best.attainment, slo.goal), top[1])
    tol, steps = rel_tol * mu, 0
    while b.hi - b.lo > tol:
        if ceiling is not None and b.hi <= ceiling:
            raise GoodputAtMost(b.hi)
        r = b.point(tol, secant=steps < _BISECT_AFTER)
        steps += 1
        a = slo_attainment(latency(service, r, warm=best.estimate), slo)
        g = _miss(a.attainment, slo.goal)
        b.update(r, min(g, -1e-12) if a.meets_goal else max(g, 1e-12))
        best = a if a.meets_goal else best
    lo = b.lo
    return answer(
        feasible=True,
        rate_per_s=lo,
        per_device_rate_per_s=lo / service.devices,
        at_goodput=best,
        explanation=(
            f"goodput {lo:.3g} req/s per instance ({lo / mu:.0%} of μ); attainment "
            f"{best.attainment:.1%} there"
        ),
    )


def _unloaded(service: ServiceRate, slo: SLO, rate_per_s: float) -> Attainment:
    """The SLO check at the search's vanishing rate."""
    return slo_attainment(latency(service, rate_per_s), slo)


def _given(a: Attainment) -> Attainment:
    return a


_MISS_FLOOR = 1e-12  # 1 − A below this counts as this (ln of a miss probability)
_BISECT_AFTER = 6  # false-position steps before the bracket is halved instead


def _miss(attainment: float, goal: float) -> float:
    """``ln(1 − A) − ln(1 − goal)``: negative where the goal is met."""
    return math.log(max(1.0 - attainment, _MISS_FLOOR)) - math.log(1.0 - goal)


def _no_rate(low: Attainment, slo: SLO) -> str:
    """Why no rate meets the SLO: the attainment and percentiles when unloaded."""
    what = []
    if low.ttft_quantile_s > slo.ttft_s:
        what.append(f"p{slo.percentile * 100:g} TTFT {low.ttft_quantile_s * MS_PER_S:.1f} ms")
    if low.tpot_quantile_s > slo.tpot_s:
        what.append(f"p{slo.percentile * 100:g} TPOT {low.tpot_quantile_s * MS_PER_S:.2f} ms")
    return (
        f"no rate meets the SLO on this configuration: even unloaded, attainment is "
        f"{low.attainment:.1%} < goal {slo.goal:.0%}"
        + (f" (best achievable {', '.join(what)})" if what else "")
    )


@dataclass(frozen=True)
class Sizing:
    """Instances (each ``tp·pp`` devices) for an arrival rate."""

    rate_per_s: float
    instances: int  # recommended: meets target utilization (and goodput when given)
    devices: int
    necessary_instances: int  # smallest N with λ/N < μ
    guaranteed_instances: int  # Nie et al.'s sufficient N ≥ λ/(μ(1−δ)); 0 if δ ≥ 1
    utilization: float  # λ/(N·μ) at the recommendation
    limited_by: str  # "utilization" | "goodput"


def instances_needed(
    service: ServiceRate,
    rate_per_s: float,
    *,
    target_utilization: float = 0.8,
    goodput_per_instance_per_s: float | None = None,
) -> Sizing:
    """``N = ⌈λ / (ρ_target·μ)⌉``, raised to ``⌈λ/goodput⌉`` when a goodput is given.

    Replicas are independent (round-robin or join-shortest-queue load balancing), so N
    instances serve ``N·μ`` (Nie et al. §cluster sizing).
    """
    check_rate(rate_per_s)
    if not 0 < target_utilization <= 1:
        raise SpecError(f"target utilization must be in (0, 1], got {target_utilization}")
    mu = service.rate_per_s
    n_util = max(1, math.ceil(rate_per_s / (target_utilization * mu) - 1e-12))
    n, limited = n_util, "utilization"
    if goodput_per_instance_per_s is not None:
        if goodput_per_instance_per_s <= 0:
            raise InfeasibleError("the SLO cannot be met on this configuration at any rate")
        n_g = max(1, math.ceil(rate_per_s / goodput_per_instance_per_s - 1e-12))
        if n_g > n:
            n, limited = n_g, "goodput"
    g = service.guaranteed_rate_per_s
    return Sizing(
        rate_per_s=rate_per_s,
        instances=n,
        devices=n * service.devices,
        necessary_instances=math.floor(rate_per_s / mu) + 1,
        guaranteed_instances=math.ceil(rate_per_s / g - 1e-12) if g > 0 else 0,
        utilization=rate_per_s / (n * mu),
        limited_by=limited,
    )
