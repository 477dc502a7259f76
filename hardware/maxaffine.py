"""Max-affine cost profiles: ``t(x) = max_k (α_k + β_k · x)`` over named features.

The roofline is the special case with zero intercepts (one piece per resource). The
flagship use is the MoE expert block on one device, ``t = max(a + b·G, c + β·N)`` with
``G`` activated expert replicas and ``N`` (tile-padded) tokens: below the crossover the
time follows the weights streamed, above it the tokens computed.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from perfmodel.dtypes import get_dtype
from perfmodel.errors import SpecError

if TYPE_CHECKING:
    from hardware.residual import ResidualSurface
    from hardware.roofline import Roofline

GEMM_TILE_ROWS = 128
#: Feature names of the GEMM cost profile (see :func:`gemm_features`).
GEMM_FEATURES: tuple[str, ...] = (
    "flop_padded",
    "weight_elems",
    "act_elems",
    "log2_k",
    "out_padded",
)


@dataclass(frozen=True)
class Provenance:
    """Where a profile came from."""

    device: str
    op: str
    dtype: str = "bf16"
    source: str = "derived"  # "derived" (from the roofline) or a data file name
    rows: int = 0
    train_mape: float | None = None
    heldout_mape: float | None = None
    #: Held-out MdAPE (percent) with the residual surface, when the profile carries one.
    residual_heldout_mape: float | None = None
    notes: str = ""

    def summary(self) -> dict[str, Any]:
        """Where the profile came from and its held-out error, for a result's JSON."""
        return {
            "source": self.source,
            "op": self.op,
            "device": self.device,
            "heldout_mape": self.heldout_mape,
        }


@dataclass(frozen=True)
class MaxAffine:
    """``t = max_k (intercepts_s[k] + slopes[k] · x)``, seconds; vectorized over x."""

    features: tuple[str, ...]
    intercepts_s: NDArray[np.float64]  # shape (K,)
    slopes: NDArray[np.float64]  # shape (K, F), seconds per unit of each feature
    provenance: Provenance = field(default_factory=lambda: Provenance("?", "?"))
    piece_names: tuple[str, ...] = ()
    #: Measured corrections (``hardware.residual``): when present, ``__call__`` returns
    #: ``max_k(...) · exp(c(x))``; pieces, regimes and crossovers stay the pure form.
    residual: ResidualSurface | None = None

    def __post_init__(self) -> None:
        a = np.asarray(self.intercepts_s, dtype=np.float64).reshape(-1)
        b = np.asarray(self.slopes, dtype=np.float64)
        if b.ndim == 1:
            b = b.reshape(len(a), -1)
        if b.shape != (len(a), len(self.features)):
            raise SpecError(
                f"max-affine profile: slopes shape {b.shape} does not match "
                f"{len(a)} pieces x {len(self.features)} features"
            )
        if len(a) == 0:
            raise SpecError("max-affine profile needs at least one piece")
        if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
            raise SpecError("max-affine profile: intercepts and slopes must be finite")
        object.__setattr__(self, "intercepts_s", a)
        object.__setattr__(self, "slopes", b)
        if self.piece_names and len(self.piece_names) != len(a):
            raise SpecError("max-affine profile: one name per piece")
        if self.residual is not None and self.residual.features != len(self.features):
            raise SpecError(
                f"max-affine profile: residual surface has {self.residual.features} "
                f"feature(s), the profile {len(self.features)}"
            )

    @property
    def pieces(self) -> int:
        return len(self.intercepts_s)

    def _matrix(self, x: ArrayLike | None, kw: dict[str, ArrayLike]) -> NDArray[np.float64]:
        if x is not None:
            X = np.asarray(x, dtype=np.float64)
            if X.ndim == 1 and len(self.features) == 1:
                X = X[:, None]
            if X.shape[-1] != len(self.features):
                raise SpecError(f"expected {len(self.features)} feature columns {self.features}")
            return X
        missing = [f for f in self.features if f not in kw]
        if missing:
            raise SpecError(f"profile needs feature(s) {', '.join(missing)}")
        cols = np.broadcast_arrays(*[np.asarray(kw[f], dtype=np.float64) for f in self.features])
        return np.stack(cols, axis=-1)

    def piece_times(self, x: ArrayLike | None = None, **kw: ArrayLike) -> NDArray[np.float64]:
        """Each piece's affine value, shape (..., K)."""
        X = self._matrix(x, kw)
        return self.intercepts_s + X @ self.slopes.T

    def __call__(self, x: ArrayLike | None = None, **kw: ArrayLike) -> NDArray[np.float64]:
        """Seconds at the given features (a matrix ``x`` of shape (..., F) or keywords).

        Evaluated piece by piece with a running maximum over contiguous feature columns
        (no (rows, K) temporary, zero slopes skipped): ~10 ns per point and piece. With a
        residual surface, times are corrected near the measurements (a k-d tree lookup,
        ~1 µs per point).
        """
        X = self._matrix(x, kw)
        out = self._max_affine(X)
        if self.residual is not None:
            out = out * np.exp(self.residual.log_correction(X))
        return out

    def pure(self) -> MaxAffine:
        """The profile without its residual surface."""
        return replace(self, residual=None)

    def with_residual(self, residual: ResidualSurface | None) -> MaxAffine:
        return replace(self, residual=residual)

    def _max_affine(self, X: NDArray[np.float64]) -> NDArray[np.float64]:
        shape = X.shape[:-1]
        cols = np.ascontiguousarray(np.moveaxis(X, -1, 0).reshape(X.shape[-1], -1))
        out = np.full(cols.shape[1], -np.inf)
        for a, b in zip(self.intercepts_s, self.slopes, strict=True):
            v = np.full(cols.shape[1], a)
            for j in np.flatnonzero(b):
                v += b[j] * cols[j]
            np.maximum(out, v, out=out)
        return out.reshape(shape)

    def active_piece(self, x: ArrayLike | None = None, **kw: ArrayLike) -> NDArray[np.intp]:
        """Index of the piece that attains the max."""
        return self.piece_times(x, **kw).argmax(axis=-1)

    def with_provenance(self, provenance: Provenance) -> MaxAffine:
        """The same pieces with another provenance record."""
        return replace(self, provenance=provenance)

    def to_dict(self) -> dict[str, Any]:
        return {
            "features": list(self.features),
            "piece_names": list(self.piece_names),
            "intercepts_s": self.intercepts_s.tolist(),
            "slopes": self.slopes.tolist(),
            "provenance": dict(vars(self.provenance)),
            "residual": None if self.residual is None else self.residual.summary(),
            "pieces": self.pieces,
        }


def gemm_features(
    m: ArrayLike, n: ArrayLike, k: ArrayLike, *, padded: bool = True
) -> NDArray[np.float64]:
    """Feature matrix ``(..., 5)`` of an (m x k)·(k x n) GEMM for :data:`GEMM_FEATURES`.

    * ``flop_padded`` = 2·m_pad·n·k executed FLOPs, ``m_pad`` = the rows of whole tiles
      (:func:`hardware.roofline.padded_rows`: 16-128-row tiles by m, then 128-row tiles;
      ``padded=False`` uses m itself),
    * ``weight_elems`` = n·k elements of the weight operand streamed from HBM,
    * ``act_elems`` = m·(n + k) activation elements read and written,
    * ``log2_k`` = log2(k): the serial depth of the k-loop after split-K (a per-launch
      latency that grows with the reduction depth; empirical, see ``hardware.fit``),
    * ``out_padded`` = m_pad·n elements of the output tiles: the epilogue converts and
      stores every accumulator of a tile, padded rows included, once per output tile and
      independently of k (chosen over wave-quantization and tile-count features by
      grouped cross-validation on the training shapes; see ``benchmarks/bench_profile_fit``).

    The first three make the roofline; the roofline is the max-affine profile with one
    piece per resource (see :func:`derived_gemm_profile`).
    """
    m_ = np.asarray(m, dtype=np.float64)
    n_ = np.asarray(n, dtype=np.float64)
    k_ = np.asarray(k, dtype=np.float64)
    if np.any(m_ <= 0) or np.any(n_ <= 0) or np.any(k_ <= 0):
        raise SpecError("GEMM dimensions m, n, k must be positive")
    from hardware.roofline import gemm_flops, padded_rows

    m_pad = padded_rows(m_) if padded else m_
    cols = np.broadcast_arrays(
        gemm_flops(m_pad, n_, k_), n_ * k_, m_ * (n_ + k_), np.log2(k_), m_pad * n_
    )
    return np.stack(cols, axis=-1)


def derived_gemm_profile(roofline: Roofline, *, dtype: str = "bf16") -> MaxAffine:
    """The roofline of a GEMM written as a max-affine profile over :data:`GEMM_FEATURES`.

    ``t = max(ov + flop_padded / (eff_c·peak), ov + (w·weight_elems + a·act_elems) /
    (eff_m·BW))``: exactly :meth:`hardware.roofline.Roofline.gemm_time_s` (same row
    padding, same overhead), with zero slopes on ``log2_k`` and ``out_padded``.
    Intercepts are the launch overhead; slopes are the inverse achievable rates.
    """
    elem = get_dtype(dtype).bytes
    fr = roofline.flop_rate(dtype)
    br = roofline.byte_rate
    ov = roofline.overhead_s
    return MaxAffine(
        features=GEMM_FEATURES,
        intercepts_s=np.array([ov, ov]),
        slopes=np.array([[1.0 / fr, 0.0, 0.0, 0.0, 0.0], [0.0, elem / br, elem / br, 0.0, 0.0]]),
        provenance=Provenance(
            roofline.device.id,
            f"gemm_{get_dtype(dtype).name}",
            dtype=get_dtype(dtype).name,
            source="derived",
            notes=(
                f"roofline eff_compute={roofline.eff_compute}, eff_memory="
                f"{roofline.eff_memory}, overhead_s={ov}"
            ),
        ),
        piece_names=("compute", "memory"),
    )


def roofline_profile(roofline: Roofline, *, dtype: str = "bf16") -> MaxAffine:
    """Any op's roofline as max-affine over features ``(flop, bytes)``.

    ``t = max(ov + flop/(eff_c·peak), ov + bytes/(eff_m·BW))`` equals
    ``Roofline.time_s(flop, bytes)`` for every op that is present (the roofline is the
    max-affine special case with a shared launch intercept).
    """
    ov = roofline.overhead_s
    return MaxAffine(
        features=("flop", "bytes"),
        intercepts_s=np.array([ov, ov]),
        slopes=np.array([[1.0 / roofline.flop_rate(dtype), 0.0], [0.0, 1.0 / roofline.byte_rate]]),
        provenance=Provenance(
            roofline.device.id, "roofline", dtype=get_dtype(dtype).name, source="derived"
        ),
        piece_names=("compute", "memory"),
    )
