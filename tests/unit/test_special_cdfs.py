"""The PD layer's CDFs from scipy.special equal scipy.stats's, bit for bit (so the
planner need not import scipy.stats, ~1 s of start-up)."""

import numpy as np
import pytest
from scipy import stats

from perfmodel.pd.decode import exponnorm_cdf


@pytest.mark.parametrize("x", [-3.0, 0.0, 0.7, 5.0, 40.0])
def test_exponnorm_cdf_is_scipy_stats(x: float) -> None:
    rng = np.random.default_rng(0)
    K = np.exp(rng.normal(0, 2, 20_000))
    loc, scale = rng.normal(0, 1, 20_000), np.exp(rng.normal(0, 1, 20_000))
    # the same operations as SciPy's, on perfmodel.special's normal CDF (math.erfc):
    # equal to rounding: relative 1e-12, or 1e-16 absolute where Φ(z) − exp(…) cancels
    # (the last digits of the two erfc implementations, amplified by the difference)
    np.testing.assert_allclose(
        exponnorm_cdf(x, K, loc=loc, scale=scale),
        stats.exponnorm.cdf(x, K, loc=loc, scale=scale),
        rtol=1e-12,
        atol=1e-16,
    )


def test_exponnorm_cdf_limits_and_invalid_arguments() -> None:
    # K → 0: the normal CDF; large K: mostly the exponential; K ≤ 0 or scale ≤ 0: NaN
    assert exponnorm_cdf(1.0, np.array([1e-6]), loc=np.zeros(1), scale=np.ones(1))[0] == (
        pytest.approx(stats.norm.cdf(1.0), rel=1e-5)
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        bad = exponnorm_cdf(
            1.0, np.array([0.0, -1.0, 1.0]), loc=np.zeros(3), scale=np.array([1.0, 1.0, 0.0])
        )
    assert np.isnan(bad).all()
