"""The tail of the prefill backlog (:mod:`perfmodel.serving.prefill_chain`): how many
budgets its grid needs.

Above ``B'`` the backlog is a random walk ``U → U − G + A`` (``A`` compound Poisson, the
prompt tokens of one full iteration), so its stationary law decays exponentially,
``P(U > u) ∝ e^{−θu}`` (Cramér–Lundberg). A grid whose top budget held too much mass is
regrown to where that tail falls below :data:`TAIL_MASS`, instead of being doubled.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

Arr = NDArray[np.float64]

TAIL_MASS = 1e-7  # stationary mass allowed in the top budget of the grid


#: a grid regrown from a solve whose top budget held too much: this much above the estimate
TAIL_MARGIN = 1.1


def tail_rate(mean_arrivals: float, jump_pmf: Arr, per_budget: int) -> float:
    """``θ`` of the backlog's exponential tail ``P(U > u) ∝ e^{−θu}`` (per grid step), or
    0 if the walk does not drift down.

    Above ``B'`` the backlog is a random walk ``U → U − G + A`` (``A`` compound Poisson,
    mean ``mean_arrivals`` prompts of ``jump_pmf`` grid steps), and ``θ`` is the positive
    root of ``mean_arrivals·(F(e^θ) − 1) = θ·G`` (Cramér–Lundberg; ``F`` the jump law's
    generating function), found by bisection."""
    G, r = per_budget, mean_arrivals
    k = np.arange(jump_pmf.size, dtype=np.float64)
    if r <= 0 or r * float(jump_pmf @ k) >= G:
        return 0.0

    def kappa(theta: float) -> float:
        return r * (float(jump_pmf @ np.exp(theta * k)) - 1.0) - theta * G

    lo, hi = 0.0, 1.0 / max(float(k[-1]), 1.0)
    while kappa(hi) <= 0 and hi * k[-1] < 600:
        lo, hi = hi, 2 * hi
    for _ in range(30):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if kappa(mid) <= 0 else (lo, mid)
    return hi


def regrown_levels(pi: Arr, levels: int, per_budget: int, theta: float) -> int:
    """The next grid's budgets after a solve on ``levels`` budgets left ``≥ TAIL_MASS`` in
    the top one: where the mass above the grid's middle, decaying as ``e^{−θu}``
    (:func:`tail_rate`), falls below ``TAIL_MASS`` (times :data:`TAIL_MARGIN`; more
    than ``levels``, at most 4× it); without a rate, twice ``levels``. One regrown solve
    instead of the doublings towards it (a quarter of the chains' work at 8k-token
    prompts)."""
    G = per_budget
    if theta <= 0:
        return 2 * levels
    u0 = (levels // 2) * G
    beyond = float(pi[u0:].sum())
    u_star = u0 + TAIL_MARGIN * math.log(max(beyond, TAIL_MASS) / TAIL_MASS) / theta
    need = math.ceil(u_star / G) + 1
    return min(max(need, levels + 1), 4 * levels)
