"""D(B): how many distinct experts a batch of tokens activates (uniform and measured routing)."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from perfmodel.errors import SpecError

Arr = NDArray[np.float64]


def distinct_experts_uniform(num_experts: int, top_k: int, tokens: ArrayLike) -> Arr:
    """``D(B) = E·(1 − (1 − k/E)^B)`` under uniform routing."""
    if not 1 <= top_k <= num_experts:
        raise SpecError(f"need 1 <= top_k ({top_k}) <= experts ({num_experts})")
    b = np.asarray(tokens, dtype=np.float64)
    if np.any(b < 0):
        raise SpecError("tokens per batch must be >= 0")
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** b)


def expected_distinct(activation: ArrayLike, tokens: ArrayLike) -> Arr:
    """``D(B) = Σ_i (1 − (1 − π_i)^B)`` for per-token activation probabilities ``π``."""
    pi = np.asarray(activation, dtype=np.float64).ravel()
    if np.any(pi < 0) or np.any(pi > 1 + 1e-12):
        raise SpecError("activation probabilities must be in [0, 1]")
    b = np.asarray(tokens, dtype=np.float64)
    return np.sum(1.0 - (1.0 - np.minimum(pi, 1.0)) ** b[..., None], axis=-1)
