"""Latency targets: TTFT and TPOT at a percentile, with the fraction that must meet both."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from perfmodel.errors import SpecError

Arr = NDArray[np.float64]


IntArr = NDArray[np.int64]


@dataclass(frozen=True)
class SLO:
    """Latency targets (DistServe's convention, Zhong et al., OSDI 2024).

    The SLO is *met at a rate* when the ``percentile`` quantile of TTFT is at most
    ``ttft_s`` and that of TPOT at most ``tpot_s``; *attainment* is the fraction of
    requests meeting both targets, and *goodput* the largest rate whose attainment is
    at least ``goal``.
    """

    ttft_s: float
    tpot_s: float
    percentile: float = 0.90
    goal: float = 0.90

    def __post_init__(self) -> None:
        for name in ("ttft_s", "tpot_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise SpecError(f"SLO {name} must be a positive number of seconds, got {v}")
        for name in ("percentile", "goal"):
            v = getattr(self, name)
            if not 0 < v < 1:
                raise SpecError(f"SLO {name} must be a fraction in (0, 1), got {v}")
