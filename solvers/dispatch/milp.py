"""Exact dispatch: the fixed-charge makespan MILP (``shared/reference/formal_models.md``
§5.1), PuLP with HiGHS (CBC fallback, ``solvers.pulp_solver``):

    min C  s.t.  Σ_g x_ig = T_i                       every token served
                 x_ig ≤ T_i·y_ig, y_ig ∈ {0,1}        fixed charge per activated replica
                 α_k + b_k·Σ_i y_ig + β_k·N_g ≤ C     ∀ g, k  (each max-affine piece)

with ``x`` integer or continuous and ``x = y = 0`` where expert ``i`` has no replica on
``g``. With tile padding (``tile_rows > 1``) ``N_g = tile·Σ_i m_ig`` with integer tile
counts ``y_ig ≤ m_ig ≤ ⌈T_i/tile⌉·y_ig`` and ``Σ_g m_ig ≥ ⌈T_i/tile⌉`` replacing ``x``:
any such ``m`` admits an integer split (fill the pieces in order), so the token
variables drop out and the integer and continuous problems coincide.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from perfmodel.errors import SolverError, SpecError
from solvers.dispatch.heuristic import dispatch_heuristic
from solvers.dispatch.lp import lower_bound
from solvers.dispatch.problem import DispatchProblem, DispatchResult, _result
from solvers.dispatch.proxies import _round_split
from solvers.pulp_solver import highs_error, pulp_solver


def solve_milp(
    p: DispatchProblem,
    *,
    integer: bool = True,
    time_limit_s: float = 10.0,
    gap_rel: float = 1e-6,
    incumbent: DispatchResult | None = None,
) -> DispatchResult:
    """Exact fixed-charge makespan MILP (see the module docstring).

    Status: ``optimal`` (gap ≤ ``gap_rel``), or ``time_limit`` (the best found — the
    MILP's incumbent or, if better, the heuristic's — with the gap to the best bound).
    """
    import pulp

    if time_limit_s <= 0:
        raise SpecError(f"time limit must be > 0 s, got {time_limit_s}")
    t0 = time.perf_counter()
    s = 1.0 / p.ref_time_s()
    idx = np.flatnonzero(p.counts[p.pair_e] > 0)
    tile = p.tile_rows
    prob = pulp.LpProblem("expert_dispatch", pulp.LpMinimize)
    C = pulp.LpVariable("makespan", lowBound=None)
    cat = "Integer" if integer else "Continuous"
    xs: dict[int, Any] = {}
    ys: dict[int, Any] = {}
    ms: dict[int, Any] = {}
    # With tiles, only the tile counts m matter: a split with Σ_r tile·m_r ≥ T_i always
    # exists (fill the pieces in order), so x is not a variable and integer = continuous.
    for r in idx.tolist():
        i, g = int(p.pair_e[r]), int(p.pair_g[r])
        Ti = float(p.counts[i])
        ys[r] = pulp.LpVariable(f"y_{i}_{g}", cat="Binary")
        if tile > 1:
            n_i = int(np.ceil(Ti / tile - 1e-9))
            ms[r] = pulp.LpVariable(f"m_{i}_{g}", lowBound=0, upBound=n_i, cat="Integer")
            prob += ms[r] >= ys[r], f"tile_{i}_{g}"
            prob += ms[r] <= n_i * ys[r], f"tmax_{i}_{g}"
        else:
            xs[r] = pulp.LpVariable(f"x_{i}_{g}", lowBound=0, upBound=Ti, cat=cat)
            prob += xs[r] <= Ti * ys[r], f"charge_{i}_{g}"
    by_e: dict[int, list[int]] = {}
    by_g: dict[int, list[int]] = {g: [] for g in range(p.num_gpus)}
    for r in idx.tolist():
        by_e.setdefault(int(p.pair_e[r]), []).append(r)
        by_g[int(p.pair_g[r])].append(r)
    for i, rs in by_e.items():
        if tile > 1:
            n_i = int(np.ceil(float(p.counts[i]) / tile - 1e-9))
            prob += pulp.lpSum(ms[r] for r in rs) >= n_i, f"serve_{i}"
        else:
            prob += pulp.lpSum(xs[r] for r in rs) == float(p.counts[i]), f"serve_{i}"
    for g, rs in by_g.items():
        n_expr = pulp.lpSum((tile * ms[r] if tile > 1 else xs[r]) for r in rs)
        g_expr = pulp.lpSum(ys[r] for r in rs)
        for k in range(len(p.alpha_s)):
            prob += (
                s * p.alpha_s[k] + s * p.slope_g[k] * g_expr + s * p.slope_n[k] * n_expr <= C,
                f"time_{g}_{k}",
            )
    prob += C
    solver, name = pulp_solver(time_limit_s, gap_rel)
    prob.solve(solver)
    error = highs_error(prob) if name == "highs" else None
    if error is not None:  # HiGHS's presolve can end in a solve error: retry without it
        left = max(time_limit_s - (time.perf_counter() - t0), 0.1 * time_limit_s)
        solver, name = pulp_solver(left, gap_rel, presolve=False)
        prob.solve(solver)
        error = highs_error(prob)
    bound: float | None = None
    if name == "highs" and error is None:
        db = float(prob.solverModel.getInfo().mip_dual_bound)
        if np.isfinite(db):
            bound = db / s
    have = prob.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
    proven = prob.sol_status == pulp.LpSolutionOptimal and error is None
    if prob.status in (pulp.LpStatusInfeasible, pulp.LpStatusUnbounded):
        raise SolverError(
            f"dispatch MILP reported {pulp.LpStatus[prob.status]}; it is always feasible, "
            "so this is a solver bug"
        )
    x = np.zeros(len(p.pair_e))
    if have and tile > 1:
        for i, rs in by_e.items():
            left = float(p.counts[i])
            for r in rs:
                cap = tile * round(float(ms[r].varValue or 0.0))
                x[r] = min(cap, left)
                left -= x[r]
    elif have:
        for r, v in xs.items():
            x[r] = max(0.0, float(v.varValue or 0.0))
        if integer:
            x = _round_split(p, x)
    if proven:
        mk = float(p.gpu_state(x)[3].max())
        # CBC gives no bound; an optimal solve is then its own bound.
        lb_opt = mk if bound is None else min(max(bound, 0.0), mk)
        return _result(p, "milp", x, t0, "optimal", lower_bound_s=lb_opt)
    lb = lower_bound(p).makespan_s if bound is None else max(bound, 0.0)
    cand = incumbent or dispatch_heuristic(p)
    x_best = x if have else cand.tokens[p.pair_e, p.pair_g]
    if have and cand.makespan_s < float(p.gpu_state(x)[3].max()):
        x_best = cand.tokens[p.pair_e, p.pair_g]
    status = "time_limit" if error is None else "solver_error"
    found = _result(p, "milp", x_best, t0, status, lower_bound_s=lb)
    gap = f"gap {100 * (found.gap or 0):.2f}% to the bound"
    if error is None:
        msg = (
            f"time limit {time_limit_s:g} s reached: best found, {gap}; raise "
            "--time-limit-s for a proof of optimality"
        )
    else:
        msg = (
            f"HiGHS stopped with '{error}' (with and without presolve): best found, {gap} "
            "(LP relaxation); not proven optimal"
        )
    return _result(p, "milp", x_best, t0, status, lower_bound_s=lb, message=msg)
