"""The stationary law ``π`` of the prefill-backlog chain (:mod:`perfmodel.serving.prefill_chain`).

The chain moves down by at most ``G`` states per iteration (a full iteration serves ``G``
grid steps) and up by any amount (arrivals). Censoring exploits that: the chain watched
only while it is in the states below ``s`` is again a Markov chain (the stochastic
complement, Kemeny & Snell 1960; Grassmann, Taksar & Heyman 1985, GTH),

    T' = T_AA + T_AB·(I − T_BB)⁻¹·T_BA,    A = {0 … s − 1}, B = {s … e − 1},

and since the states of ``B`` leave downwards only to ``s − G … s − 1``, only those ``G``
columns of ``T_AA`` change. So the blocks of :data:`BLOCK_STATES` states are censored from
the top down, each one solve of its block and one product of ``|A| × b`` by ``b × G``,
and then ``π_B = π_A·T_AB·(I − T_BB)⁻¹`` from ``π₀ = 1`` up: ``O(n²·G)`` work instead of
the ``⅔n³`` of a dense LU (a grid of 1,537 states: 10 ms instead of 80 ms). The rows of
``T`` above ``G`` are one arrival law shifted, read as strided views (no ``n × n``
matrix is formed). As in GTH, the diagonal of ``I − T_BB`` is the sum of the row's other
entries rather than ``1 − T_ii`` (no cancellation, and each censored row stays
stochastic whatever was dropped); every other term is a sum of non-negative numbers but
the block solves, so small probabilities keep their relative accuracy. The top state
lumps the mass beyond the grid: its column is each row's complement of the others.
Arrival probabilities below :data:`TINY` are dropped.

On one BLAS thread: a system this small is latency-bound, and OpenBLAS's threads spin
(10x the CPU time, seconds of wall time on a shared machine).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from functools import cache
from typing import Any

import numpy as np
from numpy.typing import NDArray

Arr = NDArray[np.float64]

TINY = 1e-15  # arrival probabilities below this are dropped from the system

#: States censored at a time: ~64 balances the per-block overhead of small solves against
#: the ``b²`` work of each (rounded to a multiple of ``G``; 32 or 128: 15-30 % slower).
BLOCK_STATES = 64


@cache
def _blas_controller() -> Any:
    """The process's BLAS/OpenMP thread pools (scanned once: the scan costs milliseconds)."""
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def _one_blas_thread() -> AbstractContextManager[Any]:
    if os.environ.get("OPENBLAS_NUM_THREADS") == "1":  # the CLI sets it before numpy loads
        return nullcontext()
    return _blas_controller().limit(limits=1, user_api="blas")


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """BLAS on one thread for a block or, as ``@one_blas_thread()``, a function: small
    vectors and systems (the chain, the PD decode batch laws) are latency-bound, and
    OpenBLAS's threads spin — a 70,000-entry dot product costs 0.5 ms of CPU on two
    threads and 0.02 ms on one."""
    with _one_blas_thread():
        yield


def stationary(arrivals: Arr) -> Arr:
    """``π`` with ``π·T = π`` for the chain whose arrival laws are ``arrivals``
    (``(G + 1) × n``: row ``i ≤ G`` the arrivals of an iteration carrying ``i`` grid steps
    of prompt tokens; a state ``i > G`` serves ``G`` steps and then takes row ``G``)."""
    t = _Transitions(arrivals)
    n, G = t.n, t.G
    b = G * max(1, round(BLOCK_STATES / G))
    starts = range(1, n, b)  # blocks [s, s + b); the top one may be short
    cols = t.block(0, n, starts[-1], n)  # T_AB ∪ T_BB of the top block, with fill
    kept: list[tuple[int, int, Arr, Arr]] = []
    with one_blas_thread():
        for s in reversed(starts):
            e = min(s + b, n)
            down = t.block(s, e, s - G if s > 1 else 0, s)  # T_BA: B leaves to these
            m = -cols[s:e]
            d = np.arange(e - s)
            m[d, d] = 0.0
            m[d, d] = down.sum(axis=1) - m.sum(axis=1)  # GTH: the row's other mass
            inv = np.asarray(np.linalg.inv(m), dtype=np.float64)
            kept.append((s, e, cols[:s], inv))
            if s > 1:
                below = t.block(0, s, s - b, s)
                below[:, b - G :] += cols[:s] @ (inv @ down)
                cols = below
        pi = np.zeros(n)
        pi[0] = 1.0
        for s, e, t_ab, inv in reversed(kept):
            pi[s:e] = (pi[:s] @ t_ab) @ inv
    pi = np.maximum(pi, 0.0)
    return np.asarray(pi / pi.sum(), dtype=np.float64)


class _Transitions:
    """Blocks of ``T`` read from the arrival laws: rows ``≤ G`` are theirs, a row ``i > G``
    is row ``G`` shifted by ``i − G`` (strided views of one padded copy), and the top
    column holds what each row leaves of 1 below it."""

    def __init__(self, arrivals: Arr) -> None:
        self.G = arrivals.shape[0] - 1
        self.n = n = arrivals.shape[1]
        self.low = np.where(arrivals > TINY, arrivals, 0.0)
        self.low[:, n - 1] = 0.0
        self.low_top = np.maximum(1.0 - self.low.sum(axis=1), 0.0)
        a = self.low[self.G]
        self.cum_full = np.cumsum(a)
        padded = np.concatenate([np.zeros(n), a])  # padded[n + t] = a[t]
        # shifted[i − G − 1, j] = T[i, j] = a[j − i + G] = padded[n − 1 + j − (i − G − 1)]
        step = padded.strides[0]
        self.shifted = np.lib.stride_tricks.as_strided(
            padded[n - 1 :], shape=(max(n - self.G - 1, 0), n), strides=(-step, step),
            writeable=False,
        )  # fmt: skip

    def block(self, r0: int, r1: int, c0: int, c1: int) -> Arr:
        """``T[r0:r1, c0:c1]``, a new array."""
        G, n = self.G, self.n
        out = np.empty((r1 - r0, c1 - c0))
        m = min(r1, G + 1)
        if r0 < m:
            out[: m - r0] = self.low[r0:m, c0:c1]
            if c1 == n:
                out[: m - r0, -1] = self.low_top[r0:m]
        s0 = max(r0, G + 1)
        if s0 < r1:
            out[s0 - r0 :] = self.shifted[s0 - G - 1 : r1 - G - 1, c0:c1]
            if c1 == n:  # the complement of a[0 … n − 2 − i + G]
                rows = np.arange(s0, r1)
                out[s0 - r0 :, -1] = np.maximum(1.0 - self.cum_full[n - 2 - rows + G], 0.0)
        return out
