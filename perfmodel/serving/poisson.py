"""Poisson quantiles and probabilities (one place for both).

Same values as ``scipy.stats.poisson.ppf`` / ``.pmf`` (``tests/unit/test_poisson.py``),
from :mod:`perfmodel.special`: no scipy import on the CLI's start-up path. Used by the
iteration-time mixtures of the queueing layer.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray

from perfmodel import special


def poisson_ppf(q: ArrayLike, rate: float) -> NDArray[np.int64]:
    """Smallest ``k`` with ``P(K ≤ k) ≥ q`` for ``K ~ Poisson(rate)``, ``0 ≤ q < 1``."""
    qa = np.asarray(q, dtype=np.float64)
    if rate <= 0:
        return np.zeros(qa.shape, dtype=np.int64)
    hi = int(rate + 12.0 * math.sqrt(rate) + 40.0)
    cdf = special.poisson_cdf(hi, rate)
    return np.searchsorted(cdf, qa, side="left").astype(np.int64)


def poisson_pmf(k: ArrayLike, rate: float) -> NDArray[np.float64]:
    """``P(K = k)`` for ``K ~ Poisson(rate)``."""
    ka = np.asarray(k, dtype=np.float64)
    if rate <= 0:
        return (ka == 0).astype(np.float64)
    return special.poisson_pmf(ka, rate)
