"""How far can a global functional form go on measured GEMM times? (issue 3's 5 % bound)

Run: ``python benchmarks/explore_gemm_forms.py [a100|h100]`` (default: both; ~2 min).
Whole (n, k) shapes are held out (25 %, the split of ``bench_profile_fit.py``); every
form is fitted on the rest and scored by held-out median absolute percentage error:

1. the max-affine profile over the GEMM features (K = 3, 4, 6);
2. one max-affine profile *per m value* (21 separate fits): removes any error from the
   m-dependence, so what remains is how the form follows (n, k);
3. the fastest of several kernels, ``t = min_j max_k (α_jk + β_jk·x)``, grown greedily
   (each step adds a "fast kernel" fitted to the rows predicted > 5 % too slow, or a piece
   to the kernel active where rows are > 5 % too fast, then polishes all parameters
   jointly with soft-L1 least squares): libraries pick among kernels, a min can follow;
4. the max-affine profile with its measured residual surface (``hardware.residual``).

The result that shaped the design (A100): 1 ≈ 6.4 %, 2 ≈ 5.8 %, 3 plateaus at ≈ 5.1 %,
4 ≈ 3.8 %. The shape-local steps (tile, split-K and wave choices per shape) are not a
function a global form learns from other shapes; nearby measured shapes carry them.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hardware.fit import fit_max_affine, fit_profile, group_folds, mdape_pct  # noqa: E402
from hardware.maxaffine import GEMM_FEATURES, gemm_features  # noqa: E402
from hardware.measurements import read_measurements  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "silicon"
TAU = 0.05  # rows off by more than this (log ratio) seed a new kernel or piece


def _pred(kernels: list[np.ndarray], A: np.ndarray) -> np.ndarray:
    return np.min([(A @ P.T).max(axis=1) for P in kernels], axis=0)


def _polish(kernels: list[np.ndarray], A: np.ndarray, y: np.ndarray) -> list[np.ndarray]:
    shapes = [P.shape for P in kernels]
    off = np.cumsum([0] + [P.size for P in kernels])

    def unpack(th: np.ndarray) -> list[np.ndarray]:
        return [th[off[i] : off[i + 1]].reshape(shapes[i]) for i in range(len(shapes))]

    def res(th: np.ndarray) -> np.ndarray:
        return _pred(unpack(th), A) / y - 1.0

    def jac(th: np.ndarray) -> np.ndarray:
        vals = [A @ P.T for P in unpack(th)]
        j = np.argmin([v.max(axis=1) for v in vals], axis=0)
        J = np.zeros((len(y), off[-1]))
        F1 = A.shape[1]
        for jj, v in enumerate(vals):
            ks = v.argmax(axis=1)
            for kk in range(v.shape[1]):
                s = (j == jj) & (ks == kk)
                c = off[jj] + kk * F1
                J[s, c : c + F1] = A[s] / y[s, None]
        return J

    th0 = np.concatenate([P.ravel() for P in kernels])
    r = least_squares(
        res, th0, jac=jac, bounds=(0.0, np.inf), loss="soft_l1", f_scale=0.02,
        x_scale="jac", max_nfev=150,
    )  # fmt: skip
    return unpack(r.x)


def min_of_max_affine(A: np.ndarray, y: np.ndarray, steps: int) -> list[np.ndarray]:
    """Greedy growth of ``min_j max_k`` from a 3-piece max-affine (see the docstring)."""
    p = fit_max_affine(A[:, 1:], y, pieces=3, seed=0)
    kernels = [np.c_[p.intercepts_s, p.slopes]]
    for step in range(steps):
        r = np.log(y / _pred(kernels, A))
        cands = []
        fast = r < -TAU
        if fast.sum() > 50:
            q = fit_max_affine(A[fast, 1:], y[fast], pieces=2, seed=step)
            cands.append(_polish([*kernels, np.c_[q.intercepts_s, q.slopes]], A, y))
        slow = r > TAU
        if slow.sum() > 50:
            act = np.argmin([(A @ P.T).max(axis=1) for P in kernels], axis=0)
            jj = int(np.bincount(act[slow], minlength=len(kernels)).argmax())
            q = fit_max_affine(A[slow, 1:], y[slow], pieces=1, seed=step)
            grown = [P.copy() for P in kernels]
            grown[jj] = np.vstack([grown[jj], np.c_[q.intercepts_s, q.slopes]])
            cands.append(_polish(grown, A, y))
        if not cands:
            break
        kernels = min(cands, key=lambda c: mdape_pct(_pred(c, A), y))
    return kernels


def explore(dev: str) -> None:
    d = read_measurements(
        str(DATA / f"{dev}_sxm__gemm.csv"), time_col="latency_ms",
        where={"gemm_dtype": "bfloat16"},
    )  # fmt: skip
    m, n, k = (d.numeric(c) for c in "mnk")
    y = d.time_s
    g = n * 1e6 + k
    test = group_folds(g, 4, seed=0) == 0
    X = gemm_features(m, n, k)
    tr = ~test
    print(f"\n## {dev} bf16: {len(y)} rows, {len(np.unique(g[test]))} shapes held out")
    print(f"{'form':60s} {'train':>6s} {'held':>6s} {'time':>6s}")

    def row(name: str, pred: np.ndarray, t0: float) -> None:
        tr_e, te_e = mdape_pct(pred[tr], y[tr]), mdape_pct(pred[test], y[test])
        print(f"{name:60s} {tr_e:6.2f} {te_e:6.2f} {time.perf_counter() - t0:5.1f}s", flush=True)

    for K in (3, 4, 6):
        t0 = time.perf_counter()
        row(f"max-affine, K={K}", fit_max_affine(X[tr], y[tr], pieces=K, seed=0)(X), t0)
    t0 = time.perf_counter()
    per_m = np.empty_like(y)
    for mv in np.unique(m):
        s = m == mv
        per_m[s] = fit_max_affine(X[s & tr], y[s & tr], pieces=3, seed=0)(X[s])
    row("one max-affine per m value (21 fits, K=3)", per_m, t0)
    scale = X[tr].max(axis=0)
    A = np.c_[np.ones(len(y)), X / scale]
    for steps in (2, 4, 6):
        t0 = time.perf_counter()
        kern = min_of_max_affine(A[tr], y[tr], steps)
        sizes = "+".join(str(P.shape[0]) for P in kern)
        row(f"min over kernels of max-affine, {steps} steps ({sizes} pieces)", _pred(kern, A), t0)
    t0 = time.perf_counter()
    res = fit_profile(
        X, y, features=GEMM_FEATURES, groups=g, pieces=3 if dev == "a100" else 4,
        holdout=test, residual=True,
    )  # fmt: skip
    row("max-affine + measured residual surface", res.profile(X), t0)


def main() -> None:
    devs = [a for a in sys.argv[1:] if a in ("a100", "h100")] or ["a100", "h100"]
    for dev in devs:
        explore(dev)


if __name__ == "__main__":
    main()
