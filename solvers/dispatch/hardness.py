"""Complexity of expert dispatch: the PARTITION reduction and the two polynomial limits.

**NP-hardness on two fully replicated GPUs** (``shared/reference/formal_models.md``
§5.1). Equal-cardinality PARTITION (NP-complete): items ``w_1..w_n`` (``n`` even),
``Σ w = 2W``; is there a set of ``n/2`` items summing to ``W``? Build a dispatch
instance with ``m = 2`` GPUs each holding every expert, ``T_i = w_i``, profile
``t = max(b·G, β·N)`` with ``a = c = 0``, ``β = 1``, ``b = 2W/n`` and no tile padding.
Then ``t_g ≥ N_g`` and ``N_1 + N_2 = 2W`` give makespan ``≥ W``; makespan ``= W``
needs ``b·G_g ≤ W``, i.e. ``G_g ≤ n/2``, while every expert is activated at least once
(``G_1 + G_2 ≥ n``) — so ``G_1 = G_2 = n/2``, no expert is split, and ``N_1 = N_2 = W``:
an equal-size equal-sum partition. Conversely such a partition has makespan ``W``.
Hence *the optimal makespan equals W iff the PARTITION instance is a yes-instance*.

**Polynomial limits.**

* ``β = 0`` (no per-token cost): time depends on activated replicas only; an expert
  is never worth splitting (METRO's Lemma 1), and "can every GPU stay within λ
  activations?" is a bipartite b-matching, decided by a max-flow (networkx). Binary
  search on λ gives the optimum (METRO's MIN-EXP-ROUTING, arXiv 2512.09277).
* ``b = 0`` (no per-replica cost) and no padding: activating a replica is free, so
  the problem is the LP ``min C s.t. Σ_g x_ig = T_i, α_k + β_k·Σ_i x_ig ≤ C`` (the LP
  LPLB solves).
"""

from __future__ import annotations

import itertools
import time

import numpy as np
from numpy.typing import ArrayLike

from hardware.maxaffine import MaxAffine, Provenance
from perfmodel.errors import SpecError
from solvers.dispatch.solve import DispatchProblem, DispatchResult, Placement, _result


def partition_instance(weights: ArrayLike) -> tuple[DispatchProblem, float]:
    """The dispatch instance of the reduction and its threshold ``W`` (see module doc)."""
    w = np.asarray(weights, dtype=np.float64).ravel()
    n = len(w)
    if n < 2 or n % 2 or np.any(w <= 0) or np.any(w != np.round(w)):
        raise SpecError("PARTITION needs an even number (>= 2) of positive integer weights")
    W = float(w.sum()) / 2.0
    prof = MaxAffine(
        features=("G", "N"),
        intercepts_s=np.zeros(2),
        slopes=np.array([[2.0 * W / n, 0.0], [0.0, 1.0]]),
        provenance=Provenance("abstract", "partition-reduction", source="reduction"),
        piece_names=("weights", "tokens"),
    )
    placement = Placement(np.ones((n, 2), dtype=np.int64))
    return DispatchProblem(w, placement, prof, 1), W


def has_equal_partition(weights: ArrayLike) -> bool:
    """Brute force: is there a subset of n/2 items with half the total sum?"""
    w = [int(v) for v in np.asarray(weights).ravel()]
    total = sum(w)
    if len(w) % 2 or total % 2:
        return False
    half, k = total // 2, len(w) // 2
    # Fix item 0 in the subset (one of the two halves contains it).
    rest = w[1:]
    return any(sum(c) + w[0] == half for c in itertools.combinations(rest, k - 1))


def _pieces(p: DispatchProblem) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return p.alpha_s, p.slope_g, p.slope_n


def solve_activation_limit(p: DispatchProblem) -> DispatchResult:
    """Exact optimum when β = 0: binary search on the activation cap λ with a
    max-flow feasibility test (source → expert: 1, expert → GPU with a replica: 1,
    GPU → sink: λ)."""
    import networkx as nx

    _, sg, sn = _pieces(p)
    if np.any(sn != 0):
        raise SpecError("the beta = 0 limit needs a profile with no per-token slope")
    if np.any(sg < 0):
        raise SpecError("the beta = 0 limit needs non-negative per-replica slopes")
    t0 = time.perf_counter()
    active = np.flatnonzero(p.counts > 0)
    G = p.num_gpus
    graph = nx.DiGraph()
    for i in active.tolist():
        graph.add_edge("s", ("e", i), capacity=1)
        for g in np.flatnonzero(p.placement.replicas[i] > 0).tolist():
            graph.add_edge(("e", i), ("g", g), capacity=1)
    for g in range(G):
        graph.add_edge(("g", g), "t", capacity=0)

    def feasible(lam: int) -> tuple[bool, dict]:
        for g in range(G):
            graph[("g", g)]["t"]["capacity"] = lam
        value, flow = nx.maximum_flow(graph, "s", "t")
        return value == len(active), flow

    lo, hi = -(-len(active) // G), len(active)
    _, flow = feasible(hi)
    while lo < hi:
        mid = (lo + hi) // 2
        ok_mid, flow_mid = feasible(mid)
        if ok_mid:
            hi, flow = mid, flow_mid
        else:
            lo = mid + 1
    x = np.zeros(len(p.pair_e))
    pair_index = {
        (int(e), int(g)): r for r, (e, g) in enumerate(zip(p.pair_e, p.pair_g, strict=True))
    }
    for i in active.tolist():
        for (_, g), f in flow[("e", i)].items():
            if f > 0.5:
                x[pair_index[(i, g)]] = p.counts[i]
    return _result(p, "flow(beta=0)", x, t0, "optimal")


def solve_token_limit(p: DispatchProblem) -> DispatchResult:
    """Exact optimum when b = 0 and no tile padding: the LP over continuous splits."""
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    al, sg, sn = _pieces(p)
    if np.any(sg != 0):
        raise SpecError("the b = 0 limit needs a profile with no per-replica slope")
    if p.tile_rows != 1:
        raise SpecError("the b = 0 limit is an LP only without tile padding (tile_rows=1)")
    t0 = time.perf_counter()
    idx = np.flatnonzero(p.counts[p.pair_e] > 0)
    R, G, K = len(idx), p.num_gpus, len(al)
    e, g = p.pair_e[idx], p.pair_g[idx]
    scale = 1.0 / p.ref_time_s()
    # vars: x (R), C. rows (g, k): β_k Σ x − C ≤ −α_k.
    rows = np.concatenate([k * G + g for k in range(K)] + [np.arange(K * G)])
    cols = np.concatenate([np.arange(R)] * K + [np.full(K * G, R)])
    vals = np.concatenate([np.full(R, scale * sn[k]) for k in range(K)] + [-np.ones(K * G)])
    A_ub = coo_matrix((vals, (rows, cols)), shape=(K * G, R + 1))
    b_ub = np.concatenate([np.full(G, -scale * al[k]) for k in range(K)])
    uniq, inv = np.unique(e, return_inverse=True)
    A_eq = coo_matrix((np.ones(R), (inv, np.arange(R))), shape=(len(uniq), R + 1))
    c = np.zeros(R + 1)
    c[R] = 1.0
    res = linprog(
        c,
        A_ub=A_ub,
        b_ub=b_ub,
        A_eq=A_eq,
        b_eq=p.counts[uniq],
        bounds=[(0, None)] * R + [(None, None)],
        method="highs",
    )
    if res.status != 0:
        raise SpecError(f"b = 0 LP failed: {res.message}")
    x = np.zeros(len(p.pair_e))
    x[idx] = np.maximum(res.x[:R], 0.0)
    return _result(p, "lp(b=0)", x, t0, "optimal", lower_bound_s=float(res.fun) / scale)
