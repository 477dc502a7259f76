"""Arrival processes: Poisson and Gamma renewal streams given by rate and inter-arrival CV."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from perfmodel.errors import SpecError

Arr = NDArray[np.float64]


IntArr = NDArray[np.int64]


@dataclass(frozen=True)
class RenewalArrivals:
    """Renewal arrivals at ``rate_per_s`` with inter-arrival CV ``cv`` (std / mean).

    ``cv == 1`` is a Poisson process (exponential gaps); otherwise gaps are Gamma with
    shape ``1/cv²`` (bursty for ``cv > 1``, smoother for ``cv < 1``).
    """

    rate_per_s: float
    cv: float = 1.0

    def __post_init__(self) -> None:
        check_rate(self.rate_per_s)
        check_cv(self.cv)

    def times_s(self, n: int, rng: np.random.Generator) -> Arr:
        """Arrival times of ``n`` requests, starting after one gap from t = 0."""
        mean_gap = 1.0 / self.rate_per_s
        if self.cv == 0.0:  # deterministic: evenly spaced arrivals
            return mean_gap * np.arange(1, n + 1, dtype=np.float64)
        if self.cv == 1.0:
            gaps = rng.exponential(mean_gap, size=n)
        else:
            shape = 1.0 / self.cv**2
            gaps = rng.gamma(shape, mean_gap / shape, size=n)
        return np.cumsum(gaps)


def poisson(rate_per_s: float) -> RenewalArrivals:
    return RenewalArrivals(rate_per_s, 1.0)


def gamma_arrivals(rate_per_s: float, cv: float) -> RenewalArrivals:
    return RenewalArrivals(rate_per_s, cv)


#: Largest inter-arrival CV accepted (the burstiest trace we know has 13.2).
MAX_ARRIVAL_CV = 1000.0


def check_cv(cv: float) -> None:
    """Inter-arrival CV in [0, MAX_ARRIVAL_CV]: 0 = evenly spaced, 1 = Poisson."""
    if not (isinstance(cv, int | float) and math.isfinite(cv) and 0 <= cv <= MAX_ARRIVAL_CV):
        raise SpecError(
            f"arrival CV must be in [0, {MAX_ARRIVAL_CV:g}] (0 evenly spaced, 1 Poisson), got {cv}"
        )


def check_rate(rate_per_s: float, what: str = "arrival rate") -> None:
    if not (isinstance(rate_per_s, int | float) and math.isfinite(rate_per_s) and rate_per_s > 0):
        raise SpecError(f"{what} must be a positive number of requests/s, got {rate_per_s!r}")
