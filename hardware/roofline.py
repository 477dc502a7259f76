"""The roofline cost profile: the one place a latency is computed from FLOPs and bytes.

    t = max(flops / (eff_compute * peak), bytes / (eff_memory * bw)) + overhead

Default efficiencies (documented, not fitted per device):

* ``eff_compute = 0.80`` -- large BF16 GEMMs reach 75-85 % of dense peak on A100/H100
  (cuBLAS/CUTLASS; aiconfigurator's measured tables show the same band).
* ``eff_memory = 0.80`` -- streaming kernels reach ~80 % of HBM peak; aiconfigurator
  uses ``mem_bw_empirical_scaling_factor: 0.8``.
* ``overhead_s = 5 us`` -- one kernel launch plus tail; the smallest measured GEMMs
  on A100/H100 take 4-5 us.
* GEMMs execute whole tiles along the token dimension ``m``: 16-128 rows chosen by
  ``m``, then whole 128-row tiles (see :func:`padded_rows`), so the compute term uses
  the padded row count.

Everything is vectorized: ``flops`` and ``bytes`` may be numpy arrays of any
broadcastable shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from hardware.device import Device
from perfmodel.dtypes import get_dtype
from perfmodel.errors import SpecError

DEFAULT_EFF_COMPUTE = 0.80
DEFAULT_EFF_MEMORY = 0.80
DEFAULT_OVERHEAD_S = 5e-6
GEMM_M_TILE = 128
GEMM_MIN_M_TILE = 16


def padded_rows(
    m: ArrayLike, *, max_tile: int = GEMM_M_TILE, min_tile: int = GEMM_MIN_M_TILE
) -> NDArray[np.float64]:
    """Rows a GEMM kernel actually computes for ``m`` token rows.

    Kernels pick the tile height by ``m`` (cuBLAS/CUTLASS heuristics, vLLM's fused-MoE
    ``BLOCK_SIZE_M``): the next power of two between ``min_tile`` and ``max_tile``, and
    whole ``max_tile`` tiles beyond that. 0 rows cost nothing.

    The result of at most :data:`KEPT_PADDING_MAX_ROWS` rows is kept for the next call
    (see :data:`_LAST_PADDED`) and is read-only.
    """
    m_ = np.asarray(m, dtype=np.float64)
    global _LAST_PADDED
    last = _LAST_PADDED
    if (
        last is not None
        and last[1] == (max_tile, min_tile)
        and last[0].shape == m_.shape
        and bool((last[0] == m_).all())
    ):
        return last[2]
    # min(max(·)) is np.clip without its Python-level dispatch (a hot path)
    tile = np.minimum(np.maximum(2.0 ** np.ceil(np.log2(np.maximum(m_, 1.0))), min_tile), max_tile)
    out = np.where(m_ > 0, np.ceil(m_ / tile) * tile, 0.0)
    if m_.size <= KEPT_PADDING_MAX_ROWS:
        out.flags.writeable = False
        _LAST_PADDED = (m_.copy(), (max_tile, min_tile), out)
    return out


#: the last :func:`padded_rows` call's rows, tiles and result: a step's GEMMs pad the same
#: token rows one after another (read-only, so a caller cannot change what is kept); kept
#: for step-sized arrays only (``predict gemm``'s million shapes are padded once each)
_LAST_PADDED: tuple[NDArray[np.float64], tuple[int, int], NDArray[np.float64]] | None = None
KEPT_PADDING_MAX_ROWS = 8192


@dataclass(frozen=True)
class RooflineTimes:
    """Per-element compute time, memory time and total, all in seconds."""

    compute_s: NDArray[np.float64]
    memory_s: NDArray[np.float64]
    total_s: NDArray[np.float64]

    @property
    def memory_bound(self) -> NDArray[np.bool_]:
        return self.memory_s >= self.compute_s


@dataclass(frozen=True)
class Roofline:
    """Roofline profile of one device; ``dtype`` selects the compute peak."""

    device: Device
    eff_compute: float = DEFAULT_EFF_COMPUTE
    eff_memory: float = DEFAULT_EFF_MEMORY
    overhead_s: float = DEFAULT_OVERHEAD_S

    def __post_init__(self) -> None:
        for name in ("eff_compute", "eff_memory"):
            v = getattr(self, name)
            if not 0.0 < v <= 1.0:
                raise SpecError(f"roofline {name} must be in (0, 1], got {v}")
        if self.overhead_s < 0:
            raise SpecError(f"roofline overhead_s must be >= 0, got {self.overhead_s}")

    def flop_rate(self, dtype: str) -> float:
        """Achievable FLOP/s for math in ``dtype``."""
        return self.eff_compute * self.device.peak(dtype)

    @property
    def byte_rate(self) -> float:
        """Achievable HBM B/s."""
        return self.eff_memory * self.device.hbm_bw_bytes_per_s

    def times(
        self, flops: ArrayLike, bytes_: ArrayLike, *, dtype: str, kernels: ArrayLike = 1.0
    ) -> RooflineTimes:
        """Compute, memory and total time of ``kernels`` launches moving these FLOPs/bytes.

        The overhead is paid per kernel launch; an op that is absent (0 FLOPs and 0
        bytes) costs nothing.
        """
        f = np.asarray(flops, dtype=np.float64)
        b = np.asarray(bytes_, dtype=np.float64)
        tc = f / self.flop_rate(dtype)
        tm = b / self.byte_rate
        present = (f > 0) | (b > 0)
        total = np.maximum(tc, tm) + np.where(present, self.overhead_s * np.asarray(kernels), 0.0)
        return RooflineTimes(tc, tm, total)

    def time_s(self, flops: ArrayLike, bytes_: ArrayLike, *, dtype: str) -> NDArray[np.float64]:
        """Total seconds (see :meth:`times`)."""
        return self.times(flops, bytes_, dtype=dtype).total_s

    def gemm_time_s(
        self,
        m: ArrayLike,
        n: ArrayLike,
        k: ArrayLike,
        *,
        dtype: str = "bf16",
        weight_bytes_per_elem: float | None = None,
    ) -> NDArray[np.float64]:
        """Latency of an (m x k) @ (k x n) GEMM; see :func:`gemm_flops_bytes`."""
        f, b = gemm_flops_bytes(
            m, n, k, act_bytes=_elem_bytes(dtype), weight_bytes=weight_bytes_per_elem
        )
        return self.time_s(f, b, dtype=dtype)


def _elem_bytes(dtype: str) -> float:
    return get_dtype(dtype).bytes


def gemm_flops(rows: ArrayLike, n: ArrayLike, k: ArrayLike) -> NDArray[np.float64]:
    """FLOPs of a (rows x k) @ (k x n) GEMM: ``2·rows·n·k`` (a multiply and an add each)."""
    r = np.asarray(rows, dtype=np.float64)
    return 2.0 * r * np.asarray(n, dtype=np.float64) * np.asarray(k, dtype=np.float64)


def gemm_flops_bytes(
    m: ArrayLike,
    n: ArrayLike,
    k: ArrayLike,
    *,
    act_bytes: float,
    weight_bytes: float | None = None,
    max_tile: int = GEMM_M_TILE,
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Executed FLOPs (2·m_pad·n·k) and HBM bytes (A, B read and C written once) of a GEMM.

    ``m_pad = padded_rows(m)``: a tile's rows are computed even when empty.
    """
    m_ = np.asarray(m, dtype=np.float64)
    n_ = np.asarray(n, dtype=np.float64)
    k_ = np.asarray(k, dtype=np.float64)
    wb = act_bytes if weight_bytes is None else weight_bytes
    flops = gemm_flops(padded_rows(m_, max_tile=max_tile), n_, k_)
    bytes_ = act_bytes * (m_ * k_ + m_ * n_) + wb * k_ * n_
    return flops, bytes_
