"""The two solves of perfmodel.serving.stationary give the same π (and π·T = π)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.linalg import solve_banded

from perfmodel.serving import stationary as st
from perfmodel.serving.prefill_chain import compound_poisson


def _arrivals(G: int, levels: int, rate: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    f = rng.random(3 * G)
    f[: G // 2] = 0.0
    f /= f.sum()
    tau = 0.01 + 0.002 * np.arange(G + 1)
    return compound_poisson(rate * tau, f, levels * G + 1)


def _by_band(a: np.ndarray) -> np.ndarray:
    """π from the banded system solved by LAPACK gbsv (the solve before the dense path)."""
    G, n = a.shape[0] - 1, a.shape[1]
    clean = np.where(a[:, : n - 1] > st.TINY, a[:, : n - 1], 0.0)
    nz = clean > 0
    last = np.where(nz.any(axis=1), n - 2 - np.argmax(nz[:, ::-1], axis=1), 0)
    reach = int(np.nonzero(clean[G])[0].max(initial=0))
    w = max(int((last - np.arange(G + 1)).max()), reach - G, 0)
    rhs = -clean[0]
    rhs[0] += 1.0
    x = solve_banded((w + 1, G - 1), st._band_system(clean, G, n, w), rhs)
    pi = np.maximum(np.concatenate([[1.0], x]), 0.0)
    return pi / pi.sum()


@pytest.mark.parametrize(("G", "levels", "rate"), [(8, 4, 20.0), (32, 6, 9.0), (16, 24, 14.0)])
def test_dense_and_banded_agree(G: int, levels: int, rate: float) -> None:
    a = _arrivals(G, levels, rate, seed=G + levels)
    pi = st.stationary(a)
    np.testing.assert_allclose(pi, _by_band(a), rtol=1e-11, atol=1e-16)
    # and π is invariant: π·T with T assembled densely from its definition
    n = a.shape[1]
    T = np.zeros((n, n))
    T[: G + 1] = a
    for i in range(G + 1, n):
        T[i, i - G :] = a[G][: n - i + G]
        T[i, -1] += 1 - T[i].sum()
    assert np.allclose(pi @ T, pi, atol=1e-13)


def test_narrow_band_takes_the_banded_solve(monkeypatch: pytest.MonkeyPatch) -> None:
    """A short arrival reach on a long grid: LAPACK's banded solve, the same π."""
    G, n = 8, 8 * 64 + 1
    f = np.zeros(G + 2)
    f[[2, 5, 9]] = [0.5, 0.3, 0.2]
    a = compound_poisson(0.02 * 40.0 * np.ones(G + 1), f, n)

    def no_dense(*args: object) -> np.ndarray:
        raise AssertionError("the dense system was built")

    monkeypatch.setattr(st, "_dense_system", no_dense)
    pi = st.stationary(a)
    np.testing.assert_allclose(pi, _by_band(a), rtol=1e-13, atol=1e-300)
    assert pi.sum() == pytest.approx(1.0)
