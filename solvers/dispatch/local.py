"""Local search for expert dispatch: move or shift one expert's tokens off the critical
GPU to a sibling replica while that lowers the makespan; when no single move does, two
chained moves (off the critical GPU onto a sibling's GPU, then off that GPU).

Candidate amounts per move: all of the replica's tokens, the remainder above whole
tiles (half, without tiles), and half the rows gap between the two GPUs rounded down
and up to whole tiles. Small candidate sets are scored in plain Python, large ones with
numpy (its per-call overhead dominates small arrays).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from solvers.dispatch.bounds import simple_bound_s
from solvers.dispatch.problem import F64, I64, DispatchProblem


def _time_fn(p: DispatchProblem) -> Any:
    """A scalar ``t(G, N)`` in plain Python (the greedy's inner loop)."""
    al, sg, sn = p.alpha_s.tolist(), p.slope_g.tolist(), p.slope_n.tolist()
    if len(al) == 2:
        a0, a1, g0, g1, n0, n1 = al[0], al[1], sg[0], sg[1], sn[0], sn[1]

        def tf2(a: float, n: float) -> float:
            u, v = a0 + g0 * a + n0 * n, a1 + g1 * a + n1 * n
            return u if u > v else v

        return tf2
    pieces = list(zip(al, sg, sn, strict=True))

    def tf(a: float, n: float) -> float:
        return max(q + u * a + w * n for q, u, w in pieces)

    return tf


Siblings = tuple[I64, I64, list[int]]


def _siblings(p: DispatchProblem) -> Siblings:
    """All ordered pairs (r, s) of replica pairs of the same expert on different GPUs,
    grouped by the GPU of ``r``; the third item is each GPU's offset into the pairs."""
    cnt = np.bincount(p.pair_e, minlength=p.num_experts)
    r = np.flatnonzero(cnt[p.pair_e] > 1)
    k = cnt[p.pair_e[r]]
    fr = np.repeat(r, k)
    first = np.searchsorted(p.pair_e, p.pair_e[fr])  # first pair of the same expert
    to = first + (np.arange(len(fr)) - np.repeat(np.cumsum(k) - k, k))
    keep = fr != to
    fr, to = fr[keep], to[keep]
    order = np.argsort(p.pair_g[fr], kind="stable")
    fr, to = fr[order], to[order]
    off = np.searchsorted(p.pair_g[fr], np.arange(p.num_gpus + 1)).tolist()
    return fr, to, off


#: Below this many (move, amount) candidates the local search scores them in plain
#: Python (numpy's per-call overhead dominates small arrays).
_PY_MOVES = 64


def _move_amounts(xa: Any, xb_rows_gap: Any, tile: float, floor: Any, ceil: Any) -> list[Any]:
    """Candidate amounts to move from a replica with ``xa`` tokens: all of them, the
    remainder above whole tiles (half without tiles), and half the rows gap to the
    sibling's GPU rounded down and up to whole tiles (works on floats and arrays)."""
    if tile > 1:
        return [xa, xa % tile, floor(xb_rows_gap / tile) * tile, ceil(xb_rows_gap / tile) * tile]
    return [xa, floor(xa / 2.0), floor(xb_rows_gap), ceil(xb_rows_gap)]


def _move_times(
    p: DispatchProblem, act: F64, rows: F64, gs: int, xa: F64, xb: F64, g2: I64
) -> tuple[F64, F64, F64]:
    """Candidate amounts ``d`` (C, M) and the new times of ``gs`` and of each sibling's
    GPU after moving them. Every ``xa > 0``: moving all of it frees an activation on
    ``gs``; any amount activates the sibling iff it held nothing."""
    half = np.maximum((rows[gs] - rows[g2]) / 2.0, 0.0)
    d = np.clip(np.stack(_move_amounts(xa, half, float(p.tile_rows), np.floor, np.ceil)), 0, xa)
    na = xa - d
    both_act = np.stack([act[gs] - (na <= 1e-9), np.broadcast_to(act[g2] + (xb <= 1e-9), d.shape)])
    both_rows = np.stack([rows[gs] - p.pad(xa) + p.pad(na), (rows[g2] - p.pad(xb)) + p.pad(xb + d)])
    t2 = p.time_s(both_act, both_rows)
    return d, t2[0], t2[1]


def _best_move_np(
    p: DispatchProblem, act: F64, rows: F64, gs: int, xa: F64, xb: F64, g2: I64
) -> tuple[float, int, float]:
    """(new worst time of the two GPUs, move index, amount) of the best candidate."""
    d, ta, tb = _move_times(p, act, rows, gs, xa, xb, g2)
    new = np.maximum(ta, tb)
    new[d <= 0] = np.inf
    k = int(np.argmin(new))
    c_i, j = divmod(k, new.shape[1])
    return float(new[c_i, j]), j, float(d[c_i, j])


def _best_move_py(
    p: DispatchProblem, tf: Any, act: F64, rows: F64, gs: int, xa: F64, xb: F64, g2: I64
) -> tuple[float, int, float]:
    """:func:`_best_move_np` in plain Python (same candidates, same order)."""
    tile = float(p.tile_rows)
    ceil = math.ceil

    def pad(v: float) -> float:
        return ceil(v / tile - 1e-9) * tile if tile > 1 else v

    act_l, rows_l = act.tolist(), rows.tolist()
    a_s, r_s = act_l[gs], rows_l[gs]
    moves = []
    for u, w, h in zip(xa.tolist(), xb.tolist(), g2.tolist(), strict=True):
        amounts = _move_amounts(u, max((r_s - rows_l[h]) / 2.0, 0.0), tile, math.floor, ceil)
        base_a = r_s - pad(u)
        base_b = rows_l[h] - pad(w)
        act_b = act_l[h] + (w <= 1e-9)
        moves.append((u, w, amounts, base_a, base_b, act_b))
    best, best_j, best_d = math.inf, 0, 0.0
    for c in range(4):
        for j, (u, w, amounts, base_a, base_b, act_b) in enumerate(moves):
            d = amounts[c]
            d = u if d > u else d
            if d <= 0:
                continue
            na = u - d
            ta = tf(a_s - (na <= 1e-9), base_a + pad(na))
            tb = tf(act_b, base_b + pad(w + d))
            v = ta if ta > tb else tb
            if v < best:
                best, best_j, best_d = v, j, d
    return best, best_j, best_d


class _Search:
    """Local-search state: pair loads and per-GPU activations, rows and times."""

    def __init__(self, p: DispatchProblem, x: F64, sib: Siblings) -> None:
        self.p, self.x = p, x.copy()
        self.sf, self.st, self.off = sib
        self.gt = p.pair_g[self.st]
        self.act, _, self.rows, self.t = p.gpu_state(x)
        self.tf = _time_fn(p)

    def moves(self, g: int) -> tuple[I64, I64, I64, F64, F64]:
        """Replica pairs on GPU g holding tokens, their siblings, the siblings' GPUs and
        both loads."""
        lo, hi = self.off[g], self.off[g + 1]
        a = self.sf[lo:hi]
        xa = self.x[a]
        m = xa > 0
        b = self.st[lo:hi][m]
        return a[m], b, self.gt[lo:hi][m], xa[m], self.x[b]

    def best(self, g: int) -> tuple[float, int, int, float]:
        """(worst new time of the two GPUs, from pair, to pair, amount) of the best move
        off GPU g; inf if there is none."""
        a, b, g2, xa, xb = self.moves(g)
        if len(a) == 0:
            return math.inf, -1, -1, 0.0
        if 4 * len(a) <= _PY_MOVES:
            new, j, dj = _best_move_py(self.p, self.tf, self.act, self.rows, g, xa, xb, g2)
        else:
            new, j, dj = _best_move_np(self.p, self.act, self.rows, g, xa, xb, g2)
        return new, int(a[j]), int(b[j]), dj

    def apply(self, ra: int, rb: int, d: float) -> None:
        p, x = self.p, self.x
        ga, gb = int(p.pair_g[ra]), int(p.pair_g[rb])
        x[ra] -= d
        x[rb] += d
        self.act[ga] -= float(x[ra] <= 1e-9)
        self.act[gb] += float(x[rb] - d <= 1e-9)
        self.rows[ga] += float(p.pad(x[ra]) - p.pad(x[ra] + d))
        self.rows[gb] += float(p.pad(x[rb]) - p.pad(x[rb] - d))
        self.t[[ga, gb]] = p.time_s(self.act[[ga, gb]], self.rows[[ga, gb]])

    def chain(self, gs: int, limit: float, tries: int = 4) -> bool:
        """Two chained moves: one off ``gs`` that would help it but overloads its
        sibling's GPU, then the best move off that GPU. Applies the best chain whose
        three GPUs all end below ``limit``; False if there is none."""
        a, b, g2, xa, xb = self.moves(gs)
        if len(a) == 0:
            return False
        d, ta, tb = _move_times(self.p, self.act, self.rows, gs, xa, xb, g2)
        ok = (d > 0) & (ta < limit) & (tb >= limit)
        if not ok.any():
            return False
        flat = np.flatnonzero(ok.ravel())
        flat = flat[np.argsort(tb.ravel()[flat], kind="stable")][:tries]
        saved = (self.x.copy(), self.act.copy(), self.rows.copy(), self.t.copy())
        best: tuple[float, int, int, float, int, int, float] | None = None
        for k in flat.tolist():
            c_i, j = divmod(k, d.shape[1])
            ra, rb, dj = int(a[j]), int(b[j]), float(d[c_i, j])
            self.apply(ra, rb, dj)
            g2j = int(g2[j])
            new2, ra2, rb2, d2 = self.best(g2j)
            if ra2 >= 0:
                g3 = int(self.p.pair_g[rb2])
                worst = new2 if g3 == gs else max(float(self.t[gs]), new2)
                if worst < limit and (best is None or worst < best[0]):
                    best = (worst, ra, rb, dj, ra2, rb2, d2)
            self.x[:], self.act[:], self.rows[:], self.t[:] = saved
        if best is None:
            return False
        self.apply(best[1], best[2], best[3])
        self.apply(best[4], best[5], best[6])
        return True


def _local_search(
    p: DispatchProblem,
    x: F64,
    *,
    siblings: Siblings | None = None,
    floor_s: float | None = None,
    max_iter: int = 48,
) -> tuple[F64, float]:
    """Move or shift tokens off the critical GPU while that lowers its time (when no
    single move does, try two chained moves); stop at a lower bound (``floor_s``,
    default :func:`simple_bound_s`): optimal. Returns the improved loads and their
    makespan. Candidates: every expert on the critical GPU, every sibling replica, the
    amounts of :func:`_move_amounts`."""
    sib = _siblings(p) if siblings is None else siblings
    if len(sib[0]) == 0:
        return x, float(p.gpu_state(x)[3].max())
    s = _Search(p, x, sib)
    floor_s = (simple_bound_s(p) if floor_s is None else floor_s) * (1 + 1e-12)
    for _ in range(max_iter):
        gs = int(np.argmax(s.t))
        limit = float(s.t[gs]) * (1 - 1e-12)
        if s.t[gs] <= floor_s:  # at the lower bound: optimal
            break
        new, ra, rb, d = s.best(gs)
        if new < limit:
            s.apply(ra, rb, d)
        elif not s.chain(gs, limit):
            break
    return s.x, float(s.t.max())
