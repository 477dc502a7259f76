"""Exact token balancing by parametric max-flow, against hand values, the LP and an
independent max-flow (networkx) for the activation level."""

from __future__ import annotations

import numpy as np
import pytest

from hardware.maxaffine import MaxAffine
from solvers.dispatch.hardness import solve_activation_limit
from solvers.dispatch.solve import Placement, dispatch_token, make_problem, token_lp
from solvers.dispatch.token_balance import SUBSET_MAX_GPUS, subset_levels, token_balance


def _check_split(X: np.ndarray, counts: np.ndarray, mask: np.ndarray) -> None:
    assert X.sum(axis=1) == pytest.approx(counts)
    assert np.all(X >= 0) and np.all(X[~mask] == 0)


def test_hand_instance_fractional_level() -> None:
    # GPUs {0,1,2}. A: 6 tokens only on 0; B: 9 on {0,1}; C: 4 only on 2; D: 2 on {1,2}.
    # W({0,1}) = 15 over 2 GPUs -> L* = 7.5 (W({0}) = 6, W(all) = 21/3 = 7, W({2}) = 4).
    counts = np.array([6.0, 9.0, 4.0, 2.0])
    mask = np.array([[1, 0, 0], [1, 1, 0], [0, 0, 1], [0, 1, 1]], dtype=bool)
    assert subset_levels(counts, mask)[0] == pytest.approx(7.5)
    cont = token_balance(counts, mask, integer=False)
    assert cont.level == pytest.approx(7.5)
    # GPUs 0 and 1 are the tight cut: both exactly 7.5, so D must sit on GPU 2.
    assert cont.tokens.sum(axis=0) == pytest.approx([7.5, 7.5, 6.0])
    _check_split(cont.tokens, counts, mask)
    integ = token_balance(counts, mask, integer=True)
    assert integ.level == 8.0  # ⌈7.5⌉, reachable with integers (flow integrality)
    assert np.all(integ.tokens == np.round(integ.tokens))
    _check_split(integ.tokens, counts, mask)


def test_token_proxy_example() -> None:
    # 10 tokens of expert 0 on both GPUs, 6 of expert 1 only on GPU 1: best max = 8.
    tb = token_balance(np.array([10.0, 6.0]), np.array([[1, 1], [0, 1]], dtype=bool))
    assert tb.tokens.tolist() == [[8.0, 2.0], [0.0, 6.0]] and tb.level == 8.0


def _random_instance(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    G = int(rng.choice([2, 3, 5, 8, 12, 16, 24]))
    E = int(rng.integers(G, 200))
    mask = rng.random((E, G)) < rng.uniform(0.05, 0.5)
    mask[np.arange(E), rng.integers(0, G, E)] = True
    counts = np.floor(rng.pareto(rng.uniform(0.5, 3.0), E) * rng.uniform(1, 300))
    counts[rng.random(E) < 0.1] = 0.0
    return counts, mask


@pytest.mark.parametrize("seed", range(4))
def test_flow_matches_lp_optimum(seed: int) -> None:
    # 60 random placements per seed, 2-24 GPUs (subset formula up to 12, Newton steps
    # beyond): the flow's level equals the LP's optimum; integer splits reach ⌈L*⌉.
    prof = MaxAffine(("G", "N"), np.zeros(2), np.array([[1.0, 0.0], [0.0, 0.01]]))
    rng = np.random.default_rng(1000 + seed)
    used_newton = False
    for _ in range(60):
        counts, mask = _random_instance(rng)
        used_newton |= mask.shape[1] > SUBSET_MAX_GPUS
        _, lp_level = token_lp(make_problem(counts, Placement(mask.astype(np.int64)), prof))
        cont = token_balance(counts, mask, integer=False)
        assert cont.level == pytest.approx(lp_level, rel=1e-9, abs=1e-9)
        _check_split(cont.tokens, counts, mask)
        integ = token_balance(counts, mask, integer=True)
        assert integ.level == np.ceil(lp_level - 1e-7)
        assert np.all(integ.tokens == np.round(integ.tokens))
        _check_split(integ.tokens, counts, mask)
    assert used_newton


def test_dispatch_token_flow_vs_lp_rounding() -> None:
    # Both solve LPLB's objective; the flow reaches the integer optimum ⌈L*⌉ exactly,
    # the LP rounded by largest remainder can only be worse or equal.
    prof = MaxAffine(("G", "N"), np.zeros(2), np.array([[1.0, 0.0], [0.0, 0.01]]))
    rng = np.random.default_rng(7)
    for _ in range(20):
        counts, mask = _random_instance(rng)
        p = make_problem(counts, Placement(mask.astype(np.int64)), prof, tile_rows=1)
        _, level = token_lp(p)
        flow, lp = dispatch_token(p), dispatch_token(p, solver="lp")
        assert flow.gpu_tokens.max() == np.ceil(level - 1e-7)
        assert flow.gpu_tokens.max() <= lp.gpu_tokens.max()


@pytest.mark.parametrize("seed", range(6))
def test_activation_level_is_the_b_matching_optimum(seed: int) -> None:
    # Unit weights: ⌈λ*⌉ from the subset formula and the flow's assignment (each expert
    # whole on one replica) equal the fewest activations found by an independent
    # networkx max-flow binary search (solvers.hardness, the β = 0 limit).
    rng = np.random.default_rng(300 + seed)
    E, G = int(rng.integers(8, 40)), int(rng.integers(2, 7))
    mask = rng.random((E, G)) < 0.3
    mask[np.arange(E), rng.integers(0, G, E)] = True
    counts = rng.integers(0, 50, E).astype(float)
    unit = (counts > 0).astype(float)
    lam = float(subset_levels(unit, mask)[0])
    tb = token_balance(unit, mask, integer=True)
    assert np.all((tb.tokens > 0).sum(axis=1) == unit)  # never split
    prof = MaxAffine(("G", "N"), np.zeros(1), np.array([[1.0, 0.0]]))
    ref = solve_activation_limit(make_problem(counts, Placement(mask.astype(np.int64)), prof))
    assert tb.level == np.ceil(lam - 1e-9) == ref.activated.max()
