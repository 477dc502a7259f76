"""The split MILP (engines × adapter levels, bilinear miss term) against brute force."""

from __future__ import annotations

import numpy as np
import pytest

from perfmodel.errors import SpecError
from perfmodel.units import GiB
from solvers.cache.milp import SplitProblem, brute_force_split, solve_split


def _random_problem(rng: np.random.Generator) -> SplitProblem:
    n_eng = int(rng.integers(1, 13))
    n_ad = int(rng.integers(1, 6))
    eng_b = rng.uniform(1.0, 20.0, n_eng) * GiB
    ad_b = np.sort(rng.uniform(0.0, 6.0, n_ad)) * GiB
    attain = rng.uniform(0.5, 1.0, n_eng)
    attain_per_miss = rng.uniform(0.0, 1.0, n_eng) * attain
    lam = rng.uniform(0.5, 10.0)
    miss = np.sort(rng.uniform(0.0, 1.0, n_ad))[::-1]  # more resident -> fewer misses
    budget = rng.uniform(0.4, 1.0) * (eng_b.max() + ad_b.max())
    return SplitProblem(
        engine_bytes=eng_b,
        engine_ok=rng.random(n_eng) < 0.8,
        value=lam * attain + rng.normal(0, 0.05, n_eng),
        value_per_miss=lam * attain_per_miss,
        attain=attain,
        attain_per_miss=attain_per_miss,
        adapter_bytes=ad_b,
        adapter_miss=miss,
        goal=float(rng.uniform(0.2, 0.8)),
        budget_bytes=budget,
    )


def test_milp_equals_brute_force_on_random_cases() -> None:
    rng = np.random.default_rng(2024)
    n_feasible = n_infeasible = 0
    for _ in range(40):
        p = _random_problem(rng)
        milp, brute = solve_split(p), brute_force_split(p)
        assert milp.feasible == brute.feasible
        if brute.feasible:
            n_feasible += 1
            assert (milp.engine, milp.adapter) == (brute.engine, brute.adapter)
            assert milp.objective == pytest.approx(brute.objective, rel=1e-9)
            assert milp.bytes_used <= p.budget_bytes * (1 + 1e-9)
            assert p.attain_of(milp.engine, milp.adapter) >= p.goal  # type: ignore[arg-type]
        else:
            n_infeasible += 1
    assert n_feasible >= 20 and n_infeasible >= 1


def test_bilinear_miss_term_picks_the_adapter_level_by_hand() -> None:
    # Two engines, three adapter levels. Engine 0: value 10, loses 8 per unit miss ratio;
    # engine 1: value 9, loses 1. Levels miss 0.5 / 0.2 / 0.0 and cost 0 / 2 / 6 GiB.
    # Budget 10 GiB; engines take 4 and 8 GiB.
    #   (0,0): 10−4 = 6   (0,1): 10−1.6 = 8.4   (0,2): 10 (6+4 = 10 GiB fits)
    #   (1,0): 8.5        (1,1): 8.8 (10 GiB)   (1,2): over budget
    p = SplitProblem(
        engine_bytes=np.array([4.0, 8.0]) * GiB,
        engine_ok=np.array([True, True]),
        value=np.array([10.0, 9.0]),
        value_per_miss=np.array([8.0, 1.0]),
        attain=np.array([1.0, 1.0]),
        attain_per_miss=np.array([0.8, 0.1]),
        adapter_bytes=np.array([0.0, 2.0, 6.0]) * GiB,
        adapter_miss=np.array([0.5, 0.2, 0.0]),
        goal=0.5,
        budget_bytes=10.0 * GiB,
    )
    s = solve_split(p)
    assert (s.engine, s.adapter) == (0, 2) and s.objective == pytest.approx(10.0)
    # a 9 GiB budget drops (0,2): the best left is (1,0) at 8.5 over (0,1) at 8.4
    tight = SplitProblem(**{**p.__dict__, "budget_bytes": 9.0 * GiB})
    s = solve_split(tight)
    assert (s.engine, s.adapter) == (1, 0) and s.objective == pytest.approx(8.5)
    # SLO goal 0.9 (attainment 1 − δ·m): (0,1) has 0.84 and drops out, (1,0) has 0.95
    lower = SplitProblem(**{**tight.__dict__, "value": np.array([10.0, 8.8])})
    assert (solve_split(lower).engine, solve_split(lower).adapter) == (0, 1)  # 8.4 > 8.3
    goal = SplitProblem(**{**lower.__dict__, "goal": 0.9})
    s = solve_split(goal)
    assert (s.engine, s.adapter) == (1, 0) and s.objective == pytest.approx(8.3)
    strict = SplitProblem(**{**goal.__dict__, "goal": 0.96})
    assert not solve_split(strict).feasible and not brute_force_split(strict).feasible


def test_infeasible_knapsack_is_a_result() -> None:
    p = SplitProblem(
        engine_bytes=np.array([5.0, 6.0]) * GiB,
        engine_ok=np.array([True, True]),
        value=np.array([1.0, 2.0]),
        value_per_miss=np.zeros(2),
        attain=np.ones(2),
        attain_per_miss=np.zeros(2),
        adapter_bytes=np.zeros(1),
        adapter_miss=np.zeros(1),
        goal=0.9,
        budget_bytes=4.0 * GiB,
    )
    assert not solve_split(p).feasible and not brute_force_split(p).feasible


def test_bad_problem_shapes_are_rejected() -> None:
    with pytest.raises(SpecError, match="one entry per engine"):
        SplitProblem(
            np.ones(2), np.ones(3, bool), np.ones(2), np.zeros(2), np.ones(2), np.zeros(2),
            np.zeros(1), np.zeros(1), 0.5, 1.0,
        )  # fmt: skip
    with pytest.raises(SpecError, match=r"miss ratios must be in \[0, 1\]"):
        SplitProblem(
            np.ones(1), np.ones(1, bool), np.ones(1), np.zeros(1), np.ones(1), np.zeros(1),
            np.zeros(1), np.array([1.5]), 0.5, 1.0,
        )  # fmt: skip
