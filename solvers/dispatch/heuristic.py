"""Fast max-affine-aware dispatch: greedy + local search from several starts.

* greedy: experts with one replica are fixed; the others, largest first, go whole to
  the GPU whose time ``t(G, N)`` grows least, or are water-filled in whole tiles over
  their least-loaded replicas when that lowers the worst touched GPU;
* local search (``solvers.dispatch_local``): single and two-chained moves of one
  expert's tokens off the critical GPU while that lowers the makespan;
* starts: the greedy; the exact optimum of each max-affine piece alone (fewest
  activations — METRO's MIN-EXP-ROUTING — and fewest padded rows, both by the
  max-flow of ``solvers.token_balance``); the three proxies (exact token balance,
  EPLB's static split, METRO's greedy), so the result is never worse than any proxy;
* pruning: a dispatch at the lower bound of ``solvers.dispatch_bounds`` is optimal
  and ends the search.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from solvers.dispatch.bounds import _bound_pieces, simple_bound_s
from solvers.dispatch.local import _local_search, _siblings, _time_fn
from solvers.dispatch.problem import F64, DispatchProblem, DispatchResult, _result
from solvers.dispatch.proxies import (
    _act_balance_x,
    _metro_x,
    _split_even,
    _tile_balance_x,
    _token_x,
)
from solvers.dispatch.token_balance import SUBSET_MAX_GPUS, subset_levels


def _fixed_pairs(p: DispatchProblem) -> tuple[F64, list[int]]:
    """Loads of experts with a single candidate GPU (no choice) and the experts that
    have a choice, the latter in descending token order."""
    starts = np.searchsorted(p.pair_e, np.arange(p.num_experts + 1))
    n_cand = np.diff(starts)
    x = np.zeros(len(p.pair_e))
    single = np.flatnonzero((n_cand == 1) & (p.counts > 0))
    x[starts[single]] = p.counts[single]
    multi = np.flatnonzero((n_cand > 1) & (p.counts > 0))
    multi = multi[np.argsort(-p.counts[multi], kind="stable")]
    return x, multi.tolist()


def _waterfill(
    tf: Any, cands: list[tuple[int, int]], act: list[float], rows: list[float], Ti: float, tile: int
) -> tuple[float, list[tuple[int, float]]] | None:
    """Best split of ``Ti`` tokens over the j least-loaded candidate GPUs (j = 2..R):
    fill rows up to a common level, in whole tiles; returns (worst time, parts)."""
    order = sorted(cands, key=lambda rg: tf(act[rg[1]] + 1, rows[rg[1]] + tile))
    n_tiles = int(-(-Ti // tile)) if tile > 1 else 0
    best: tuple[float, list[tuple[int, float]]] | None = None
    for j in range(2, len(order) + 1):
        sub = order[:j]
        base = sorted(rows[g] for _, g in sub)
        # Level λ with Σ max(0, λ − rows_r) = padded total.
        need = n_tiles * tile if tile > 1 else Ti
        lam, acc = base[0], 0.0
        for q in range(1, j + 1):
            nxt = base[q] if q < j else float("inf")
            if acc + q * (nxt - lam) >= need:
                lam += (need - acc) / q
                break
            acc += q * (nxt - lam)
            lam = nxt
        if tile > 1:
            tiles = [int(max(0.0, lam - rows[g]) // tile) for _, g in sub]
            left = n_tiles - sum(tiles)
            for idx in sorted(range(j), key=lambda u: rows[sub[u][1]] + tiles[u] * tile):
                if left <= 0:
                    break
                tiles[idx] += 1
                left -= 1
            amounts = [float(t * tile) for t in tiles]
            # The last non-empty part takes the un-padded remainder.
            over = n_tiles * tile - Ti
            for idx in range(j - 1, -1, -1):
                if amounts[idx] > 0:
                    amounts[idx] -= over
                    break
        else:
            amounts = [float(max(0.0, round(lam - rows[g]))) for _, g in sub]
            amounts[int(np.argmax(amounts))] += Ti - sum(amounts)
        parts = [(r, a) for (r, _), a in zip(sub, amounts, strict=True) if a > 0]
        if len(parts) < 2:
            continue
        v = max(
            tf(act[g] + 1, rows[g] + (-(-a // tile) * tile if tile > 1 else a))
            for (r, g), a in zip(sub, amounts, strict=True)
            if a > 0
        )
        if best is not None and v >= best[0]:
            break
        best = (v, parts)
    return best


def _greedy_x(p: DispatchProblem) -> F64:
    """Experts with one replica are fixed; the others, largest first, go whole to the
    GPU whose time grows least — or, when that would exceed the target (the larger of a
    lower bound and the running makespan), are water-filled in whole tiles over their
    least-loaded replicas if that lowers the worst touched GPU."""
    tf = _time_fn(p)
    x, multi = _fixed_pairs(p)
    act_a, _, rows_a, t_a = p.gpu_state(x)
    act, rows = act_a.tolist(), rows_a.tolist()
    target = max(float(t_a.max()), simple_bound_s(p))
    starts = np.searchsorted(p.pair_e, np.arange(p.num_experts + 1)).tolist()
    pg = p.pair_g.tolist()
    T = p.counts.tolist()
    tile = p.tile_rows
    # Two pieces (the expert profile max(a + b·G, c + β·N)) are evaluated inline.
    two = len(p.alpha_s) == 2
    a0, a1 = (float(v) for v in p.alpha_s[:2]) if two else (0.0, 0.0)
    g0, g1 = (float(v) for v in p.slope_g[:2]) if two else (0.0, 0.0)
    n0, n1 = (float(v) for v in p.slope_n[:2]) if two else (0.0, 0.0)
    whole_r: list[int] = []
    whole_t: list[float] = []
    for i in multi:
        Ti = T[i]
        lo, hi = starts[i], starts[i + 1]
        padT = -(-Ti // tile) * tile if tile > 1 else Ti
        r1, v1 = lo, float("inf")
        for r in range(lo, hi):
            g = pg[r]
            if two:
                na, nr = act[g] + 1, rows[g] + padT
                v, w = a0 + g0 * na + n0 * nr, a1 + g1 * na + n1 * nr
                if w > v:
                    v = w
            else:
                v = tf(act[g] + 1, rows[g] + padT)
            if v < v1:
                r1, v1 = r, v
        g1_ = pg[r1]
        if v1 > target and Ti > tile:
            split = _waterfill(tf, [(r, pg[r]) for r in range(lo, hi)], act, rows, Ti, tile)
            if split is not None and split[0] < v1 * (1 - 1e-12):
                v_s, parts = split
                for r, n in parts:
                    g = pg[r]
                    x[r] = n
                    act[g] += 1
                    rows[g] += -(-n // tile) * tile if tile > 1 else n
                if v_s > target:
                    target = v_s
                continue
        whole_r.append(r1)
        whole_t.append(Ti)
        act[g1_] += 1
        rows[g1_] += padT
        if v1 > target:
            target = v1
    x[whole_r] = whole_t
    return x


def dispatch_heuristic(
    p: DispatchProblem,
    *,
    seed_proxies: bool = True,
    seeds: tuple[DispatchResult, ...] = (),
) -> DispatchResult:
    """Max-affine-aware greedy + local search from several starts; the best is kept.

    Starts, in order: the greedy; the exact optimum of the binding piece alone (fewest
    activations, or fewest padded rows), then of the other; with ``seed_proxies`` the
    three proxies (exact token balance, static split, METRO's greedy — so the result
    is never worse than any proxy); then ``seeds``. The greedy is always improved by
    local search, a later start only if it already beats the best so far. Once the
    best reaches :func:`pruning_bound_s` it is optimal and returned at once."""
    t0 = time.perf_counter()
    levels: list[float | None] = [None, None, None]
    if p.num_gpus <= SUBSET_MAX_GPUS:
        w = np.stack(
            [p.counts, np.ceil(p.counts / p.tile_rows - 1e-9), (p.counts > 0).astype(float)],
            axis=1,
        )
        levels = list(subset_levels(w, p.placement.replicas > 0).tolist())
    tok_level, tile_level, act_level = levels
    pieces, only_g, only_n = _bound_pieces(p, tile_level=tile_level, act_level=act_level)
    bound = float(np.max(pieces))
    sib = _siblings(p)
    best, best_t = _local_search(p, _greedy_x(p), siblings=sib, floor_s=bound)
    starts: list[F64 | Callable[[], F64]] = [lambda: _act_balance_x(p, act_level)]
    if p.tile_rows > 1:
        starts.append(lambda: _tile_balance_x(p, tile_level))
    if np.max(pieces[only_n], initial=-np.inf) > np.max(pieces[only_g], initial=-np.inf):
        starts.reverse()  # token-bound: fewest padded rows first
    if seed_proxies:
        starts += [
            lambda: _token_x(p, level=tok_level),
            lambda: _split_even(p, p.pair_mult.astype(float), integer=True),
            lambda: _metro_x(p),
        ]
    starts += [r.tokens[p.pair_e, p.pair_g] for r in seeds]
    for start in starts:
        if best_t <= bound * (1 + 1e-12):
            break
        x0 = start() if callable(start) else start
        t_0 = float(p.gpu_state(x0)[3].max())
        if t_0 < best_t * (1 - 1e-12):
            x1, t_1 = _local_search(p, x0, siblings=sib, floor_s=bound)
            if t_1 < best_t:
                best, best_t = x1, t_1
    return _result(p, "heuristic", best, t0, "heuristic")
