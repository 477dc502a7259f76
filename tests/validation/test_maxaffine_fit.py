"""Fitting max-affine profiles: recovery of known profiles, robustness, seeds, real data."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from hardware.calibrate import calibrate_roofline
from hardware.device import load_device
from hardware.fit import fit_max_affine, fit_profile, group_folds, mdape_pct
from hardware.maxaffine import GEMM_FEATURES, MaxAffine, gemm_features
from hardware.measurements import read_measurements
from hardware.roofline import Roofline, gemm_flops_bytes
from perfmodel.errors import SpecError
from perfmodel.moe.expert import crossover_tokens, fit_expert_block, gemm_block_rows
from tests.conftest import shared_file

TRUE = MaxAffine(
    ("u", "v"),
    np.array([5e-6, 1e-6, 2e-6]),
    np.array([[0.0, 0.0], [2e-9, 1e-10], [1e-10, 3e-9]]),
)


def _synthetic(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = np.exp(rng.uniform(np.log(10.0), np.log(1e5), size=(n, 2)))
    return X, TRUE(X)


def _sorted(p: MaxAffine) -> np.ndarray:
    P = np.hstack([p.intercepts_s[:, None], p.slopes])
    return P[np.argsort(P[:, 1] + 10 * P[:, 2])]


def _assert_recovers(got: MaxAffine, X: np.ndarray) -> None:
    """Intercepts and non-zero slopes within 2 %; a zero slope adds < 2 % to its piece
    over the region where that piece is active (where the data can determine it)."""
    assert got.pieces == TRUE.pieces
    G, T = _sorted(got), _sorted(TRUE)
    nz = T != 0
    np.testing.assert_allclose(G[nz], T[nz], rtol=0.02)
    order = np.argsort(TRUE.slopes[:, 0] + 10 * TRUE.slopes[:, 1])
    active = TRUE.active_piece(X)
    for row, k in enumerate(order):
        region = X[active == k]
        floor = TRUE.piece_times(region)[:, k].min()
        for j in np.flatnonzero(~nz[row, 1:]):
            assert G[row, 1 + j] * region[:, j].max() < 0.02 * floor


def test_recovers_a_known_max_affine_function() -> None:
    X, y = _synthetic(3000, 0)
    _assert_recovers(fit_max_affine(X, y, pieces=3, seed=1), X)


def test_recovery_is_robust_to_outliers() -> None:
    X, y = _synthetic(3000, 1)
    y = y.copy()
    bad = np.random.default_rng(2).choice(len(y), size=90, replace=False)  # 3 % outliers
    y[bad] *= 3.0
    _assert_recovers(fit_max_affine(X, y, pieces=3, seed=0), X)


def test_number_of_pieces_chosen_by_heldout_error() -> None:
    X, y = _synthetic(600, 3)
    y = y * np.random.default_rng(4).lognormal(0.0, 0.01, size=len(y))  # 1 % noise
    res = fit_profile(X, y, features=("u", "v"), max_pieces=4, seed=0)
    assert res.pieces == 3
    assert res.heldout_mdape_pct is not None and res.heldout_mdape_pct < 1.5


def test_structured_expert_fit_recovers_crossover() -> None:
    # max(8us + 20us*G, 6us + 0.125us*N): n* = 20/0.125 = 160 tokens per expert
    G = np.repeat([1.0, 2.0, 4.0, 8.0], 40)
    n = np.tile(np.geomspace(1, 4096, 40), 4)
    t = np.maximum(8e-6 + 20e-6 * G, 6e-6 + 0.125e-6 * G * n)
    prof = fit_expert_block(G, G * n, t)
    assert crossover_tokens(prof) == pytest.approx(160.0, rel=0.02)


def test_calibrated_roofline_recovers_efficiencies() -> None:
    dev = load_device("h100-sxm")
    true = Roofline(dev, eff_compute=0.7, eff_memory=0.6, overhead_s=4e-6)
    m, n, k = (np.random.default_rng(0).choice([1, 16, 256, 4096], 400) for _ in range(3))
    f, b = gemm_flops_bytes(m, n, k, act_bytes=2.0)
    cal = calibrate_roofline(dev, f, b, true.time_s(f, b, dtype="bf16"))
    assert cal.eff_compute == pytest.approx(0.7, rel=0.01)
    assert cal.eff_memory == pytest.approx(0.6, rel=0.01)
    assert cal.overhead_s == pytest.approx(4e-6, rel=0.02)


def test_bad_input_is_a_clear_error() -> None:
    X, y = _synthetic(8, 0)
    with pytest.raises(SpecError, match="too few for 3 piece"):
        fit_max_affine(X, y, pieces=3)
    with pytest.raises(SpecError, match="zero or negative"):
        fit_max_affine(X, -y, pieces=1)
    with pytest.raises(SpecError, match="NaN"):
        fit_max_affine(X, np.full(8, np.nan), pieces=1)


@functools.cache
def _gemm_rows(name: str):
    return read_measurements(
        str(shared_file("silicon", name)), time_col="latency_ms", where={"gemm_dtype": "bfloat16"}
    )


def _gemm_subset(name: str, shapes: int):
    """Every j-th (n, k) shape (deterministic), all of its m rows."""
    d = _gemm_rows(name)
    m, n, k = (d.numeric(c) for c in "mnk")
    g = n * 1e6 + k
    keep = np.isin(g, np.unique(g)[:: max(1, len(np.unique(g)) // shapes)])
    return m[keep], n[keep], k[keep], d.time_s[keep], g[keep]


BUCKETS = ((1, 64), (64, 512), (512, 4096), (4096, np.inf))
#: Held-out MdAPE bound of the *pure* max-affine form per device (percent). H100 meets
#: issue 3's 5 %; the A100's pure form cannot (full data: 6.4 %; no global form gets below
#: ~5.1 %, benchmarks/explore_gemm_forms.py), so its bound is the measured figure plus
#: noise margin. The fitted profile with its residual surface meets 5 % on both GPUs
#: (tests/test_residual.py).
GEMM_BOUND_PCT = {"h100_sxm__gemm.csv": 5.0, "a100_sxm__gemm.csv": 7.0}
#: Pieces chosen by grouped cross-validation on the full training shapes (bench).
GEMM_PIECES = {"h100_sxm__gemm.csv": 4, "a100_sxm__gemm.csv": 3}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["h100_sxm__gemm.csv", "a100_sxm__gemm.csv"])
def test_gemm_heldout_shapes_beat_roofline_and_affine_in_every_m_bucket(name: str) -> None:
    """Whole (n, k) shapes held out (25 %) from a deterministic half of the shapes: the
    max-affine profile meets the error bound and beats both the calibrated roofline and
    the best single affine fit in every m bucket (full-data figures: bench)."""
    m, n, k, y, g = _gemm_subset(name, 200)
    test = group_folds(g, 4, seed=0) == 0
    X = gemm_features(m, n, k)
    prof = fit_max_affine(
        X[~test], y[~test], pieces=GEMM_PIECES[name], features=GEMM_FEATURES, seed=0
    )
    aff = fit_max_affine(X[~test], y[~test], pieces=1, features=GEMM_FEATURES, seed=0)
    dev = load_device("h100-sxm" if name.startswith("h100") else "a100-sxm-80gb")
    f, b = gemm_flops_bytes(m, n, k, act_bytes=2.0)
    rl = calibrate_roofline(dev, f[~test], b[~test], y[~test])
    preds = {"max-affine": prof(X), "affine": aff(X), "roofline": rl.time_s(f, b, dtype="bf16")}
    assert mdape_pct(preds["max-affine"][test], y[test]) <= GEMM_BOUND_PCT[name]
    for lo, hi in BUCKETS:
        s = test & (m >= lo) & (m < hi)
        assert s.sum() > 50
        err = {key: mdape_pct(p[s], y[s]) for key, p in preds.items()}
        assert err["max-affine"] < err["roofline"], (lo, err)
        assert err["max-affine"] < err["affine"], (lo, err)


def test_refit_with_another_seed_changes_heldout_error_by_less_than_a_point() -> None:
    m, n, k, y, g = _gemm_subset("h100_sxm__gemm.csv", 50)
    test = group_folds(g, 4, seed=0) == 0
    X = gemm_features(m, n, k)
    errs = [
        mdape_pct(fit_max_affine(X[~test], y[~test], pieces=4, seed=s)(X[test]), y[test])
        for s in (0, 1)
    ]
    assert max(errs) - min(errs) < 1.0


def test_a100_expert_crossover_from_gemm_rows() -> None:
    """A100 qwen3-235b expert (4096x1536, gated): n* from measured GEMMs near the ridge."""
    d = _gemm_rows("a100_sxm__gemm.csv")
    G, N, _, t = gemm_block_rows(
        d.numeric("m"), d.numeric("n"), d.numeric("k"), d.time_s, hidden=4096, inter=1536
    )
    n_star = crossover_tokens(fit_expert_block(G, N, t))
    assert 140 < n_star < 180  # roofline with equal efficiencies: 153


MOE_GROUP_COLS = ("hidden_size", "inter_size", "topk", "num_experts", "moe_ep_size", "distribution")
#: Pieces chosen by grouped cross-validation on the training groups (bench_profile_fit.py).
MOE_PIECES = {"h100_sxm__moe.csv": 1, "a100_sxm__moe.csv": 3}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["h100_sxm__moe.csv", "a100_sxm__moe.csv"])
def test_moe_layer_heldout_groups_within_ten_percent(name: str) -> None:
    """Fused MoE layer (bf16): whole (hidden, inter, top-k, experts, EP, routing) groups
    held out (25 %); the max-affine profile over per-GPU expert loads stays within the
    issue's 10 % held-out MdAPE (full data: A100 7.0 %, H100 9.1 %)."""
    from perfmodel.moe.expert import MOE_LAYER_FEATURES, moe_layer_features

    d = read_measurements(
        str(shared_file("silicon", name)), time_col="latency_ms", where={"moe_dtype": "bfloat16"}
    )
    cols = ("num_tokens", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size")
    c = {x: d.numeric(x) for x in (*cols, "moe_ep_size")}
    mats = np.where(d.columns["kernel_source"] == "moe_torch_flow_nongated", 2.0, 3.0)
    X = moe_layer_features(
        c["num_tokens"], c["hidden_size"], c["inter_size"], c["topk"], c["num_experts"],
        c["moe_tp_size"], c["moe_ep_size"], d.columns["distribution"], mats=mats,
    )  # fmt: skip
    grp = np.array(["|".join(v) for v in zip(*(d.columns[k] for k in MOE_GROUP_COLS), strict=True)])
    test = group_folds(grp, 4, seed=0) == 0
    prof = fit_max_affine(
        X[~test], d.time_s[~test], pieces=MOE_PIECES[name], features=MOE_LAYER_FEATURES, seed=0
    )
    assert mdape_pct(prof(X[test]), d.time_s[test]) <= 10.0
