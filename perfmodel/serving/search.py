"""The one search for "the largest rate meeting a criterion" (goodput, PD phases, simulation),
and the one for "the latency a CDF reaches a percentile at" (:func:`cdf_quantile`).

Every goodput in the project is this bisection over a monotone predicate: ``ok(rate)``
true at low load and false above a threshold (SLO attainment falls as the rate rises).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

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


@dataclass
class FalsePosition:
    """A bracket ``[lo, hi]`` of the root of an increasing ``f`` (``f(lo) < 0 ≤ f(hi)``;
    a value is None until known), closed by Illinois false-position steps (a stale end's
    value is halved) aimed ``STRADDLE·tol`` past the root estimate on the side that did
    not move last: when the estimate is good, the next point lands on the other side and
    the bracket closes to ``tol``. The goodput search and :func:`cdf_quantile` use it."""

    lo: float
    hi: float
    f_lo: float | None = None
    f_hi: float | None = None
    side: int = 0  # −1: lo moved last, +1: hi moved last

    def point(self, tol: float, *, secant: bool = True) -> float:
        """The next point: false position if ``secant`` and both values are known, else
        the midpoint; at least ``tol/2`` inside the bracket."""
        lo, hi, f_lo, f_hi = self.lo, self.hi, self.f_lo, self.f_hi
        if not (secant and f_lo is not None and f_hi is not None and f_hi > f_lo):
            return 0.5 * (lo + hi)
        r = lo + (hi - lo) * (-f_lo) / (f_hi - f_lo) - STRADDLE * tol * self.side
        return min(max(r, lo + 0.5 * tol), hi - 0.5 * tol)

    def update(self, r: float, f: float) -> None:
        """``f = f(r)``: ``r`` becomes the low end if ``f < 0``, else the high end."""
        if f < 0:
            self.lo, self.f_lo = r, f
            if self.side == -1 and self.f_hi is not None:
                self.f_hi *= 0.5
            self.side = -1
        else:
            self.hi, self.f_hi = r, f
            if self.side == 1 and self.f_lo is not None:
                self.f_lo *= 0.5
            self.side = 1


#: of the tolerance: how far past the root estimate a false-position step aims
STRADDLE = 0.4


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

    Halving the bracket costs one CDF evaluation per bit; once both ends' values are
    known, :class:`FalsePosition` steps on ``cdf − q`` close it in a few (a CDF is smooth
    between its atoms). Where it is not (an atom's jump, a kink), the bracket is halved
    whenever three steps have not halved it.
    """
    width0 = hi - lo
    b = FalsePosition(lo, hi)
    widths = [width0] * 3  # the bracket's width over the last three steps
    for _ in range(2 * iterations + 8):
        tol = max(width0 * 0.5**iterations, rel_tol * b.hi, 4e-16 * abs(b.hi))
        if b.hi - b.lo <= tol:
            break
        r = b.point(tol, secant=2 * (b.hi - b.lo) <= widths[0])
        widths = [*widths[1:], b.hi - b.lo]
        b.update(r, cdf(r) - q)
    return b.hi
