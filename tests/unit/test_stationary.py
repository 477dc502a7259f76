"""perfmodel.serving.stationary: the censored (block GTH) solve against a dense reference."""

from __future__ import annotations

import numpy as np
import pytest

from perfmodel.serving import stationary as st
from perfmodel.serving.compound_poisson import compound_poisson


def _arrivals(G: int, n: int, rate: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    f = rng.random(3 * G)
    f[: G // 2] = 0.0
    f /= f.sum()
    tau = 0.01 + 0.002 * np.arange(G + 1)
    return compound_poisson(rate * tau, f, n)


def _matrix(a: np.ndarray) -> np.ndarray:
    """``T`` assembled densely from its definition (entries below TINY dropped)."""
    G, n = a.shape[0] - 1, a.shape[1]
    clean = np.where(a > st.TINY, a, 0.0)
    T = np.zeros((n, n))
    T[: min(G + 1, n), : n - 1] = clean[: min(G + 1, n), : n - 1]
    for i in range(G + 1, n):
        T[i, i - G : n - 1] = clean[G][: n - 1 - i + G]
    T[:, -1] = 1.0 - T[:, :-1].sum(axis=1)
    return T


def _dense_reference(a: np.ndarray) -> np.ndarray:
    """π from LAPACK's dense LU: ``π(T − I) = 0`` with the last balance replaced by ``Σπ = 1``."""
    T = _matrix(a)
    n = T.shape[0]
    m = (T - np.eye(n)).T
    m[-1] = 1.0
    rhs = np.zeros(n)
    rhs[-1] = 1.0
    return np.linalg.solve(m, rhs)


@pytest.mark.parametrize(
    ("G", "n", "rate"),
    [
        (8, 33, 20.0),  # one block (b = 64 > n)
        (32, 193, 9.0),  # three full blocks
        (32, 161, 9.0),  # a short top block (n − 1 = 160 is not a multiple of 64)
        (16, 385, 14.0),  # many blocks, G = 16 (the halved grid)
        (12, 241, 16.0),  # G does not divide 64: blocks of 60
        (8, 6, 20.0),  # a grid smaller than one budget: no shifted rows at all
    ],
)
def test_censoring_matches_the_dense_solve(G: int, n: int, rate: float) -> None:
    a = _arrivals(G, n, rate, seed=G + n)
    pi = st.stationary(a)
    ref = _dense_reference(a)
    np.testing.assert_allclose(pi, ref, rtol=1e-9, atol=1e-15)
    assert pi.sum() == pytest.approx(1.0, abs=1e-14)
    assert np.allclose(pi @ _matrix(a), pi, atol=1e-14)


def test_narrow_band_on_a_long_grid() -> None:
    """Arrivals that reach only a few states (sparse pmf) on a 513-state grid."""
    G, n = 8, 8 * 64 + 1
    f = np.zeros(G + 2)
    f[[2, 5, 9]] = [0.5, 0.3, 0.2]
    a = compound_poisson(0.02 * 40.0 * np.ones(G + 1), f, n)
    pi = st.stationary(a)
    np.testing.assert_allclose(pi, _dense_reference(a), rtol=1e-9, atol=1e-15)


def test_light_load_keeps_small_probabilities_accurate() -> None:
    """At a very low rate the chain rarely leaves 0: π of the other states is ~1e-9 and
    below, and each state's own balance still holds to relative accuracy (the censoring
    only adds non-negative terms but in its block solves). Not the lumped top state: its
    column is a complement, ``1 − Σ``, accurate only to ~1e-16 absolute."""
    G, n = 16, 16 * 8 + 1
    a = _arrivals(G, n, rate=1e-6, seed=3)
    pi = st.stationary(a)
    T = _matrix(a)
    big = pi > 1e-200
    big[-1] = False
    assert pi[1:].sum() < 1e-6  # mostly idle
    balance = pi @ T
    np.testing.assert_allclose(balance[big], pi[big], rtol=1e-11)
