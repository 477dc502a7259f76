"""The proxy dispatchers the makespan-aware ones are measured against.

* ``static``    EPLB's routing: each expert's tokens split evenly over its physical
  replicas (``shared/reference/formal_models.md`` §5.3);
* ``activated`` METRO's greedy: experts in id order, each whole to the candidate GPU
  with the fewest activated experts so far (ties: lowest GPU id) — arXiv 2512.09277
  Alg. 1 (§5.2);
* ``token``     token balancing, LPLB's objective ``min max_g Σ_i x_ig`` (§5.4), solved
  exactly by parametric max-flow (``solvers.token_balance``; integer splits reach
  ``⌈L*⌉``), or with ``solver="lp"`` by the LP (HiGHS) followed by floor +
  largest-remainder rounding.

Also the exact optima of each max-affine piece alone, which the heuristic starts from:
fewest padded rows (:func:`_tile_balance_x`) and fewest activations
(:func:`_act_balance_x`, METRO's MIN-EXP-ROUTING), both by the same max-flow.
"""

from __future__ import annotations

import time

import numpy as np

from perfmodel.errors import SpecError
from solvers.dispatch.problem import _EPS, F64, DispatchProblem, DispatchResult, _result
from solvers.dispatch.token_balance import token_balance

TOKEN_SOLVERS: tuple[str, ...] = ("flow", "lp")


def _split_even(p: DispatchProblem, weights: F64, *, integer: bool) -> F64:
    """Split each T_i over its pairs ∝ weights; integer: floor + largest remainder."""
    tot = np.bincount(p.pair_e, weights=weights, minlength=p.num_experts)
    share = p.counts[p.pair_e] * weights / np.maximum(tot[p.pair_e], _EPS)
    if not integer:
        return share
    base = np.floor(share + 1e-9)
    rem = p.counts - np.bincount(p.pair_e, weights=base, minlength=p.num_experts)
    frac = share - base
    # Order pairs by expert, then by descending fractional part (ties: lower GPU first).
    order = np.lexsort((p.pair_g, -frac, p.pair_e))
    first = np.searchsorted(p.pair_e[order], np.arange(p.num_experts))
    rank = np.arange(len(order)) - first[p.pair_e[order]]
    base[order] += (rank < np.round(rem[p.pair_e[order]])).astype(float)
    return base


def dispatch_static(p: DispatchProblem, *, integer: bool = True) -> DispatchResult:
    """EPLB routing: each expert's tokens split evenly over its physical replicas."""
    t0 = time.perf_counter()
    x = _split_even(p, p.pair_mult.astype(float), integer=integer)
    return _result(p, "static", x, t0, "proxy")


def _metro_x(p: DispatchProblem) -> F64:
    """METRO Alg. 1: experts in id order, each whole to the candidate GPU with the
    fewest activated experts so far (ties: lowest GPU id)."""
    loads = [0] * p.num_gpus
    starts = np.searchsorted(p.pair_e, np.arange(p.num_experts + 1)).tolist()
    pg = p.pair_g.tolist()
    chosen: list[int] = []
    for i, t in enumerate(p.counts.tolist()):
        if t <= 0:
            continue
        lo, hi = starts[i], starts[i + 1]
        best = lo
        bl = loads[pg[lo]]
        for r in range(lo + 1, hi):
            lr = loads[pg[r]]
            if lr < bl or (lr == bl and pg[r] < pg[best]):
                best, bl = r, lr
        loads[pg[best]] = bl + 1
        chosen.append(best)
    x = np.zeros(len(p.pair_e))
    x[chosen] = p.counts[p.pair_e[chosen]]
    return x


def dispatch_activated(p: DispatchProblem) -> DispatchResult:
    """METRO greedy: each expert whole to the candidate GPU with fewest activated experts."""
    t0 = time.perf_counter()
    return _result(p, "activated", _metro_x(p), t0, "proxy")


def _round_split(p: DispatchProblem, x: F64) -> F64:
    """Integer split keeping each expert's total: floor + largest remainder."""
    return _split_even(p, np.maximum(x, 0.0) + 1e-12 * (x > 0), integer=True)


def _token_x(p: DispatchProblem, *, integer: bool = True, level: float | None = None) -> F64:
    """Pair loads of the exact token balance (parametric max-flow); ``level``: L* if
    already known."""
    mask = p.placement.replicas > 0
    tb = token_balance(p.counts, mask, integer=integer, level=level)
    return tb.tokens[p.pair_e, p.pair_g]


def dispatch_token(
    p: DispatchProblem, *, integer: bool = True, solver: str = "flow"
) -> DispatchResult:
    """Token balancing (LPLB's objective): ``min max_g tokens_g``.

    ``solver="flow"`` (default): exact parametric max-flow, integer splits at level
    ``⌈L*⌉``; ``"lp"``: the LP (HiGHS) rounded by floor + largest remainder.
    """
    t0 = time.perf_counter()
    if solver == "flow":
        x = _token_x(p, integer=integer)
    elif solver == "lp":
        from solvers.dispatch.lp import token_lp

        x, _ = token_lp(p)
        if integer:
            x = _round_split(p, x)
    else:
        raise SpecError(f"unknown token solver {solver!r}; valid: {', '.join(TOKEN_SOLVERS)}")
    return _result(p, "token", x, t0, "proxy")


# ---- exact single-piece balances (heuristic starts, not proxies) -------------------------


def _tile_balance_x(p: DispatchProblem, level: float | None) -> F64:
    """Pair loads minimizing the busiest GPU's padded rows (exact for the token piece):
    balance each expert's ``⌈T_i/tile⌉`` tiles by :func:`token_balance`, then fill the
    tokens into the tiles in GPU order."""
    n_tiles = np.ceil(p.counts / p.tile_rows - 1e-9)
    tb = token_balance(n_tiles, p.placement.replicas > 0, integer=True, level=level)
    cap = p.tile_rows * tb.tokens[p.pair_e, p.pair_g]
    cum = np.cumsum(cap) - cap
    first = np.searchsorted(p.pair_e, p.pair_e)
    before = cum - cum[first]
    return np.clip(p.counts[p.pair_e] - before, 0.0, cap)


def _act_balance_x(p: DispatchProblem, level: float | None) -> F64:
    """Pair loads minimizing the busiest GPU's activated replicas (exact for the
    activation piece; METRO's MIN-EXP-ROUTING): every active expert whole on one
    replica, chosen by :func:`token_balance` over unit weights."""
    unit = (p.counts > 0).astype(np.float64)
    tb = token_balance(unit, p.placement.replicas > 0, integer=True, level=level)
    return tb.tokens[p.pair_e, p.pair_g] * p.counts[p.pair_e]
