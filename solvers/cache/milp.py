"""The split MILP: one engine configuration and one adapter level under a memory budget.

Pools and what couples them
    The value of a split is SLO goodput ``λ·att`` (or ``−mean TPOT``) with, from
    :mod:`perfmodel.cache_serving`, ``att = γ_c − δ_c·m_a``: ``γ_c, δ_c`` depend on the
    *engine* ``c`` = (KV level, expert-cache level) and the adapter miss ratio ``m_a``
    on the adapter level ``a`` only. KV and expert cache are genuinely non-separable:
    ``μ = min(μ_compute/f_full(C), μ_memory(M)/f_mem(C, M))`` (the expert fetches slow
    the iteration by a factor that depends on the batch, which the KV sets) and TTFT and
    TPOT are non-linear functions of both through the queue; there is no sum of
    per-pool terms, nor a concave/convex structure a piecewise-linear model could use.
    So the engine stays one binary per admissible (KV, expert) pair. The adapter pool
    enters *bilinearly* (``δ_c·m_a``), which is linearized exactly, so adapters are not
    enumerated jointly with the engine: ``|KV|·|E| + 2·|A|`` variables instead of
    ``|KV|·|E|·|A|``.

Formulation (HiGHS through PuLP)::

    max   Σ_c v_c·y_c − Σ_a m_a·w_a                 v_c = λ·γ_c + tie_c, β_c = λ·δ_c
    s.t.  Σ_c y_c = 1,  Σ_a x_a = 1                  y, x binary (one level per pool)
          Σ_c bytes_c·y_c + Σ_a bytes_a·x_a ≤ budget                     (memory)
          u = Σ_c β_c·y_c,   s = Σ_c δ_c·y_c                     (engine's miss costs)
          w_a = u·x_a,  z_a = s·x_a    (McCormick, exact for binary x and 0 ≤ u ≤ β̄:
                w ≤ β̄·x,  w ≤ u,  w ≥ u − β̄·(1 − x),  w ≥ 0)
          Σ_c γ_c·y_c − Σ_a m_a·z_a ≥ goal                           (SLO attainment)

Only engines stable at ``λ`` get a ``y`` (instability does not depend on adapters).
Without adapters there is one adapter level with ``m = 0`` and no bytes. It is exact
on the grid: the tests compare it with :func:`brute_force_split` on random problems.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from perfmodel.errors import SolverError, SpecError
from solvers.pulp_solver import pulp_solver

Arr = NDArray[np.float64]


@dataclass(frozen=True)
class SplitProblem:
    """Engines (KV × expert levels) and adapter levels with their bytes and values.

    Value of (engine ``c``, adapter level ``a``): ``value_c − value_per_miss_c·m_a``;
    admissible iff ``engine_ok_c`` and ``attain_c − attain_per_miss_c·m_a ≥ goal``.
    """

    engine_bytes: Arr
    engine_ok: NDArray[np.bool_]
    value: Arr
    value_per_miss: Arr  # ≥ 0
    attain: Arr
    attain_per_miss: Arr  # ≥ 0
    adapter_bytes: Arr
    adapter_miss: Arr  # miss ratio in [0, 1]
    goal: float
    budget_bytes: float

    def __post_init__(self) -> None:
        n, k = np.shape(self.engine_bytes), np.shape(self.adapter_bytes)
        if len(n) != 1 or n[0] < 1 or len(k) != 1 or k[0] < 1:
            raise SpecError("a split problem needs at least one engine and one adapter level")
        for name in ("engine_ok", "value", "value_per_miss", "attain", "attain_per_miss"):
            if np.shape(getattr(self, name)) != n:
                raise SpecError(f"{name} must have one entry per engine ({n[0]})")
        if np.shape(self.adapter_miss) != k:
            raise SpecError(f"adapter_miss must have one entry per adapter level ({k[0]})")
        if np.any(np.asarray(self.value_per_miss) < 0) or np.any(
            np.asarray(self.attain_per_miss) < 0
        ):
            raise SpecError("the cost of an adapter miss must be >= 0")
        m = np.asarray(self.adapter_miss)
        if np.any(m < 0) or np.any(m > 1):
            raise SpecError("adapter miss ratios must be in [0, 1]")

    def bytes_of(self, engine: int, adapter: int) -> float:
        return float(self.engine_bytes[engine] + self.adapter_bytes[adapter])

    def value_of(self, engine: int, adapter: int) -> float:
        return float(self.value[engine] - self.value_per_miss[engine] * self.adapter_miss[adapter])

    def attain_of(self, engine: int, adapter: int) -> float:
        return float(
            self.attain[engine] - self.attain_per_miss[engine] * self.adapter_miss[adapter]
        )

    def admissible(self, engine: int, adapter: int) -> bool:
        return bool(self.engine_ok[engine]) and self.attain_of(engine, adapter) >= self.goal


@dataclass(frozen=True)
class SplitSolution:
    feasible: bool
    engine: int | None
    adapter: int | None
    objective: float
    bytes_used: float
    solver: str
    message: str


def _none(solver: str, why: str) -> SplitSolution:
    return SplitSolution(False, None, None, -math.inf, 0.0, solver, why)


def brute_force_split(problem: SplitProblem) -> SplitSolution:
    """Best admissible (engine, adapter level) within the budget by enumeration."""
    best: tuple[int, int] | None = None
    for c, a in itertools.product(range(problem.value.size), range(problem.adapter_miss.size)):
        if not problem.admissible(c, a) or problem.bytes_of(c, a) > problem.budget_bytes:
            continue
        if best is None or problem.value_of(c, a) > problem.value_of(*best):
            best = (c, a)
    if best is None:
        return _none("brute-force", "no admissible split")
    return SplitSolution(
        True, *best, problem.value_of(*best), problem.bytes_of(*best), "brute-force", "optimal"
    )


def solve_split(problem: SplitProblem, *, time_limit_s: float = 20.0) -> SplitSolution:
    """The MILP of the module docstring; infeasibility is a result, not an exception."""
    import pulp

    engines = [int(c) for c in np.flatnonzero(problem.engine_ok)]
    if not engines:
        return _none("milp", "no engine configuration is stable at the rate")
    levels = range(problem.adapter_miss.size)
    prob = pulp.LpProblem("cache_budget", pulp.LpMaximize)

    def var(name: str, cat: str = "Binary", up: float | None = None) -> pulp.LpVariable:
        if hasattr(prob, "add_variable"):  # PuLP >= 3.3; LpVariable(...) is deprecated there
            return prob.add_variable(name, lowBound=0, upBound=up, cat=cat)
        return pulp.LpVariable(name, lowBound=0, upBound=up, cat=cat)  # pragma: no cover

    y = {c: var(f"engine_{c}") for c in engines}
    x = {a: var(f"adapters_{a}") for a in levels}
    prob += pulp.lpSum(y.values()) == 1, "one_engine"
    prob += pulp.lpSum(x.values()) == 1, "one_adapter_level"
    scale = max(problem.budget_bytes, 1.0)  # bytes are ~1e10: keep the row well scaled
    prob += (
        pulp.lpSum(float(problem.engine_bytes[c]) / scale * y[c] for c in engines)
        + pulp.lpSum(float(problem.adapter_bytes[a]) / scale * x[a] for a in levels)
        <= problem.budget_bytes / scale + 1e-12,
        "memory_budget",
    )

    def product(name: str, coef: Arr) -> dict[int, pulp.LpVariable]:
        """``p_a = (Σ_c coef_c·y_c)·x_a`` by McCormick (exact: x binary, 0 ≤ Σ ≤ max)."""
        hi = max(float(np.max(coef[engines])), 0.0)
        s = pulp.lpSum(float(coef[c]) * y[c] for c in engines)
        p = {a: var(f"{name}_{a}", "Continuous", hi) for a in levels}
        for a in levels:
            prob.addConstraint(p[a] <= hi * x[a], f"{name}_le_x_{a}")
            prob.addConstraint(p[a] <= s, f"{name}_le_sum_{a}")
            prob.addConstraint(p[a] >= s - hi * (1 - x[a]), f"{name}_ge_{a}")
        return p

    w = product("value_lost", problem.value_per_miss)
    z = product("attain_lost", problem.attain_per_miss)
    m = problem.adapter_miss
    prob += (
        pulp.lpSum(float(problem.attain[c]) * y[c] for c in engines)
        - pulp.lpSum(float(m[a]) * z[a] for a in levels)
        >= problem.goal,
        "slo_goal",
    )
    prob += pulp.lpSum(float(problem.value[c]) * y[c] for c in engines) - pulp.lpSum(
        float(m[a]) * w[a] for a in levels
    )
    prob.solve(pulp_solver(time_limit_s)[0])
    status = pulp.LpStatus[prob.status]
    if status == "Infeasible":
        return _none("milp", "no admissible split fits the memory budget")
    if status != "Optimal":
        raise SolverError(f"cache-budget MILP ended with status {status!r} (time limit?)")
    ce = [c for c in engines if (y[c].value() or 0.0) > 0.5]
    ae = [a for a in levels if (x[a].value() or 0.0) > 0.5]
    if len(ce) != 1 or len(ae) != 1:
        raise SolverError("cache-budget MILP returned a non-integral split")
    c, a = ce[0], ae[0]
    if not problem.admissible(c, a) and problem.attain_of(c, a) < problem.goal - 1e-7:
        raise SolverError("cache-budget MILP chose a split that misses the SLO goal")
    return SplitSolution(
        True, c, a, problem.value_of(c, a), problem.bytes_of(c, a), "milp", "optimal"
    )
