"""Cross-validation for fitting profiles: grouped folds, subsamples, the MdAPE metric and
the residual surface's cross-validated error."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from hardware.maxaffine import MaxAffine
from hardware.residual import build_surface
from perfmodel.errors import SpecError

Arr = NDArray[np.float64]

DEFAULT_MAX_PIECES = 6
DEFAULT_FOLDS = 4


def mdape_pct(pred: ArrayLike, y: ArrayLike) -> float:
    """Median absolute percentage error, in percent: ``100·median(|pred/y − 1|)``."""
    p = np.asarray(pred, dtype=np.float64)
    t = np.asarray(y, dtype=np.float64)
    return float(100.0 * np.median(np.abs(p / t - 1.0)))


def subsample(idx: NDArray[np.intp], cap: int, rng: np.random.Generator) -> NDArray[np.intp]:
    return np.sort(rng.choice(idx, size=cap, replace=False)) if len(idx) > cap else idx


def group_folds(groups: ArrayLike, folds: int, *, seed: int) -> NDArray[np.intp]:
    """Fold number of each row; all rows of a group share a fold (whole groups held out)."""
    g = np.asarray(groups)
    uniq, inv = np.unique(g, return_inverse=True)
    if len(uniq) < folds:
        raise SpecError(
            f"only {len(uniq)} group(s) for {folds}-fold held-out validation; "
            "give more groups (shapes) or fewer folds"
        )
    order = np.random.default_rng(seed).permutation(len(uniq))
    fold_of_group = np.empty(len(uniq), dtype=np.intp)
    fold_of_group[order] = np.arange(len(uniq)) % folds
    return fold_of_group[inv]


def fit_steps(
    *,
    pieces: int | None,
    max_pieces: int = DEFAULT_MAX_PIECES,
    folds: int = DEFAULT_FOLDS,
    residual: bool = False,
    holdout: bool = False,
) -> int:
    """Number of ``progress(1)`` calls :func:`fit_profile` makes (one per fit); ``holdout``:
    whether rows are held out (then the residual surface needs no cross-validation)."""
    if pieces is None:
        return max_pieces * folds + 1
    return 1 + (folds if residual and not holdout else 0)


def residual_cv(
    fits: list[tuple[NDArray[np.intp], MaxAffine]], Xa: Arr, ya: Arr,
    train: NDArray[np.intp], neighbours: int,
) -> tuple[float, float] | None:  # fmt: skip
    """Cross-validated (pure, with-surface) MdAPE: each fold's surface from the other folds."""
    pure_errs, res_errs = [], []
    for te, p in fits:
        tr = np.setdiff1d(train, te)
        s_f = build_surface(Xa[tr], ya[tr], p(Xa[tr]), neighbours=neighbours)
        pt = p(Xa[te])
        pure_errs.append(mdape_pct(pt, ya[te]))
        res_errs.append(mdape_pct(pt * np.exp(s_f.log_correction(Xa[te])), ya[te]))
    if not res_errs:
        return None
    return float(np.mean(pure_errs)), float(np.mean(res_errs))
