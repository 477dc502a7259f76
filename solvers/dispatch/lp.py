"""Linear programs over pair loads (scipy ``linprog``/HiGHS): the token-balancing LP
(LPLB's, ``shared/reference/formal_models.md`` §5.4; the reference the max-flow token
balance of ``solvers.token_balance`` is tested against) and the LP relaxation of the
dispatch MILP (``y``, ``m``, ``x`` continuous), the lower bound every dispatcher's gap
is measured to.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from numpy.typing import NDArray

from perfmodel.errors import SolverError
from solvers.dispatch.problem import F64, DispatchProblem, DispatchResult, _result


def _lp_min_max(p: DispatchProblem, *, relax_profile: bool) -> tuple[F64, float]:
    """LP over pair loads. relax_profile=False: min max_g Σ x (tokens); True: the LP
    relaxation of the MILP. Returns (x, objective in seconds or tokens)."""
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    active = p.counts[p.pair_e] > 0
    idx = np.flatnonzero(active)
    R = len(idx)
    G = p.num_gpus
    if R == 0:
        obj = float(p.time_s(0.0, 0.0).max()) if relax_profile else 0.0
        return np.zeros(len(p.pair_e)), obj
    e, g = p.pair_e[idx], p.pair_g[idx]
    T = p.counts[e]
    eq_rows = np.unique(e, return_inverse=True)[1]
    n_eq = int(eq_rows.max()) + 1
    if not relax_profile:
        # vars: x (R), C. rows: Σ_{r∈g} x_r − C ≤ 0.
        nv = R + 1
        A_ub = coo_matrix(
            (
                np.r_[np.ones(R), -np.ones(G)],
                (np.r_[g, np.arange(G)], np.r_[np.arange(R), np.full(G, R)]),
            ),
            shape=(G, nv),
        )
        b_ub = np.zeros(G)
        A_eq = coo_matrix((np.ones(R), (eq_rows, np.arange(R))), shape=(n_eq, nv))
        b_eq = np.bincount(eq_rows, weights=T, minlength=n_eq) / np.bincount(
            eq_rows, minlength=n_eq
        )
        c = np.zeros(nv)
        c[R] = 1.0
        bounds: list[tuple[float | None, float | None]] = [(0, None)] * nv
        res = linprog(c, A_ub=A_ub, b_ub=b_ub, A_eq=A_eq, b_eq=b_eq, bounds=bounds, method="highs")
    else:
        # vars: x (R), y (R), m (R, rows/tile), C (scaled by 1/ref).
        s = 1.0 / p.ref_time_s()
        K = len(p.alpha_s)
        tile = float(p.tile_rows)
        nv = 3 * R + 1
        ar = np.arange(R)
        rows_i: list[NDArray[Any]] = []
        cols_i: list[NDArray[Any]] = []
        vals: list[NDArray[Any]] = []
        b_ub_l: list[F64] = []
        r0 = 0
        for k in range(K):  # α_k + b_k Σ y + β_k·tile Σ m ≤ C
            rows_i += [r0 + g, r0 + g, r0 + np.arange(G)]
            cols_i += [R + ar, 2 * R + ar, np.full(G, 3 * R)]
            vals += [np.full(R, s * p.slope_g[k]), np.full(R, s * p.slope_n[k] * tile), -np.ones(G)]
            b_ub_l.append(np.full(G, -s * p.alpha_s[k]))
            r0 += G
        # x − T·y ≤ 0 ; x − tile·m ≤ 0 ; y − m ≤ 0
        rows_i += [r0 + ar, r0 + ar, r0 + R + ar, r0 + R + ar, r0 + 2 * R + ar, r0 + 2 * R + ar]
        cols_i += [ar, R + ar, ar, 2 * R + ar, R + ar, 2 * R + ar]
        vals += [np.ones(R), -T, np.ones(R), np.full(R, -tile), np.ones(R), -np.ones(R)]
        b_ub_l.append(np.zeros(3 * R))
        n_ub = r0 + 3 * R
        A_ub = coo_matrix(
            (np.concatenate(vals), (np.concatenate(rows_i), np.concatenate(cols_i))),
            shape=(n_ub, nv),
        )
        b_ub = np.concatenate(b_ub_l)
        A_eq = coo_matrix((np.ones(R), (eq_rows, ar)), shape=(n_eq, nv))
        b_eq = np.bincount(eq_rows, weights=T, minlength=n_eq) / np.bincount(
            eq_rows, minlength=n_eq
        )
        c = np.zeros(nv)
        c[-1] = 1.0
        bounds = [(0, None)] * R + [(0, 1)] * R + [(0, None)] * R + [(None, None)]
        res = linprog(c, A_ub=A_ub, b_ub=b_ub, A_eq=A_eq, b_eq=b_eq, bounds=bounds, method="highs")
    if res.status != 0:
        raise SolverError(f"LP solver failed ({res.message}); this is a bug, please report it")
    x = np.zeros(len(p.pair_e))
    x[idx] = np.maximum(res.x[:R], 0.0)
    obj = float(res.fun) / (1.0 / p.ref_time_s()) if relax_profile else float(res.fun)
    return x, obj


def token_lp(p: DispatchProblem) -> tuple[F64, float]:
    """The LP ``min max_g Σ_i x_ig`` (continuous): pair loads and the optimal level."""
    return _lp_min_max(p, relax_profile=False)


def lower_bound(p: DispatchProblem) -> DispatchResult:
    """LP relaxation of the MILP; ``makespan_s`` is the bound, ``tokens`` the LP split."""
    t0 = time.perf_counter()
    x, obj = _lp_min_max(p, relax_profile=True)
    return _result(p, "bound", x, t0, "bound", lower_bound_s=obj, makespan_s=obj)
