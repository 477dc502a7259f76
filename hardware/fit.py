"""Fitting max-affine cost profiles (and the roofline) to measured latencies.

The model is ``t(x) = max_k (α_k + β_k · x)`` with ``α_k ≥ 0`` and ``β_k ≥ 0`` (times
and rates are physical). Fitting it for a fixed number of pieces ``K`` is non-convex;
we use the least-squares partition algorithm of Magnani & Boyd, "Convex piecewise-
linear fitting", Optim. Eng. 10 (2009) §3:

1. partition the rows (random centres, several restarts),
2. fit each part by non-negative least squares (``scipy.optimize.nnls``) on *relative*
   residuals ``(α + β·x)/y − 1`` (latencies span 5 decades, and accuracy is judged
   in percent),
3. reassign every row to the piece that attains the max; repeat until stable,

then polish the best restart with bounded robust least squares on the true max
(``scipy.optimize.least_squares``, ``loss="soft_l1"``: a smooth Huber-like loss, so a
few outliers do not pull the pieces) and drop pieces that are active nowhere.

``K`` is chosen by *grouped* cross-validation: whole groups (e.g. GEMM shapes (n, k)),
not random rows, are held out, and the smallest ``K`` within 0.1 point of the best
held-out median error wins. Errors are median absolute percentage errors (MdAPE).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike, NDArray

from hardware.maxaffine import MaxAffine, Provenance
from hardware.residual import DEFAULT_NEIGHBOURS, build_surface
from perfmodel.errors import SpecError

if TYPE_CHECKING:
    pass

from hardware.folds import (
    DEFAULT_FOLDS,
    DEFAULT_MAX_PIECES,
    group_folds,
    mdape_pct,
    residual_cv,
    subsample,
)

Arr = NDArray[np.float64]


CV_TOLERANCE_PT = 0.1  # choose the fewest pieces within this many points of the best


MAX_FIT_ROWS = 20_000  # rows a fit uses (deterministic subsample above this)


MAX_CV_ROWS = 6_000  # rows per cross-validation fit (it only has to rank K)


CV_RESTARTS = 3


@dataclass(frozen=True)
class FitResult:
    """A fitted profile with its train and held-out errors (percent, MdAPE)."""

    profile: MaxAffine
    pieces: int
    train_mdape_pct: float
    heldout_mdape_pct: float | None
    cv_mdape_pct_by_pieces: dict[int, float] = field(default_factory=dict)
    rows: int = 0
    groups: int = 0
    seed: int = 0
    #: With ``residual=True``: errors of the profile with its residual surface.
    residual_train_mdape_pct: float | None = None
    residual_heldout_mdape_pct: float | None = None

    def to_dict(self) -> dict[str, object]:
        keys = ("rows", "groups", "pieces", "train_mdape_pct", "heldout_mdape_pct")
        return {
            **{k: getattr(self, k) for k in keys},
            "residual_train_mdape_pct": self.residual_train_mdape_pct,
            "residual_heldout_mdape_pct": self.residual_heldout_mdape_pct,
            "cv_mdape_pct_by_pieces": {str(k): v for k, v in self.cv_mdape_pct_by_pieces.items()},
            "profile": self.profile.to_dict(),
        }


def _check_xy(X: ArrayLike, y: ArrayLike) -> tuple[Arr, Arr]:
    Xa = np.asarray(X, dtype=np.float64)
    ya = np.asarray(y, dtype=np.float64)
    if Xa.ndim == 1:
        Xa = Xa[:, None]
    if Xa.ndim != 2 or ya.ndim != 1 or len(Xa) != len(ya):
        raise SpecError(f"features must be (rows, F) and times (rows,), got {Xa.shape}, {ya.shape}")
    if not (np.all(np.isfinite(Xa)) and np.all(np.isfinite(ya))):
        raise SpecError("features and times must be finite numbers (found NaN or inf)")
    if np.any(ya <= 0):
        raise SpecError(
            f"times must be positive; {int(np.sum(ya <= 0))} row(s) are zero or negative"
        )
    if np.any(Xa < 0):
        raise SpecError("features must be non-negative (a max-affine cost grows with them)")
    return Xa, ya


def _piece_values(P: Arr, Z: Arr) -> Arr:
    return P[:, 0][None, :] + Z @ P[:, 1:].T


def _fit_part(Z: Arr, y: Arr, idx: NDArray[np.intp], free: NDArray[np.bool_]) -> Arr:
    """Non-negative least squares of one piece on rows ``idx`` (relative residuals)."""
    from scipy.optimize import nnls

    A = np.hstack([np.ones((len(idx), 1)), Z[idx]])[:, free] / y[idx, None]
    coef, _ = nnls(A, np.ones(len(idx)), maxiter=50 * A.shape[1])
    out = np.zeros(len(free))
    out[free] = coef
    return out


def _alternate(
    Z: Arr, y: Arr, K: int, free: NDArray[np.bool_], rng: np.random.Generator, max_iter: int
) -> Arr:
    n = len(y)
    L = np.log1p(Z / np.maximum(Z.mean(axis=0), 1e-300))
    centres = L[rng.choice(n, size=K, replace=False)]
    labels = np.argmin(((L[:, None, :] - centres[None]) ** 2).sum(axis=-1), axis=1)
    P = np.zeros((K, Z.shape[1] + 1))
    need = int(free.sum(axis=1).max())
    for _ in range(max_iter):
        for k in range(K):
            idx = np.flatnonzero(labels == k)
            if len(idx) < need:  # an empty part: reseed it on random rows
                idx = rng.choice(n, size=min(n, 4 * need), replace=False)
            P[k] = _fit_part(Z, y, idx, free[k])
        new = _piece_values(P, Z).argmax(axis=1)
        if np.array_equal(new, labels):
            break
        labels = new
    return P


def _polish(P: Arr, Z: Arr, y: Arr, free: NDArray[np.bool_], f_scale: float) -> Arr:
    from scipy.optimize import least_squares

    K, F1 = P.shape
    fi = np.flatnonzero(free.ravel())
    Zi = np.hstack([np.ones((len(y), 1)), Z]) / y[:, None]

    def unpack(th: Arr) -> Arr:
        Q = np.zeros(K * F1)
        Q[fi] = th
        return Q.reshape(K, F1)

    def res(th: Arr) -> Arr:
        return _piece_values(unpack(th), Z).max(axis=1) / y - 1.0

    def jac(th: Arr) -> Arr:
        act = _piece_values(unpack(th), Z).argmax(axis=1)
        J = np.zeros((len(y), K * F1))
        for k in range(K):
            s = act == k
            J[s, k * F1 : (k + 1) * F1] = Zi[s]
        return J[:, fi]

    x0 = np.maximum(P.ravel()[fi], 0.0)
    r = least_squares(
        res, x0, jac=jac, bounds=(0.0, np.inf), loss="soft_l1", f_scale=f_scale,
        x_scale="jac", max_nfev=60, tr_solver="lsmr",
    )  # fmt: skip
    return unpack(r.x)


def fit_max_affine(
    X: ArrayLike,
    y: ArrayLike,
    *,
    pieces: int,
    features: tuple[str, ...] | None = None,
    mask: ArrayLike | None = None,
    seed: int = 0,
    restarts: int = 6,
    max_iter: int = 25,
    f_scale: float = 0.02,
    polish: bool = True,
    max_rows: int = MAX_FIT_ROWS,
    piece_names: tuple[str, ...] = (),
    provenance: Provenance | None = None,
) -> MaxAffine:
    """Fit ``t = max_k (α_k + β_k·x)`` with non-negative α, β to rows ``(X, y)``.

    Parameters
    ----------
    X, y : features (rows, F) and times in seconds (rows,), all positive.
    pieces : K, the number of affine pieces.
    mask : optional boolean (K, F+1) array: which of (intercept, slopes...) each piece may
        use (e.g. the expert block ``max(a + b·G, c + β·N)`` is ``[[1,1,0],[1,0,1]]``).
        With a mask, pieces keep their order and names; without one, pieces that are
        active on no row are dropped.
    seed : seed of the restarts' random partitions (a ``numpy.random.Generator``).
    f_scale : soft-L1 scale of the relative residual (0.02 = 2 %).
    max_rows : above this many rows, a seeded uniform subsample is fitted (the pieces of a
        20,000-row sample agree with the full fit well inside the data's noise; it bounds
        the fit time). Pieces are pruned and errors reported on all rows.
    """
    Xa, ya = _check_xy(X, y)
    n, F = Xa.shape
    if pieces < 1:
        raise SpecError(f"pieces must be >= 1, got {pieces}")
    free = np.ones((pieces, F + 1), dtype=bool) if mask is None else np.asarray(mask, bool)
    if free.shape != (pieces, F + 1):
        raise SpecError(f"mask must be (pieces, features + 1) = {(pieces, F + 1)}")
    if n < pieces * (F + 1):
        raise SpecError(
            f"{n} rows are too few for {pieces} piece(s) of {F} feature(s): need at least "
            f"{pieces * (F + 1)}; use fewer pieces or more data"
        )
    scale = np.max(Xa, axis=0)
    scale[scale == 0] = 1.0
    Z_all = Xa / scale
    rng = np.random.default_rng(seed)
    sub = subsample(np.arange(n), max_rows, rng)
    Z, ya_all, ya = Z_all[sub], ya, ya[sub]
    best: tuple[float, Arr] | None = None
    for _ in range(restarts if pieces > 1 else 1):
        P = _alternate(Z, ya, pieces, free, rng, max_iter)
        err = float(np.median(np.abs(_piece_values(P, Z).max(axis=1) / ya - 1.0)))
        if best is None or err < best[0]:
            best = (err, P)
    assert best is not None
    P = _polish(best[1], Z, ya, free, f_scale) if polish else best[1]
    names = piece_names
    if mask is None:
        active = np.unique(_piece_values(P, Z_all).argmax(axis=1))
        P = P[active]
        names = tuple(piece_names[i] for i in active) if piece_names else ()
    slopes = P[:, 1:] / scale
    feats = features or tuple(f"x{j}" for j in range(F))
    return MaxAffine(
        features=tuple(feats),
        intercepts_s=P[:, 0],
        slopes=slopes,
        provenance=provenance or Provenance("?", "?", source="fit", rows=len(ya_all)),
        piece_names=names,
    )


def _pieces_by_cv(
    cv_fits: Callable[[int], list[tuple[NDArray[np.intp], MaxAffine]]],
    Xa: Arr, ya: Arr, max_pieces: int, cv: dict[int, float],
) -> int:  # fmt: skip
    """Fewest pieces within :data:`CV_TOLERANCE_PT` of the best cross-validated MdAPE
    (fills ``cv`` with the error of every K tried)."""
    for K in range(1, max_pieces + 1):
        fits = cv_fits(K)
        if fits:
            cv[K] = float(np.mean([mdape_pct(p(Xa[te]), ya[te]) for te, p in fits]))
    if not cv:
        raise SpecError("too few rows to fit even one piece; give more data")
    best = min(cv.values())
    return min(K for K, e in cv.items() if e <= best + CV_TOLERANCE_PT)


def fit_profile(
    X: ArrayLike,
    y: ArrayLike,
    *,
    features: tuple[str, ...],
    groups: ArrayLike | None = None,
    pieces: int | None = None,
    max_pieces: int = DEFAULT_MAX_PIECES,
    folds: int = DEFAULT_FOLDS,
    seed: int = 0,
    device: str = "?",
    op: str = "?",
    dtype: str = "bf16",
    source: str = "",
    notes: str = "",
    holdout: ArrayLike | None = None,
    progress: Callable[[int], None] | None = None,
    residual: bool = False,
    neighbours: int = DEFAULT_NEIGHBOURS,
) -> FitResult:
    """Fit a profile, choosing ``pieces`` by grouped cross-validation when not given.

    ``groups`` labels rows that must be held out together (default: every row its own
    group). ``holdout`` (boolean per row) reserves rows that are never fitted; their error
    is ``heldout_mdape_pct``. Without it, the held-out error is the cross-validated error
    of the chosen number of pieces. ``progress(1)`` is called after each of the
    :func:`fit_steps` fits.

    ``residual=True`` attaches the measured residual surface of the training rows
    (:mod:`hardware.residual`); ``residual_heldout_mdape_pct`` is its error on the
    ``holdout`` rows, or else cross-validated: per fold, pieces and surface from the other
    folds only (with ``pieces`` given, the pure pieces' error is cross-validated the same
    way and reported as ``heldout_mdape_pct``).
    """
    Xa, ya = _check_xy(X, y)
    n = len(ya)
    g = np.arange(n) if groups is None else np.asarray(groups)
    if len(g) != n:
        raise SpecError("one group label per row")
    test = np.zeros(n, dtype=bool) if holdout is None else np.asarray(holdout, dtype=bool)
    train = np.flatnonzero(~test)
    cv: dict[int, float] = {}
    need_cv = pieces is None or (residual and not test.any())
    fold = group_folds(g[train], folds, seed=seed) if need_cv else None
    fold_fits: dict[int, list[tuple[NDArray[np.intp], MaxAffine]]] = {}

    def cv_fits(K: int) -> list[tuple[NDArray[np.intp], MaxAffine]]:
        """Per fold: the held-out rows and the K-piece profile fitted without them."""
        assert fold is not None
        out = []
        for f in range(folds):
            tr, te = train[fold != f], train[fold == f]
            if progress is not None:
                progress(1)
            if len(tr) < K * (Xa.shape[1] + 1):
                continue
            p = fit_max_affine(
                Xa[tr], ya[tr], pieces=K, features=features, seed=seed + K + 7 * f,
                restarts=CV_RESTARTS, max_rows=MAX_CV_ROWS,
            )  # fmt: skip
            out.append((te, p))
        fold_fits[K] = out
        return out

    if pieces is None:
        pieces = _pieces_by_cv(cv_fits, Xa, ya, max_pieces, cv)
    prof = fit_max_affine(Xa[train], ya[train], pieces=pieces, features=features, seed=seed)
    if progress is not None:
        progress(1)
    train_err = mdape_pct(prof(Xa[train]), ya[train])
    res_train: float | None = None
    res_held: float | None = None
    if residual and not test.any():
        # Cross-validated like the pieces: each fold's surface is built from the rows (and
        # the pieces) of the other folds only, and compared with those pieces alone.
        fits = fold_fits[pieces] if pieces in fold_fits else cv_fits(pieces)
        errs = residual_cv(fits, Xa, ya, train, neighbours)
        if errs is not None:
            res_held = errs[1]
            cv.setdefault(pieces, errs[0])
    if residual:
        surf = build_surface(Xa[train], ya[train], prof(Xa[train]), neighbours=neighbours)
        prof = prof.with_residual(surf)
        res_train = mdape_pct(prof(Xa[train]), ya[train])
        if test.any():
            res_held = mdape_pct(prof(Xa[test]), ya[test])
    if test.any():
        held: float | None = mdape_pct(prof.pure()(Xa[test]), ya[test])
    else:
        held = cv.get(pieces)
    prov = Provenance(
        device=device,
        op=op,
        dtype=dtype,
        source=source or "fit",
        rows=len(train),
        train_mape=train_err,
        heldout_mape=held,
        residual_heldout_mape=res_held,
        notes=notes
        or (
            f"max-affine, {prof.pieces} piece(s), MdAPE in percent, seed {seed}"
            + (f"; residual surface of {len(train)} rows" if residual else "")
        ),
    )
    return FitResult(
        residual_train_mdape_pct=res_train,
        residual_heldout_mdape_pct=res_held,
        profile=prof.with_provenance(prov),
        pieces=prof.pieces,
        train_mdape_pct=train_err,
        heldout_mdape_pct=held,
        cv_mdape_pct_by_pieces=cv,
        rows=n,
        groups=len(np.unique(g)),
        seed=seed,
    )
