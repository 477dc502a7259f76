"""Max-affine cost profiles: ``t(x) = max_k (α_k + β_k · x)`` over named features.

The roofline is the special case with zero intercepts (one piece per resource). The
flagship use is the MoE expert block on one device, ``t = max(a + b·G, c + β·N)`` with
``G`` activated expert replicas and ``N`` (tile-padded) tokens: below the crossover the
time follows the weights streamed, above it the tokens computed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from perfmodel.errors import SpecError


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
    notes: str = ""


@dataclass(frozen=True)
class MaxAffine:
    """``t = max_k (intercepts_s[k] + slopes[k] · x)``, seconds; vectorized over x."""

    features: tuple[str, ...]
    intercepts_s: NDArray[np.float64]  # shape (K,)
    slopes: NDArray[np.float64]  # shape (K, F), seconds per unit of each feature
    provenance: Provenance = field(default_factory=lambda: Provenance("?", "?"))
    piece_names: tuple[str, ...] = ()

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
        """Seconds at the given features (a matrix ``x`` of shape (..., F) or keywords)."""
        return self.piece_times(x, **kw).max(axis=-1)

    def active_piece(self, x: ArrayLike | None = None, **kw: ArrayLike) -> NDArray[np.intp]:
        """Index of the piece that attains the max."""
        return self.piece_times(x, **kw).argmax(axis=-1)

    def to_dict(self) -> dict[str, Any]:
        return {
            "features": list(self.features),
            "piece_names": list(self.piece_names),
            "intercepts_s": self.intercepts_s.tolist(),
            "slopes": self.slopes.tolist(),
            "provenance": dict(vars(self.provenance)),
        }
