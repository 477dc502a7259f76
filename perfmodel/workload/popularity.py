"""Popularity of a catalog of objects (experts, adapters): Zipf over ranks, the one place."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from perfmodel.errors import SpecError

Arr = NDArray[np.float64]


def zipf_popularity(n: int, exponent: float) -> Arr:
    """``p_r = r^{−s} / Σ_j j^{−s}`` for ranks ``r = 1..n`` (most popular first)."""
    if not (isinstance(n, int | np.integer) and n >= 1):
        raise SpecError(f"catalog size must be a positive integer, got {n!r}")
    if not (np.isfinite(exponent) and exponent >= 0):
        raise SpecError(f"Zipf exponent must be >= 0, got {exponent}")
    p = np.arange(1, n + 1, dtype=np.float64) ** (-float(exponent))
    return p / p.sum()
