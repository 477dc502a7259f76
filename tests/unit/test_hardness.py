"""NP-hardness reduction (brute force) and the two polynomial limits vs the MILP."""

from __future__ import annotations

import numpy as np
import pytest

from hardware.maxaffine import MaxAffine
from perfmodel.errors import SpecError
from solvers.dispatch.hardness import (
    has_equal_partition,
    partition_instance,
    solve_activation_limit,
    solve_token_limit,
)
from solvers.dispatch.solve import Placement, make_problem, solve_milp


def test_partition_brute_force_hand_cases() -> None:
    assert has_equal_partition([1, 2, 3, 4])  # {1,4} vs {2,3}
    assert not has_equal_partition([1, 1, 1, 5])  # sum 8, no pair sums to 4
    assert not has_equal_partition([1, 2, 3, 5])  # odd total


@pytest.mark.parametrize("seed", range(12))
def test_reduction_optimum_is_W_iff_partition(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.choice([4, 6, 8]))
    w = rng.integers(1, 15, size=n)
    if w.sum() % 2:
        w[0] += 1
    p, W = partition_instance(w)
    r = solve_milp(p, time_limit_s=10)
    assert r.status == "optimal"
    assert r.makespan_s >= W - 1e-9  # N_1 + N_2 = 2W
    yes = has_equal_partition(w)
    assert (abs(r.makespan_s - W) < 1e-6) == yes
    if yes:  # the optimum is the partition: n/2 unsplit experts per GPU
        assert r.activated.tolist() == [n / 2, n / 2]
        assert r.gpu_tokens.tolist() == [W, W]


def _random_placement(rng: np.random.Generator, E: int, G: int) -> Placement:
    rep = (rng.random((E, G)) < 0.4).astype(np.int64)
    rep[np.arange(E), rng.integers(0, G, E)] = 1
    return Placement(rep)


@pytest.mark.parametrize("seed", range(8))
def test_beta_zero_flow_matches_milp(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    E, G = int(rng.integers(6, 16)), int(rng.integers(2, 5))
    prof = MaxAffine(("G", "N"), np.array([3.0, 1.0]), np.array([[2.0, 0.0], [0.5, 0.0]]))
    p = make_problem(rng.integers(0, 60, E), _random_placement(rng, E, G), prof, tile_rows=1)
    f = solve_activation_limit(p)
    m = solve_milp(p)
    assert f.makespan_s == pytest.approx(m.makespan_s, rel=1e-9)
    # Never split (METRO's Lemma 1): each active expert on exactly one GPU.
    assert np.all((f.tokens > 0).sum(axis=1) == (p.counts > 0))


@pytest.mark.parametrize("seed", range(8))
def test_b_zero_lp_matches_milp(seed: int) -> None:
    rng = np.random.default_rng(200 + seed)
    E, G = int(rng.integers(6, 16)), int(rng.integers(2, 5))
    prof = MaxAffine(("G", "N"), np.array([1.0, 0.4]), np.array([[0.0, 0.01], [0.0, 0.02]]))
    p = make_problem(rng.integers(0, 80, E), _random_placement(rng, E, G), prof, tile_rows=1)
    lp = solve_token_limit(p)
    m = solve_milp(p, integer=False)
    assert lp.makespan_s == pytest.approx(m.makespan_s, rel=1e-7)


def test_limits_reject_wrong_profiles() -> None:
    p, _ = partition_instance([1, 2, 3, 4])  # has both b and beta
    with pytest.raises(SpecError, match="no per-token slope"):
        solve_activation_limit(p)
    with pytest.raises(SpecError, match="no per-replica slope"):
        solve_token_limit(p)
    with pytest.raises(SpecError, match="even number"):
        partition_instance([1, 2, 3])
