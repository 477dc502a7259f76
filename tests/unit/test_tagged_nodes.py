"""The tagged request's shortcuts equal what they replace, bit for bit: the stored
4-node Gauss–Legendre rule, the mirrored after-arrival transform, the leftover transform."""

import numpy as np
import pytest

from perfmodel.serving.tagged import gauss_legendre


@pytest.mark.parametrize("n", [2, 4, 8])
def test_gauss_legendre_is_numpys(n: int) -> None:
    x, w = gauss_legendre(n)
    ref_x, ref_w = np.polynomial.legendre.leggauss(n)
    np.testing.assert_array_equal(x, ref_x)
    np.testing.assert_array_equal(w, ref_w)


def test_the_after_transform_reuses_mirrored_columns_bit_for_bit() -> None:
    """``_mirrored_transform`` equals ``cp_transform`` of the after-arrival rates exactly:
    the columns whose ``1 − v_j`` is exactly ``v_{V−1−j}`` (three of four at V_NODES = 4)
    are taken from the before-arrival transform, the others computed."""
    from perfmodel.serving.compound_poisson import cp_transform
    from perfmodel.serving.prefill_chain import V_NODES
    from perfmodel.serving.tagged import _mirrored_transform, gauss_legendre

    rng = np.random.default_rng(3)
    f = rng.random(60)
    F = np.fft.rfft(f / f.sum(), 256)
    tau_p = np.sort(rng.random(33)) * 0.05
    lam = 7.3
    nodes, _ = gauss_legendre(V_NODES)
    for v in ((nodes + 1) / 2, np.sort(rng.random(5))):  # the nodes; positions not mirrored
        after = 1 - v
        before_hat = cp_transform(lam * np.outer(tau_p, v), F)
        rates = lam * np.outer(tau_p, after)
        got = _mirrored_transform(rates, after, v, before_hat, F)
        assert np.array_equal(got, cp_transform(rates, F))
    v = (nodes + 1) / 2
    assert int(((1 - v) == v[::-1]).sum()) == 3  # what the reuse saves at V_NODES = 4


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
