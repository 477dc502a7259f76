"""The scipy.special Poisson helpers agree exactly with scipy.stats (which the CLI avoids)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from perfmodel.serving.poisson import poisson_pmf, poisson_ppf


@pytest.mark.parametrize("rate", [1e-3, 0.1, 0.5, 1.0, 2.7, 10.0, 37.3, 100.0, 1000.0, 12345.6])
def test_ppf_and_pmf_match_scipy_stats(rate: float) -> None:
    q = np.r_[(np.arange(256) + 0.5) / 256, 1 - 1e-9, 1 - 1e-6, 1e-9]
    np.testing.assert_array_equal(poisson_ppf(q, rate), stats.poisson.ppf(q, rate).astype(int))
    k = np.arange(int(3 * rate + 20))
    np.testing.assert_allclose(
        poisson_pmf(k, rate), stats.poisson.pmf(k, rate), rtol=1e-9, atol=1e-300
    )


def test_zero_rate_is_a_point_mass_at_zero() -> None:
    assert poisson_ppf([0.1, 0.999], 0.0).tolist() == [0, 0]
    assert poisson_pmf([0, 1, 2], 0.0).tolist() == [1.0, 0.0, 0.0]
