"""The stationary law ``π`` of the prefill-backlog chain (:mod:`perfmodel.serving.prefill_chain`).

Fix ``π₀ = 1`` and drop the balance equation of the top state (the rank of ``T − I`` is
``n − 1``): what is left only involves ``T[i, j]`` with ``i − G ≤ j ≤ i + w`` (a full
iteration serves ``G`` grid steps; ``w`` is the reach of one iteration's arrivals, pmf
entries below :data:`TINY` dropped), a band of ``G + w`` diagonals. One linear system,
solved by LU with partial pivoting either way:

* dense (``numpy.linalg.solve``) when the band is most of the matrix — the usual case:
  the arrivals of one iteration reach most of the grid (``w`` 180 of 193 states for
  Llama-3.1-8B on ``chat``), where a banded LU does the same work;
* banded (LAPACK ``gbsv`` through ``scipy.linalg.solve_banded``, ``O(n·w·(G + w))``)
  when the band is narrow against a large grid; scipy is imported only then (its import
  is ~0.15 s of CLI start-up).

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

#: The dense solve is taken while its LU (``⅔n³``) costs at most this times the banded
#: one's (``2·n·l·(l + u)``, ``l``/``u`` the sub-/super-diagonals).
DENSE_WORK_RATIO = 2.0


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
    G = arrivals.shape[0] - 1
    n = arrivals.shape[1]
    body = arrivals[:, : n - 1]  # column n − 1 (the lumped top) is not needed
    reach_a = int(np.nonzero(body[G] > TINY)[0].max(initial=0))
    nz = body > TINY
    last = np.where(nz.any(axis=1), n - 2 - np.argmax(nz[:, ::-1], axis=1), 0)
    w = max(int((last - np.arange(G + 1)).max()), reach_a - G, 0)
    lo, up = w + 1, G - 1  # sub- and super-diagonals of M[j, i − 1] = T[i, j] − [i = j]
    clean = np.where(body > TINY, body, 0.0)
    rhs = -clean[0]
    rhs[0] += 1.0
    dense = 2.0 * n**3 / 3.0 <= DENSE_WORK_RATIO * 2.0 * n * lo * (lo + up)
    with one_blas_thread():
        if dense:
            x = np.linalg.solve(_dense_system(clean, G, n), rhs)
        else:
            from scipy.linalg import solve_banded

            x = solve_banded((lo, up), _band_system(clean, G, n, w), rhs, check_finite=False)
    pi = np.maximum(np.concatenate([[1.0], x]), 0.0)
    return np.asarray(pi / pi.sum(), dtype=np.float64)


def _dense_system(clean: Arr, G: int, n: int) -> Arr:
    """``M[j, i − 1] = T[i, j] − [i = j]`` for ``j ≤ n − 2``, ``1 ≤ i ≤ n − 1``, returned as
    the transpose of a C-ordered ``t[i − 1, j]`` (the Fortran order LAPACK reads)."""
    t = np.zeros((n - 1, n - 1))  # t[i − 1, j] = T[i, j]
    g = min(G, n - 1)
    t[:g] = clean[1 : g + 1]
    if n - 1 > G:  # rows i > G: A_G shifted by i − G, T[i, j] = A_G[j − (i − G)]
        padded = np.concatenate([np.zeros(n - 1 - G), clean[G]])
        windows = np.lib.stride_tricks.sliding_window_view(padded, n - 1)
        t[G:] = windows[: n - 1 - G][::-1]  # row i starts at padded[n − 1 − i]
    j = np.arange(1, n - 1)
    t[j - 1, j] -= 1.0  # the diagonal −π_j
    return t.T


def _band_system(clean: Arr, G: int, n: int, w: int) -> Arr:
    """The same system in LAPACK band storage (``w + 1`` sub-, ``G − 1`` super-diagonals)."""
    lo, up = w + 1, G - 1
    ab = np.zeros((lo + up + 1, n - 1))
    for i in range(1, min(G, n - 1) + 1):  # rows i ≤ G: A_i from j = 0
        j1 = min(i + w + 1, n - 1)
        ab[up + np.arange(j1) - (i - 1), i - 1] = clean[i, :j1]
    # rows i > G: A_G shifted by i − G, i.e. the same diagonals ab[up − G + 1 + t] = a[t]
    t = np.arange(min(w + G + 1, n - 1))
    cols = np.arange(G, n - 1)  # c = i − 1
    keep = (cols[None, :] - G + 1 + t[:, None]) <= n - 2  # j = i − G + t within the system
    ab[up - G + 1 + t[:, None], cols[None, :]] = np.where(keep, clean[G, t][:, None], 0.0)
    ab[up + 1, : n - 2] -= 1.0  # the diagonal −π_j: M[j, j − 1] for j = 1 … n − 2
    return ab
