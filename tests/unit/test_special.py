"""perfmodel.special against scipy.special over grids: the values the CLI's start-up path
computes without scipy must be scipy's to ~1e-12."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import special as sp

from perfmodel import special

SHAPES = np.concatenate(
    [np.geomspace(1e-5, 1e4, 181), [0.5, 1.0, 1.5, 2.0, 9.999, 10.0, 10.001, 84.47, 1000.0]]
)


def _args(a: float) -> np.ndarray:
    """x around a (the bulk, in units of √a) and far into both tails."""
    s = np.sqrt(a)
    near = a + s * np.linspace(-12, 12, 97)
    far = np.concatenate([np.geomspace(1e-300, 1e3, 80) * max(a, 1.0), [a, a + 1, 1.0]])
    x = np.concatenate([near, far])
    return np.unique(x[x > 0])


def test_gammainc_matches_scipy_over_grid() -> None:
    worst = 0.0
    for a in SHAPES:
        x = _args(float(a))
        ours = special.gammainc(a, x)
        ref = sp.gammainc(a, x)
        # relative error where the value is not tiny; absolute (≤ 1e-15) where it is
        err = np.abs(ours - ref) / np.maximum(ref, 1e-3)
        worst = max(worst, float(err.max()))
        assert np.all(np.abs(ours - ref) <= 1e-12 * ref + 1e-15), a
        lower = ref > 1e-280  # the lower tail, relatively, down to underflow
        assert np.all(np.abs(ours - ref)[lower] <= 1e-12 * ref[lower]), a
    assert worst < 1e-12


def test_gammainc_broadcasts_and_edges() -> None:
    a = np.array([[0.3], [2.0], [50.0]])
    x = np.array([0.0, 0.1, 1.0, 40.0, np.inf])
    np.testing.assert_allclose(special.gammainc(a, x), sp.gammainc(a, x), rtol=1e-12, atol=0)
    assert special.gammainc(2.0, 0.0) == 0.0
    assert np.isnan(special.gammainc(-1.0, 1.0))
    # above the series' range, scipy's own value
    assert special.gammainc(2e4, 2e4 + 50.0) == sp.gammainc(2e4, 2e4 + 50.0)


def test_gammainc_integer_shape_is_the_poisson_tail() -> None:
    """By hand: P(k, x) = 1 − e^{−x} Σ_{j<k} x^j/j!."""
    x = 3.7
    for k in range(1, 12):
        tail = np.exp(-x) * sum(x**j / np.prod(np.arange(1, j + 1)) for j in range(k))
        assert special.gammainc(k, x) == pytest.approx(1.0 - tail, rel=1e-13)


def test_ndtr_ndtri_match_scipy() -> None:
    z = np.linspace(-37, 8, 2001)  # below −37.5 scipy flushes the denormals to 0
    assert all(
        special.ndtr(float(v)) == pytest.approx(float(sp.ndtr(v)), rel=1e-12, abs=0) for v in z
    )
    p = np.concatenate([np.geomspace(1e-300, 0.5, 400), 1 - np.geomspace(1e-16, 0.5, 400)])
    np.testing.assert_allclose(special.ndtri(p), sp.ndtri(p), rtol=1e-13, atol=1e-15)
    assert special.ndtri([0.0, 1.0]).tolist() == [-np.inf, np.inf]
    assert special.ndtri(0.5) == 0.0


@pytest.mark.parametrize("rate", [1e-3, 0.7, 5.0, 63.2, 400.0, 3000.0])
def test_poisson_cdf_and_pmf_match_scipy(rate: float) -> None:
    k = np.arange(int(rate + 12 * np.sqrt(rate) + 40) + 1)
    ref = sp.pdtr(k, rate)
    np.testing.assert_allclose(special.poisson_cdf(int(k[-1]), rate), ref, rtol=1e-12, atol=1e-15)
    # scipy's own pmf, exp(xlogy(k, λ) − λ − gammaln(k + 1)), is off by ~ε·λ·log λ relatively
    pmf = np.exp(sp.xlogy(k, rate) - rate - sp.gammaln(k + 1.0))
    rtol = max(1e-12, 1e-15 * rate * np.log(rate))
    np.testing.assert_allclose(special.poisson_pmf(k, rate), pmf, rtol=rtol, atol=1e-300)


def test_vectorized_normal_cdf_and_its_log_match_scipy() -> None:
    """``ndtr_array`` and ``log_ndtr`` (the PD decode CDFs) equal scipy's to 1e-12
    relative from −60 to 40, across the switch to the asymptotic series at −37, at ±inf,
    and keep NaN (the exponentially modified normal's CDF feeds them arrays)."""
    x = np.concatenate([np.linspace(-60, 40, 20001), [-1e3, -37.0001, -37.0, -36.9999, 0.0]])
    ref = sp.ndtr(x)
    ours = special.ndtr_array(x)
    live = ref > 1e-290
    assert np.all(np.abs(ours - ref)[live] <= 1e-12 * ref[live])
    lref, lours = sp.log_ndtr(x), special.log_ndtr(x)
    assert np.all(np.abs(lours - lref) <= 1e-12 * np.maximum(np.abs(lref), 1e-290))
    # far below underflow the series still gives log Φ (scipy: −500,007.0 at −1000)
    assert lours[x == -1e3][0] == pytest.approx(lref[x == -1e3][0], rel=1e-14)
    edge = special.log_ndtr(np.array([np.inf, -np.inf, np.nan]))
    assert edge[0] == 0.0 and edge[1] == -np.inf and np.isnan(edge[2])
    assert np.isnan(special.ndtr_array(np.array([np.nan])))[0]


def test_distinct_sorted_is_np_unique() -> None:
    """The PD planner's grids: np.unique's values (ascending, each once), without its
    import of numpy.ma; random arrays with repeats, ±0, a sorted one, one value, none."""
    rng = np.random.default_rng(3)
    cases = [
        rng.integers(0, 20, 200).astype(float) / 4,
        np.concatenate([np.linspace(0, 40, 513), np.arange(0, 9)]),
        np.rint(np.geomspace(1.0, 1 << 17, 241)),
        rng.normal(size=50),
        np.array([7.0]),
        np.array([]),
        np.array([0.0, -0.0, 1.0]),
    ]
    for x in cases:
        got, want = special.distinct_sorted(x), np.unique(x)
        assert got.dtype == np.float64
        assert np.array_equal(got, want)
