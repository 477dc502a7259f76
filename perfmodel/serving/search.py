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
    end of a bracket ``cdf(lo) < q ≤ cdf(hi)`` once it is no wider than ``iterations``
    halvings of the first one would leave, or ``rel_tol·hi`` (or a few ulps).

    Halving the bracket costs one CDF evaluation per bit. Once both ends' values are
    known, false-position steps on ``cdf − q`` (Illinois: a stale end's value is halved)
    aimed just past the root estimate, on the side that did not move last, close it in a
    few: a CDF is smooth between its atoms. Where it is not (an atom's jump, a kink), a
    halving is taken whenever two steps have not halved the bracket.
    """
    width0 = hi - lo
    f_lo: float | None = None
    f_hi: float | None = None
    side, widths = 0, [width0] * 3  # the bracket's width over the last three steps
    for _ in range(2 * iterations + 8):
        tol = max(width0 * 0.5**iterations, rel_tol * hi, 4e-16 * abs(hi))
        if hi - lo <= tol:
            break
        if f_lo is not None and f_hi is not None and f_hi > f_lo and 2 * (hi - lo) <= widths[0]:
            r = lo + (hi - lo) * (-f_lo) / (f_hi - f_lo) - 0.4 * tol * side
            r = min(max(r, lo + 0.5 * tol), hi - 0.5 * tol)
        else:
            r = 0.5 * (lo + hi)
        widths = [*widths[1:], hi - lo]
        f = cdf(r) - q
        if f < 0:
            lo, f_lo = r, f
            f_hi = None if f_hi is None else (0.5 * f_hi if side == -1 else f_hi)
            side = -1
        else:
            hi, f_hi = r, f
            f_lo = None if f_lo is None else (0.5 * f_lo if side == 1 else f_lo)
            side = 1
    return hi
