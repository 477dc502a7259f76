"""Speed and accuracy of max-affine profiles; the expert-block crossover n*.

Run: ``python benchmarks/bench_profile_fit.py [--quick]``. Prints

1. speed: fitting 100,000 rows (fixed K and K chosen by held-out error) and evaluating
   a profile on 1,000,000 points;
2. GEMM accuracy per device (../shared/data/silicon/*__gemm.csv, bf16): 25 % of the
   (n, k) shapes held out whole; median APE of the max-affine profile, the calibrated
   roofline and the best single affine fit, per m bucket;
3. MoE-layer accuracy per device (*__moe.csv, bf16): whole (hidden, inter, topk,
   experts, ep, distribution) groups held out;
4. n* for the qwen3-235b-a22b and deepseek-v3 experts: from GEMM rows and from the MoE
   layer on A100/H100 (95 % bootstrap), and derived from the roofline for every GPU.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hardware.calibrate import calibrate_roofline  # noqa: E402
from hardware.device import catalog_ids, load_device  # noqa: E402
from hardware.fit import fit_max_affine, fit_profile, group_folds, mdape_pct  # noqa: E402
from hardware.maxaffine import GEMM_FEATURES, MaxAffine, gemm_features  # noqa: E402
from hardware.measurements import read_measurements  # noqa: E402
from hardware.residual import build_surface  # noqa: E402
from hardware.roofline import gemm_flops_bytes  # noqa: E402
from perfmodel.moe.expert import (  # noqa: E402
    MOE_LAYER_FEATURES,
    crossover_interval,
    crossover_tokens,
    derived_expert_profile,
    gemm_block_rows,
    moe_layer_features,
    rank_load,
)

DATA = ROOT.parent / "shared" / "data" / "silicon"
DEVICES = {"a100_sxm": "a100-sxm-80gb", "h100_sxm": "h100-sxm"}
SHAPES = {"qwen3-235b-a22b": (4096, 1536), "deepseek-v3": (7168, 2048)}
BUCKETS = ((1, 64), (64, 512), (512, 4096), (4096, np.inf))
QUICK = "--quick" in sys.argv


def speed() -> None:
    rng = np.random.default_rng(0)
    X = np.exp(rng.uniform(np.log(10), np.log(1e5), size=(100_000, 2)))
    true = MaxAffine(
        ("u", "v"), np.array([5e-6, 1e-6, 2e-6]),
        np.array([[0.0, 0.0], [2e-9, 1e-10], [1e-10, 3e-9]]),
    )  # fmt: skip
    y = true(X) * rng.lognormal(0.0, 0.02, size=len(X))
    t0 = time.perf_counter()
    fit_max_affine(X, y, pieces=3, seed=0)
    t1 = time.perf_counter()
    fit_profile(X, y, features=("u", "v"), groups=rng.integers(0, 400, len(X)), seed=0)
    t2 = time.perf_counter()
    P = np.exp(rng.uniform(0, 12, size=(1_000_000, 2)))
    t3 = time.perf_counter()
    true(P)
    t4 = time.perf_counter()
    # The same profile with the residual surface of the 100,000 fitted rows, evaluated on
    # 1,000,000 points drawn like them (every point near the data: the worst case).
    surf = true.with_residual(build_surface(X, y, true(X)))
    Pn = np.exp(rng.uniform(np.log(10), np.log(1e5), size=(1_000_000, 2)))
    t5 = time.perf_counter()
    surf(Pn)
    t6 = time.perf_counter()
    print("## speed")
    print(f"fit 100,000 rows, K=3 fixed:               {t1 - t0:6.2f} s")
    print(f"fit 100,000 rows, K chosen by 4-fold CV:   {t2 - t1:6.2f} s")
    print(f"evaluate 3-piece profile on 1,000,000 pts: {t4 - t3:6.3f} s")
    print(f"  ... with a 100,000-row residual surface:  {t6 - t5:6.3f} s (all points near data)")


def _buckets(m: np.ndarray, pred: np.ndarray, y: np.ndarray) -> list[float]:
    return [mdape_pct(pred[(m >= lo) & (m < hi)], y[(m >= lo) & (m < hi)]) for lo, hi in BUCKETS]


def gemm_accuracy(dev_file: str, dev_id: str) -> None:
    d = read_measurements(
        str(DATA / f"{dev_file}__gemm.csv"), time_col="latency_ms", where={"gemm_dtype": "bfloat16"}
    )
    m, n, k = (d.numeric(c) for c in "mnk")
    y = d.time_s
    test = group_folds(n * 1e6 + k, 4, seed=0) == 0
    X = gemm_features(m, n, k)
    res = fit_profile(
        X[~test], y[~test], features=GEMM_FEATURES, groups=(n * 1e6 + k)[~test], residual=True
    )
    aff = fit_max_affine(X[~test], y[~test], pieces=1, features=GEMM_FEATURES)
    f, b = gemm_flops_bytes(m, n, k, act_bytes=2.0)
    rl = calibrate_roofline(load_device(dev_id), f[~test], b[~test], y[~test])
    rl_t = rl.time_s(f, b, dtype="bf16")
    # The same residual surface on top of the roofline: how much the pieces still matter.
    rl_surf = build_surface(X[~test], y[~test], rl_t[~test])
    rows = {
        f"max-affine (K={res.pieces})": res.profile.pure()(X),
        "max-affine + residual": res.profile(X),
        "calibrated roofline": rl_t,
        "roofline + residual": rl_t * np.exp(rl_surf.log_correction(X)),
        "best single affine": aff(X),
    }
    print(
        f"\n## GEMM bf16 {dev_id}: {len(y)} rows, {int(test.sum())} held out "
        f"({len(np.unique((n * 1e6 + k)[test]))} of {len(np.unique(n * 1e6 + k))} shapes)"
    )
    print(
        f"roofline fit: eff_compute {rl.eff_compute:.3f}, eff_memory {rl.eff_memory:.3f}, "
        f"overhead {rl.overhead_s * 1e6:.2f} us; CV MdAPE by K: "
        + ", ".join(f"{K}:{e:.2f}" for K, e in res.cv_mdape_pct_by_pieces.items())
        + f"; with residual surface (CV on training shapes): {res.residual_heldout_mdape_pct:.2f}"
    )
    print(
        f"{'model':24s} {'train':>6s} {'held':>6s}   "
        + "  ".join(f"m {lo}-{hi:g}".ljust(11) for lo, hi in BUCKETS)
    )
    for name, pred in rows.items():
        bk = _buckets(m[test], pred[test], y[test])
        bt = _buckets(m[~test], pred[~test], y[~test])
        tr, te = mdape_pct(pred[~test], y[~test]), mdape_pct(pred[test], y[test])
        print(f"{name:24s} {tr:6.2f} {te:6.2f}   " + "  ".join(f"{e:11.2f}" for e in bk))
        print(f"{'   (train, per bucket)':38s}" + "  ".join(f"{e:11.2f}" for e in bt))
    subsample_check(m, n, k, y, dev_id, pieces=res.pieces)


def subsample_check(m, n, k, y, dev_id: str, *, pieces: int) -> None:
    """The deterministic half of the shapes used by the unit test (same split, fixed K)."""
    g = n * 1e6 + k
    u = np.unique(g)
    keep = np.isin(g, u[:: max(1, len(u) // 200)])
    m, n, k, y, g = m[keep], n[keep], k[keep], y[keep], g[keep]
    test = group_folds(g, 4, seed=0) == 0
    X = gemm_features(m, n, k)
    t0 = time.perf_counter()
    prof = fit_max_affine(X[~test], y[~test], pieces=pieces, features=GEMM_FEATURES, seed=0)
    dt = time.perf_counter() - t0
    aff = fit_max_affine(X[~test], y[~test], pieces=1, features=GEMM_FEATURES, seed=0)
    f, b = gemm_flops_bytes(m, n, k, act_bytes=2.0)
    rl = calibrate_roofline(load_device(dev_id), f[~test], b[~test], y[~test])
    print(
        f"test subsample: {len(np.unique(g))} shapes, {len(y)} rows, {int(test.sum())} held "
        f"out, K={pieces} (fit {dt:.2f} s)"
    )
    for name, pred in (
        ("max-affine", prof(X)),
        ("calibrated roofline", rl.time_s(f, b, dtype="bf16")),
        ("best single affine", aff(X)),
    ):
        bk = _buckets(m[test], pred[test], y[test])
        tr, te = mdape_pct(pred[~test], y[~test]), mdape_pct(pred[test], y[test])
        print(f"  {name:22s} {tr:6.2f} {te:6.2f}   " + "  ".join(f"{e:11.2f}" for e in bk))


def _moe(dev_file: str):
    d = read_measurements(
        str(DATA / f"{dev_file}__moe.csv"), time_col="latency_ms", where={"moe_dtype": "bfloat16"}
    )
    c = {
        x: d.numeric(x)
        for x in (
            "num_tokens",
            "hidden_size",
            "inter_size",
            "topk",
            "num_experts",
            "moe_tp_size",
            "moe_ep_size",
        )
    }
    mats = np.where(d.columns["kernel_source"] == "moe_torch_flow_nongated", 2.0, 3.0)
    X = moe_layer_features(
        c["num_tokens"], c["hidden_size"], c["inter_size"], c["topk"], c["num_experts"],
        c["moe_tp_size"], c["moe_ep_size"], d.columns["distribution"], mats=mats,
    )  # fmt: skip
    return d, c, mats, X


def moe_accuracy(dev_file: str, dev_id: str) -> None:
    d, _c, _, X = _moe(dev_file)
    grp = np.array(
        [
            "|".join(v)
            for v in zip(
                *(
                    d.columns[k]
                    for k in (
                        "hidden_size",
                        "inter_size",
                        "topk",
                        "num_experts",
                        "moe_ep_size",
                        "distribution",
                    )
                ),
                strict=True,
            )
        ]
    )
    test = group_folds(grp, 4, seed=0) == 0
    res = fit_profile(
        X[~test], d.time_s[~test], features=MOE_LAYER_FEATURES, groups=grp[~test], max_pieces=4
    )
    pred = res.profile(X)
    print(
        f"\n## MoE layer bf16 {dev_id}: {len(d)} rows, {len(np.unique(grp))} groups, "
        f"{len(np.unique(grp[test]))} held out; K={res.pieces}; MdAPE train "
        f"{mdape_pct(pred[~test], d.time_s[~test]):.2f}%, held-out "
        f"{mdape_pct(pred[test], d.time_s[test]):.2f}%"
    )


def crossover_table() -> None:
    print("\n## n* (tokens per activated expert), gated experts (3 matrices), bf16")
    print(f"{'device':14s} {'model':16s} {'source':30s} {'n*':>6s}  95% interval")
    for dev_file, dev_id in DEVICES.items():
        d = read_measurements(
            str(DATA / f"{dev_file}__gemm.csv"),
            time_col="latency_ms",
            where={"gemm_dtype": "bfloat16"},
        )
        m, n, k = (d.numeric(c) for c in "mnk")
        moe = _moe(dev_file)
        for model, (h, inter) in SHAPES.items():
            for padded in (True, False):
                G, N, _, t = gemm_block_rows(
                    m, n, k, d.time_s, hidden=h, inter=inter, padded=padded
                )
                cr = crossover_interval(G, N, t, boots=50 if QUICK else 200)
                src = f"GEMM rows, N {'padded' if padded else 'raw'}"
                print(
                    f"{dev_id:14s} {model:16s} {src:30s} {cr.n_star:6.0f}  "
                    f"[{cr.lo:.0f}, {cr.hi:.0f}]  (G=1 incl. intercepts: "
                    f"{crossover_tokens(cr.profile, G=1.0):.0f})"
                )
            dm, c, mats, _ = moe
            s = (c["hidden_size"] == h) & (c["inter_size"] == inter) & (c["moe_tp_size"] == 1)
            s &= mats == 3
            if s.sum() >= 20:
                loads = [
                    rank_load(int(a), int(e), int(kk), int(p), str(q))
                    for a, e, kk, p, q in zip(
                        c["num_tokens"][s],
                        c["num_experts"][s],
                        c["topk"][s],
                        c["moe_ep_size"][s],
                        dm.columns["distribution"][s],
                        strict=True,
                    )
                ]
                for padded in (True, False):
                    G = np.array([r.G for r in loads])
                    N = np.array([r.N_padded if padded else r.N for r in loads])
                    cr = crossover_interval(G, N, dm.time_s[s], boots=50 if QUICK else 200)
                    src = f"MoE layer tp1, N {'padded' if padded else 'raw'}"
                    print(
                        f"{dev_id:14s} {model:16s} {src:30s} {cr.n_star:6.0f}  "
                        f"[{cr.lo:.0f}, {cr.hi:.0f}]  ({int(s.sum())} rows)"
                    )
    print("\nderived from the roofline (eff 0.8/0.8; same for both shapes):")
    for dev_id in catalog_ids():
        dev = load_device(dev_id)
        if dev.kind != "gpu":
            continue
        try:
            prof = derived_expert_profile(dev, *SHAPES["qwen3-235b-a22b"])
        except Exception as e:  # a device without bf16 math
            print(f"  {dev_id:14s} n/a ({e})")
            continue
        print(f"  {dev_id:14s} n* = {crossover_tokens(prof):6.1f}")


def main() -> None:
    speed()
    for dev_file, dev_id in DEVICES.items():
        gemm_accuracy(dev_file, dev_id)
        moe_accuracy(dev_file, dev_id)
    crossover_table()


if __name__ == "__main__":
    main()
