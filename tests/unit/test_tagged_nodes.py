"""The stored 4-node Gauss–Legendre rule is numpy's, bit for bit."""

import numpy as np
import pytest

from perfmodel.serving.tagged import gauss_legendre


@pytest.mark.parametrize("n", [2, 4, 8])
def test_gauss_legendre_is_numpys(n: int) -> None:
    x, w = gauss_legendre(n)
    ref_x, ref_w = np.polynomial.legendre.leggauss(n)
    np.testing.assert_array_equal(x, ref_x)
    np.testing.assert_array_equal(w, ref_w)
