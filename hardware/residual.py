"""The measured residual surface of a fitted profile: what the max-affine form cannot say.

A max-affine profile is a global, convex function of its features. Real libraries pick
one of several kernels per shape (cuBLAS chooses tiles, split-K and wave counts by a
heuristic), so measured times carry shape-local steps a convex form cannot follow: on the
A100 GEMM data the best max-affine profile stays at ~6.4 % held-out median error whatever
the features or the number of pieces, one profile per m value at 5.8 %, and a min over
several max-affine "kernels" at ~5.1 % (``benchmarks/explore_gemm_forms.py``).

Where measurements exist, a profile can carry them as a *residual surface*:

    t(x) = maxaffine(x) · exp(c(x)),
    c(x) = median of r_i over the ``neighbours`` fitting rows nearest to x,
    r_i  = log(t_measured,i / maxaffine(x_i)),

with distances in standardized log-feature space (``z = (log(x + offset) − centre) /
scale`` per feature; a feature constant in the rows keeps scale 1), so two GEMMs are
near when their sizes are near in ratio. Away from the measurements the correction
fades to zero: it is full within ``radius`` of the nearest fitting row and falls
linearly to none at twice that (``radius`` = the 90th percentile of the
nearest-neighbour distances between distinct fitting points), so extrapolation is the
pure max-affine profile. The pieces, regimes and crossovers of the profile are
unchanged; only its predicted times are corrected.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from perfmodel.errors import SpecError

Arr = NDArray[np.float64]

DEFAULT_NEIGHBOURS = 4
#: Fraction of a feature's smallest positive value added before the log (zeros allowed).
LOG_OFFSET_FRACTION = 0.5


def _standardize(X: Arr, offset: Arr, centre: Arr, scale: Arr) -> Arr:
    return (np.log(X + offset) - centre) / scale


@dataclass(frozen=True)
class ResidualSurface:
    """Log-ratio corrections at measured rows, looked up by nearest neighbours."""

    offset: Arr  # (F,) added before the log
    centre: Arr  # (F,)
    scale: Arr  # (F,) standard deviation of the log feature (1 where it was constant)
    points: Arr  # (N, F) standardized coordinates of the fitting rows
    log_ratio: Arr  # (N,) log(measured / max-affine) at those rows
    neighbours: int = DEFAULT_NEIGHBOURS
    radius: float = 0.0

    def __post_init__(self) -> None:
        pts = np.asarray(self.points, dtype=np.float64)
        lr = np.asarray(self.log_ratio, dtype=np.float64).reshape(-1)
        vecs = {
            k: np.asarray(getattr(self, k), dtype=np.float64).reshape(-1)
            for k in ("offset", "centre", "scale")
        }
        F = len(vecs["offset"])
        if pts.ndim != 2 or pts.shape[1] != F or len(pts) != len(lr):
            raise SpecError(
                f"residual surface: points {pts.shape} and log_ratio ({len(lr)},) do not "
                f"match {F} feature(s)"
            )
        if any(len(v) != F for v in vecs.values()) or np.any(vecs["scale"] <= 0):
            raise SpecError(
                "residual surface: offset/centre/scale need one entry per feature (scale positive)"
            )
        if len(lr) < 1 or not (1 <= self.neighbours <= len(lr)):
            raise SpecError(
                f"residual surface: neighbours must be between 1 and the {len(lr)} rows"
            )
        if not (np.all(np.isfinite(pts)) and np.all(np.isfinite(lr)) and self.radius >= 0):
            raise SpecError("residual surface: values must be finite, radius >= 0")
        object.__setattr__(self, "points", pts)
        object.__setattr__(self, "log_ratio", lr)
        for k, v in vecs.items():
            object.__setattr__(self, k, v)

    @property
    def features(self) -> int:
        return len(self.offset)

    @property
    def rows(self) -> int:
        return len(self.log_ratio)

    def _tree(self) -> Any:
        tree = self.__dict__.get("_kdtree")
        if tree is None:
            from scipy.spatial import cKDTree

            tree = cKDTree(self.points)
            object.__setattr__(self, "_kdtree", tree)
        return tree

    def log_correction(self, X: ArrayLike) -> Arr:
        """``c(x)`` for feature rows ``X`` of shape (..., F) (see the module docstring)."""
        Xa = np.asarray(X, dtype=np.float64)
        shape = Xa.shape[:-1]
        Xa = Xa.reshape(-1, Xa.shape[-1])
        if Xa.shape[1] != self.features:
            raise SpecError(f"residual surface expects {self.features} feature columns")
        Z = _standardize(np.maximum(Xa, 0.0), self.offset, self.centre, self.scale)
        tree = self._tree()
        # Only rows within the fade-out distance get a correction: find them first with a
        # bounded nearest-neighbour query (cheap for far points), then their neighbours.
        reach = 2.0 * self.radius
        d1, _ = tree.query(Z, k=1, distance_upper_bound=reach if reach > 0 else 1e-12, workers=-1)
        near = np.flatnonzero(np.isfinite(d1) & (d1 <= reach))
        c = np.zeros(len(Z))
        if len(near):
            _, idx = tree.query(Z[near], k=self.neighbours, workers=-1)
            idx = idx.reshape(len(near), -1)
            if self.radius > 0:
                fade = np.clip(2.0 - d1[near] / self.radius, 0.0, 1.0)
            else:
                fade = np.ones(len(near))
            c[near] = np.median(self.log_ratio[idx], axis=1) * fade
        return c.reshape(shape)

    def summary(self) -> dict[str, Any]:
        return {"rows": self.rows, "neighbours": self.neighbours, "radius": self.radius}

    def to_dict(self) -> dict[str, Any]:
        """Plain lists, rounded (coordinates to 1e-4, log-ratios to 1e-5: < 0.001 %)."""
        return {
            "neighbours": self.neighbours,
            "radius": float(self.radius),
            "offset": self.offset.tolist(),
            "centre": self.centre.tolist(),
            "scale": self.scale.tolist(),
            "points": np.round(self.points, 4).tolist(),
            "log_ratio": np.round(self.log_ratio, 5).tolist(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ResidualSurface:
        keys = ("offset", "centre", "scale", "points", "log_ratio")
        missing = [k for k in keys if k not in d]
        if missing:
            raise SpecError(f"[residual] is missing {missing}")
        pts = np.asarray(d["points"], dtype=np.float64)
        return cls(
            offset=np.asarray(d["offset"], dtype=np.float64),
            centre=np.asarray(d["centre"], dtype=np.float64),
            scale=np.asarray(d["scale"], dtype=np.float64),
            points=pts.reshape(len(pts), -1) if pts.size else pts.reshape(0, 0),
            log_ratio=np.asarray(d["log_ratio"], dtype=np.float64),
            neighbours=int(d.get("neighbours", DEFAULT_NEIGHBOURS)),
            radius=float(d.get("radius", 0.0)),
        )


def build_surface(
    X: ArrayLike, y: ArrayLike, predicted: ArrayLike, *, neighbours: int = DEFAULT_NEIGHBOURS
) -> ResidualSurface:
    """The residual surface of measured times ``y`` against a profile's ``predicted`` times
    at feature rows ``X`` (all of shape (rows, F) / (rows,), positive)."""
    Xa = np.asarray(X, dtype=np.float64)
    ya = np.asarray(y, dtype=np.float64)
    pa = np.asarray(predicted, dtype=np.float64)
    if Xa.ndim != 2 or len(Xa) != len(ya) or len(pa) != len(ya):
        raise SpecError("residual surface: features (rows, F), times and predictions (rows,)")
    if len(ya) < neighbours:
        raise SpecError(
            f"residual surface: {len(ya)} row(s) are fewer than the {neighbours} neighbours"
        )
    if np.any(ya <= 0) or np.any(pa <= 0):
        raise SpecError("residual surface: measured and predicted times must be positive")
    Xa = np.maximum(Xa, 0.0)
    pos = np.where(Xa > 0, Xa, np.inf).min(axis=0)
    offset_all = np.where(np.isfinite(pos), LOG_OFFSET_FRACTION * pos, 1.0)
    L = np.log(Xa + offset_all)  # the same transform as _standardize, before centring
    sd = L.std(axis=0)
    varies = sd > 1e-12 * np.maximum(1.0, np.abs(L).max(axis=0))
    if not varies.any():
        raise SpecError("residual surface: every feature is constant; nothing to look up")
    # Every feature takes part: one that was constant in the rows keeps scale 1 (one
    # e-fold = one unit), so a query away from that constant is far from the data too.
    centre = L.mean(axis=0)
    scale = np.where(varies, sd, 1.0)
    Z = _standardize(Xa, offset_all, centre, scale)
    from scipy.spatial import cKDTree

    # the spacing of the measured points: nearest-neighbour distances between *distinct*
    # points (repeated measurements of one shape are at distance 0)
    U = np.unique(Z, axis=0)  # >= 2 points: some feature varies
    dist, _ = cKDTree(U).query(U, k=2)
    nn = dist[:, 1]
    return ResidualSurface(
        offset=offset_all,
        centre=centre,
        scale=scale,
        points=Z,
        log_ratio=np.log(ya / pa),
        neighbours=neighbours,
        radius=float(np.quantile(nn, 0.9)),
    )
