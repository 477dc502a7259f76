"""Compound Poisson laws on a grid, by FFT: the prompt tokens arriving during an
iteration of the prefill-backlog chain (:mod:`perfmodel.serving.prefill_chain`)."""

from __future__ import annotations

from functools import cache

import numpy as np
from numpy.typing import ArrayLike, NDArray

Arr = NDArray[np.float64]


@cache
def fft_size(n: int) -> int:
    """The smallest ``2^a·3^b·5^c ≥ n``: a length pocketfft transforms fast. The grids
    here hold ``k·G + 1`` states, just past a power of two, which would nearly double
    every transform; a circular convolution of any length ``≥ n`` is the same."""
    best = 1 << max(n - 1, 1).bit_length()
    p5 = 1
    while p5 < best:
        p35 = p5
        while p35 < best:
            p = p35
            while p < n:
                p *= 2
            best = min(best, p)
            p35 *= 3
        p5 *= 5
    return best


def cp_transform(rates: ArrayLike, jump_hat: NDArray[np.complex128]) -> NDArray[np.complex128]:
    """``exp(r·(F − 1))``: the transform of ``CP(r, jumps)`` for every rate in ``rates``
    (any shape; a trailing axis over ``jump_hat``, the jump law's transform ``F``)."""
    return np.exp(np.multiply.outer(np.asarray(rates, dtype=np.float64), jump_hat - 1.0))


def compound_poisson(rates: Arr, jump_pmf: Arr, n: int) -> Arr:
    """Rows ``CP(rate_i, jump_pmf)`` on ``0 … n−1``; the mass at ``≥ n − 1`` lumped at ``n − 1``.

    ``pmf = IFFT(exp(r·(F − 1)))`` with ``F`` the FFT of the jump law (the probability
    generating function on the unit circle), on at least ``2n`` points: the mass that
    wraps around is that beyond ``2n``, negligible for the rates used here (the grid holds
    several budgets; one iteration's arrivals are below one budget on average).
    """
    size = fft_size(max(2 * max(n, jump_pmf.size), 16))
    pmf = np.fft.irfft(cp_transform(rates, np.fft.rfft(jump_pmf, size)), size, axis=-1)[:, :n]
    pmf = np.maximum(pmf, 0.0)
    pmf[:, -1] += np.maximum(1.0 - pmf.sum(axis=1), 0.0)
    return pmf
