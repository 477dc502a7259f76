"""The tagged request's shortcuts equal what they replace, bit for bit: the stored
4-node Gauss–Legendre rule, the before/after-arrival transforms, the leftover transform."""

import numpy as np
import pytest

from perfmodel.serving.tagged import gauss_legendre


@pytest.mark.parametrize("n", [2, 4, 8])
def test_gauss_legendre_is_numpys(n: int) -> None:
    x, w = gauss_legendre(n)
    ref_x, ref_w = np.polynomial.legendre.leggauss(n)
    np.testing.assert_array_equal(x, ref_x)
    np.testing.assert_array_equal(w, ref_w)


@pytest.mark.parametrize("nodes", [4, 5, 8])
def test_the_position_transforms_are_the_compound_poisson_transforms(nodes: int) -> None:
    """``_position_transforms`` equals ``cp_transform`` of the before-arrival rates
    ``r·v_j`` and the after-arrival rates ``r·(1 − v_j)`` within a few ulps, though it
    takes the upper half of the positions by division (``V = 4``: 3 exponentials per
    rate instead of 8); odd ``V`` has a middle node whose two are the same."""
    from perfmodel.serving.compound_poisson import cp_transform
    from perfmodel.serving.tagged import _position_transforms, gauss_legendre

    rng = np.random.default_rng(nodes)
    f = rng.random(60)
    F = np.fft.rfft(f / f.sum(), 256)
    rates = np.sort(rng.random(33)) * 12.0  # up to 12 expected arrivals in an iteration
    x, _ = gauss_legendre(nodes)
    v = (x + 1) / 2
    before, after = _position_transforms(rates, v, F)
    for got, pos in ((before, v), (after, 1 - v)):
        want = cp_transform(np.multiply.outer(rates, pos), F)
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-300)
    assert np.array_equal(after, before[:, ::-1])


def test_the_position_transforms_survive_underflow() -> None:
    """Thousands of arrivals per iteration (1-token prompts at a huge rate): the
    exponentials underflow to 0 at high frequencies, where a division would give 0/0.
    The transforms stay finite and equal to ``cp_transform``'s."""
    from perfmodel.serving.compound_poisson import cp_transform
    from perfmodel.serving.tagged import _position_transforms, gauss_legendre

    f = np.zeros(8)
    f[1] = 1.0  # every prompt one grid step: F = e^{−iω}, down to −1 at Nyquist
    F = np.fft.rfft(f, 64)
    rates = np.array([5.0, 400.0, 3000.0])
    x, _ = gauss_legendre(4)
    v = (x + 1) / 2
    before, _ = _position_transforms(rates, v, F)
    assert np.isfinite(before).all()
    want = cp_transform(np.multiply.outer(rates, v), F)
    assert (want == 0).any()  # the case: underflow
    # exp of an argument of modulus ~6,000 is conditioned to ~6,000 ulps either way; where
    # the dividend is subnormal only the absolute error is small (≤ 10⁻¹⁷³)
    np.testing.assert_allclose(before, want, rtol=2e-12, atol=1e-170)


@pytest.mark.parametrize(("G", "n"), [(32, 705), (16, 2049), (4, 9)])
def test_the_leftover_transform_is_the_fft_of_the_leftover_rows(G: int, n: int) -> None:
    """``_leftover_transform`` equals the ``rfft`` of the ``(G + 1) × n`` leftover rows
    (class ``p < G``: its weight at 0; class ``G``: the states above ``G`` shifted
    down), to the bit."""
    from perfmodel.serving.compound_poisson import fft_size
    from perfmodel.serving.tagged import _leftover_transform

    w = np.random.default_rng(G).random(n)
    w /= w.sum()
    size = fft_size(2 * n + 3 * G)
    rows = np.zeros((G + 1, n))
    rows[np.arange(G), 0] = w[:G]
    rows[G, : n - G] = w[G:]
    np.testing.assert_array_equal(_leftover_transform(w, G, size), np.fft.rfft(rows, size, axis=1))
