"""Mixture.quantile (bisection tree, several halvings per CDF call) and Mixture.quantiles
(several quantiles' trees in one CDF call) return what one halving per CDF evaluation
returns, bit for bit; the CDF is scipy's gamma mixture."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import special as sp

from perfmodel.serving.latency_laws import Mixture


def _sequential(m: Mixture, q: float) -> float:
    """The bisection as written before: one CDF evaluation per halving."""
    lo = float(m.base.min())
    hi = float(m.base.max() + 50 * max(float((m.shape * m.scale).max()), 1e-9))
    while hi - lo > 1e-9 * max(hi, 1e-9):
        mid = 0.5 * (lo + hi)
        if m.cdf(mid) < q:
            lo = mid
        else:
            hi = mid
    return hi


def _mixture(seed: int) -> Mixture:
    rng = np.random.default_rng(seed)
    k = 40
    w = rng.random(k)
    return Mixture(
        weights=w / w.sum(),
        base=rng.uniform(0.01, 0.2, k),
        p=np.where(rng.random(k) < 0.3, 0.0, 1.0),  # point masses (jumps) too
        shape=np.exp(rng.normal(0.0, 2.0, k)),
        scale=rng.uniform(0.0, 0.05, k),
    )


@pytest.mark.parametrize("seed", range(6))
def test_tree_quantile_is_the_sequential_bisection(seed: int) -> None:
    m = _mixture(seed)
    for q in (0.01, 0.3, 0.5, 0.9, 0.99, 0.999):
        assert m.quantile(q) == _sequential(m, q)


@pytest.mark.parametrize("seed", range(6, 12))
def test_quantiles_searched_together_are_each_sequential_bisection(seed: int) -> None:
    """Several quantiles in lockstep (the trees of those still searching, one CDF call
    per round): each is its own sequential bisection, whatever the others and the order."""
    m = _mixture(seed)
    qs = (0.99, 0.5, 0.9, 0.001, 0.5)
    assert m.quantiles(qs) == [_sequential(m, q) for q in qs]
    assert m.quantiles(()) == []
    calls: list[int] = []
    real = m._cdf_rows
    object.__setattr__(m, "_cdf_rows", lambda xs: calls.append(len(xs)) or real(xs))
    rounds = []
    for q in qs:
        calls.clear()
        m.quantile(q)
        rounds.append(len(calls))
    calls.clear()
    m.quantiles(qs)
    # one call per round, as many rounds as the longest search (~45 halvings, 3 a round)
    assert len(calls) == max(rounds) and calls[0] == 7 * len(qs)


def test_cdf_is_the_gamma_mixture() -> None:
    m = _mixture(11)
    for x in (0.0, 0.05, 0.12, 0.3, 1.0):
        y = x - m.base
        inner = np.where(
            m.scale > 0, sp.gammainc(m.shape, np.maximum(y, 0) / np.maximum(m.scale, 1e-300)), 1.0
        )
        ref = float(np.dot(m.weights, np.where(y < 0, 0.0, (1 - m.p) + m.p * inner)))
        assert m.cdf(x) == pytest.approx(ref, rel=1e-12, abs=1e-15)
    assert math.isinf(Mixture(*(np.ones(1),) * 5, unbounded=True).quantile(0.5))
    assert Mixture(*(np.ones(1),) * 5, unbounded=True).quantiles((0.5, 0.9)) == [math.inf] * 2
