"""The one search for "the largest rate meeting a criterion" (goodput, PD phases, simulation),
and the one for "the latency a CDF reaches a percentile at" (:func:`cdf_quantile`).

Every goodput in the project is this bisection over a monotone predicate: ``ok(rate)``
true at low load and false above a threshold (SLO attainment falls as the rate rises).
"""

from __future__ import annotations

from collections.abc import Callable

#: Bisection steps at most; ~10 reach a relative tolerance of 1e-3.
MAX_ITERATIONS = 60


def max_rate(
    ok: Callable[[float], bool],
    hi: float,
    *,
    lo: float = 0.0,
    rel_tol: float = 1e-3,
    scale: float | None = None,
    max_iterations: int = MAX_ITERATIONS,
) -> float:
    """Largest rate in ``[lo, hi)`` with ``ok`` true, to ``rel_tol`` (``ok(lo)`` assumed true).

    The bracket is halved until ``hi − lo ≤ rel_tol · scale`` (``scale`` default: the
    current ``hi``); the returned ``lo`` always satisfied ``ok`` (or is the given ``lo``).
    """
    for _ in range(max_iterations):
        if hi - lo <= rel_tol * (hi if scale is None else scale):
            break
        mid = 0.5 * (lo + hi)
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo


def cdf_quantile(
    cdf: Callable[[float], float],
    q: float,
    lo: float,
    hi: float,
    *,
    iterations: int,
    rel_tol: float = 0.0,
) -> float:
    """Smallest ``x`` in ``(lo, hi]`` with ``cdf(x) ≥ q`` (``cdf(hi) ≥ q`` assumed): the upper
    end of the bracket after ``iterations`` halvings, or once ``hi − lo ≤ rel_tol·hi``."""
    for _ in range(iterations):
        if hi - lo <= rel_tol * hi:
            break
        mid = 0.5 * (lo + hi)
        if cdf(mid) < q:
            lo = mid
        else:
            hi = mid
    return hi
