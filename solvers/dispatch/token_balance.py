"""Exact token balancing for a fixed placement by parametric max-flow (no LP).

Problem (LPLB's objective, ``shared/reference/formal_models.md`` §5.4): split each
expert's ``T_i`` tokens over the GPUs holding one of its replicas so as to minimize
the largest per-GPU token count,

    L* = min_x max_g Σ_i x_ig   s.t.  Σ_g x_ig = T_i,  x_ig ≥ 0,  x_ig = 0 if no replica.

Max-flow / min-cut (Hall's condition for the transportation network source → expert
(T_i) → GPU (∞) → sink (L)) gives the closed form

    L* = max_{S ⊆ GPUs} W(S) / |S|,    W(S) = Σ {T_i : every replica of i is on S},

and with integer ``T_i`` an integer split with ``max_g N_g = ⌈L*⌉`` exists (flow
integrality). Algorithm, on the G-node "move" graph where arc ``g → h`` carries the
tokens currently on ``g`` of experts that also have a replica on ``h``:

1. start from LPT: single-replica experts fixed, the others largest first, whole, to
   the least-loaded candidate GPU;
2. level ``L`` = ``L*`` itself up to :data:`SUBSET_MAX_GPUS` GPUs (the subset formula,
   :func:`subset_levels`), else the lower bound ``ΣT/G`` (``⌈·⌉`` for integers);
3. while some GPU is above ``L``: find a shortest path in the move graph from an
   overloaded GPU to an underloaded one and push the bottleneck amount along it
   (Ford–Fulkerson); if none exists, the GPUs ``S`` reachable from the overloaded
   ones hold exactly the experts confined to ``S``, so ``W(S)/|S|`` is a valid lower
   bound above ``L``: raise ``L`` to it (Newton step of the parametric flow) and go on.

When no GPU exceeds ``L``, ``L`` is both achieved and a lower bound: optimal. Each
raise comes from a distinct cut, so the loop is finite; on 8 GPUs it takes a few
pushes. The weights need not be tokens: whole 128-row tiles per expert give the
fewest padded rows, unit weights the fewest activated experts (a b-matching; every
expert stays whole since integer pushes move whole units).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from itertools import pairwise

import numpy as np
from numpy.typing import NDArray

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]


@dataclass(frozen=True)
class TokenBalance:
    """Per-(expert, GPU) tokens and the optimal level ``max_g N_g``."""

    tokens: F64  # (E, G)
    level: float  # max_g N_g: L* (continuous) or ⌈L*⌉ (integer), up to rounding
    pushes: int  # augmenting paths used
    raises: int  # parametric level raises


def _lpt(counts: F64, mask: NDArray[np.bool_]) -> tuple[F64, I64, F64]:
    """LPT start: single-candidate experts fixed (their per-GPU load is returned), the
    others (``multi``, largest first) whole to the least-loaded candidate (ties: lowest
    GPU id). Returns (fixed load per GPU, multi expert ids, their (M, G) loads)."""
    G = mask.shape[1]
    n_cand = mask.sum(axis=1)
    active = counts > 0
    single = np.flatnonzero(active & (n_cand == 1))
    fixed = np.bincount(mask[single].argmax(axis=1), weights=counts[single], minlength=G)
    multi = np.flatnonzero(active & (n_cand > 1))
    multi = multi[np.argsort(-counts[multi], kind="stable")]
    ri, gi = np.nonzero(mask[multi])
    starts = np.searchsorted(ri, np.arange(len(multi) + 1)).tolist()
    gl = gi.tolist()
    loads = fixed.tolist()
    dest = []
    for j, t in enumerate(counts[multi].tolist()):
        lo, hi = starts[j], starts[j + 1]
        best = gl[lo]
        bl = loads[best]
        for g in gl[lo + 1 : hi]:
            if loads[g] < bl:
                best, bl = g, loads[g]
        loads[best] = bl + t
        dest.append(best)
    Xm = np.zeros((len(multi), G))
    Xm[np.arange(len(multi)), dest] = counts[multi]
    return np.asarray(fixed, dtype=np.float64), multi, Xm


#: Up to this many GPUs the level comes from the subset formula (2^G subsets).
SUBSET_MAX_GPUS = 12


def subset_levels(weights: F64, mask: NDArray[np.bool_]) -> F64:
    """``max_S W_j(S)/|S|`` for each weight column ``j`` by enumerating GPU subsets:
    ``W_j`` is the subset-sum (zeta) transform of ``weights[:, j]`` keyed by each
    expert's replica bitmask. Column of tokens: the token level ``L*``; column of ones
    (active experts): ``⌈·⌉`` of it is the fewest activations the busiest GPU can have
    (integral b-matching; METRO's MIN-EXP-ROUTING optimum)."""
    E, G = mask.shape
    w = np.asarray(weights, dtype=np.float64).reshape(E, -1)
    key = (mask.astype(np.int64) << np.arange(G)).sum(axis=1)
    W = np.stack([np.bincount(key, weights=c, minlength=1 << G) for c in w.T], axis=1)
    for b in range(G):
        v = W.reshape(-1, 2, 1 << b, w.shape[1])
        v[:, 1] += v[:, 0]
    if hasattr(np, "bitwise_count"):
        size = np.bitwise_count(np.arange(1 << G))
    else:  # numpy < 2.0
        size = np.array([bin(s).count("1") for s in range(1 << G)])
    return np.max(W[1:] / size[1:, None], axis=0)


def subset_level(counts: F64, mask: NDArray[np.bool_]) -> float:
    """The token level ``L* = max_S W(S)/|S|`` (see :func:`subset_levels`)."""
    return float(subset_levels(np.asarray(counts, dtype=np.float64), mask)[0])


def _move(Xm: F64, Mm: NDArray[np.bool_], u: int, v: int, amount: float) -> None:
    """Move ``amount`` tokens from GPU u to GPU v, taking experts already active on v
    first (no new activation), then the largest loads (fewest split experts)."""
    idx = np.flatnonzero((Xm[:, u] > 0) & Mm[:, v]).tolist()
    have = Xm[idx, u].tolist()
    onv = (Xm[idx, v] > 0).tolist()
    order = sorted(range(len(idx)), key=lambda k: (not onv[k], -have[k]))
    left = amount
    for k in order:
        if left <= 0:
            break
        t = have[k] if have[k] < left else left
        i = idx[k]
        Xm[i, u] -= t
        Xm[i, v] += t
        left -= t


def token_balance(
    counts: F64,
    mask: NDArray[np.bool_],
    *,
    integer: bool = True,
    level: float | None = None,
    max_steps: int = 10_000,
) -> TokenBalance:
    """Minimize the largest per-GPU token count (see the module docstring).

    Parameters
    ----------
    counts : (E,) tokens per expert (non-negative; integers when ``integer``).
    mask : (E, G) True where expert ``i`` has a replica on GPU ``g``; every expert
        with tokens needs at least one.
    integer : integer splits (level ``⌈L*⌉``) or continuous ones (level ``L*``).
    level : ``L*`` if already known (e.g. from :func:`subset_level`).
    """
    T = np.asarray(counts, dtype=np.float64)
    E, G = mask.shape
    fixed, multi, Xm = _lpt(T, mask)
    Mm = mask[multi]
    N = fixed + Xm.sum(axis=0)
    total = float(T.sum())
    tol = 0.5 if integer else 1e-9 * max(1.0, total)

    def level_of(v: float) -> float:
        return float(np.ceil(v - 1e-9)) if integer else v

    exact = level is not None or G <= SUBSET_MAX_GPUS
    if level is None:
        level = subset_level(T, mask) if exact else total / G
    L = level_of(level)
    Mf = Mm.astype(np.float64)
    pushes = raises = 0
    for _ in range(max_steps):
        over = L + tol < N
        if not over.any():
            break
        cap = Xm.T @ Mf  # cap[g, h]: tokens on g of experts that can go to h
        adj = (cap > tol).tolist()
        under = (L - tol > N).tolist()
        seen = over.tolist()
        parent = [-1] * G
        queue = deque(g for g in range(G) if seen[g])
        sink = -1
        while queue and sink < 0:
            g = queue.popleft()
            row = adj[g]
            for h in range(G):
                if row[h] and not seen[h]:
                    seen[h], parent[h] = True, g
                    if under[h]:
                        sink = h
                        break
                    queue.append(h)
        if sink < 0:
            S = np.asarray(seen)
            new = level_of(float(N[S].sum()) / int(S.sum()))
            if exact or new <= L:  # only rounding noise is left above L
                L = float(N.max())
                break
            L = new
            raises += 1
            continue
        path = [sink]
        while parent[path[-1]] >= 0:
            path.append(parent[path[-1]])
        path.reverse()
        delta = min(float(N[path[0]]) - L, L - float(N[sink]))
        arcs = list(pairwise(path))
        delta = min([delta] + [float(cap[a, b]) for a, b in arcs])
        for a, b in arcs:
            _move(Xm, Mm, a, b, delta)
        N[path[0]] -= delta
        N[sink] += delta
        pushes += 1
    X = np.zeros((E, G))
    single = np.flatnonzero((T > 0) & (mask.sum(axis=1) == 1))
    X[single, mask[single].argmax(axis=1)] = T[single]
    X[multi] = np.maximum(Xm, 0.0)
    return TokenBalance(X, float(X.sum(axis=0).max()), pushes, raises)
