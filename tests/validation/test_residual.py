"""The measured residual surface of a profile: lookup, fade-out, file round trip, accuracy."""

from __future__ import annotations

import numpy as np
import pytest

from hardware.fit import fit_max_affine, fit_profile, group_folds, mdape_pct
from hardware.maxaffine import GEMM_FEATURES, MaxAffine, gemm_features
from hardware.profile_io import load_profile_file, profile_to_toml
from hardware.residual import ResidualSurface, build_surface
from perfmodel.errors import SpecError
from tests.validation.test_maxaffine_fit import BUCKETS, _gemm_subset

PROFILE = MaxAffine(("u", "v"), np.array([1e-6, 0.0]), np.array([[1e-9, 0.0], [0.0, 2e-9]]))


def _grid() -> tuple[np.ndarray, np.ndarray]:
    u, v = np.meshgrid(np.geomspace(10, 1e4, 12), np.geomspace(10, 1e4, 12))
    X = np.c_[u.ravel(), v.ravel()]
    # a shape-local effect the max-affine form cannot say: +30 % where u is in [100, 1000)
    y = PROFILE(X) * np.where((X[:, 0] >= 100) & (X[:, 0] < 1000), 1.3, 1.0)
    return X, y


def test_one_neighbour_reproduces_every_measured_row() -> None:
    X, y = _grid()
    prof = PROFILE.with_residual(build_surface(X, y, PROFILE(X), neighbours=1))
    np.testing.assert_allclose(prof(X), y, rtol=1e-9)
    # pieces are untouched: the pure form and the active pieces are the max-affine's
    np.testing.assert_allclose(prof.pure()(X), PROFILE(X))
    np.testing.assert_array_equal(prof.active_piece(X), PROFILE.active_piece(X))


def test_local_step_is_followed_between_rows_and_fades_far_away() -> None:
    X, y = _grid()
    prof = PROFILE.with_residual(build_surface(X, y, PROFILE(X)))
    # between two measured u values inside the step: +30 % (all 4 neighbours are in it)
    mid = np.array([[np.sqrt(200.0 * 300.0), 50.0]])
    assert prof(mid)[0] / PROFILE(mid)[0] == pytest.approx(1.3, rel=1e-6)
    # far outside the measured box (100x beyond in both features): the pure profile
    far = np.array([[1e7, 1e7], [1e-2, 1e-2]])
    np.testing.assert_allclose(prof(far), PROFILE(far))


def test_fade_is_linear_between_one_and_two_radii() -> None:
    X = np.array([[1.0], [2.0], [4.0], [8.0]])
    base = MaxAffine(("u",), np.array([1.0]), np.array([[0.0]]))
    surf = build_surface(X, np.full(4, np.e), np.ones(4), neighbours=1)  # log-ratio 1
    # standardized log coordinates: one log-unit is scale / 1 = 1 / std
    step = 1.0 / surf.scale[0]
    r = surf.radius
    for d, want in ((0.5 * r, 1.0), (1.5 * r, 0.5), (2.5 * r, 0.0)):
        x = np.exp(np.log(8.0 + surf.offset[0]) + d / step) - surf.offset[0]
        assert surf.log_correction(np.array([[x]]))[0] == pytest.approx(want, abs=1e-9)
    assert base.with_residual(surf)(np.array([[8.0]]))[0] == pytest.approx(np.e)


def test_toml_round_trip_keeps_predictions(tmp_path) -> None:
    X, y = _grid()
    prof = PROFILE.with_residual(build_surface(X, y, PROFILE(X)))
    path = tmp_path / "p.toml"
    path.write_text(profile_to_toml(prof))
    back = load_profile_file(path)
    assert back.residual is not None and back.residual.rows == len(y)
    Q = np.exp(np.random.default_rng(0).uniform(np.log(5), np.log(2e4), size=(500, 2)))
    np.testing.assert_allclose(back(Q), prof(Q), rtol=1e-3)


def test_bad_surfaces_are_clear_errors(tmp_path) -> None:
    X, y = _grid()
    surf = build_surface(X, y, PROFILE(X))
    with pytest.raises(SpecError, match="residual surface has 2 feature"):
        MaxAffine(("u",), np.array([0.0]), np.array([[1.0]]), residual=surf)
    with pytest.raises(SpecError, match="fewer than the 4 neighbours"):
        build_surface(X[:3], y[:3], PROFILE(X[:3]))
    with pytest.raises(SpecError, match="must be positive"):
        build_surface(X, -y, PROFILE(X))
    d = surf.to_dict()
    del d["log_ratio"]
    with pytest.raises(SpecError, match="missing"):
        ResidualSurface.from_dict(d)
    text = profile_to_toml(PROFILE.with_residual(surf)).replace("neighbours = 4", "neighbours = 0")
    (tmp_path / "bad.toml").write_text(text)
    with pytest.raises(SpecError, match="neighbours must be between 1"):
        load_profile_file(tmp_path / "bad.toml")


@pytest.mark.slow
@pytest.mark.parametrize(("name", "pieces"), [("h100_sxm__gemm.csv", 4), ("a100_sxm__gemm.csv", 3)])
def test_gemm_profile_with_residual_surface_meets_five_percent_on_heldout_shapes(
    name: str, pieces: int
) -> None:
    """Issue 3's bound on whole held-out (n, k) shapes: the fitted profile with its
    measured residual surface is within 5 % MdAPE on both GPUs (full data: A100 3.85 %,
    H100 2.99 %; the pure max-affine 6.35 % / 4.77 %) and better than the pure form in
    every m bucket; the CV estimate on the training shapes predicts the held-out error
    within 1.5 points."""
    m, n, k, y, g = _gemm_subset(name, 10_000)  # every shape: the surface needs the density
    test = group_folds(g, 4, seed=0) == 0
    X = gemm_features(m, n, k)
    res = fit_profile(
        X[~test], y[~test], features=GEMM_FEATURES, groups=g[~test], pieces=pieces,
        residual=True,
    )  # fmt: skip
    full, pure = res.profile(X), res.profile.pure()(X)
    held = mdape_pct(full[test], y[test])
    assert held <= 5.0
    assert res.residual_heldout_mdape_pct is not None
    assert abs(res.residual_heldout_mdape_pct - held) < 1.5
    for lo, hi in BUCKETS:
        s = test & (m >= lo) & (m < hi)
        assert mdape_pct(full[s], y[s]) < mdape_pct(pure[s], y[s]), (lo, hi)
    # the surface never replaces the pieces: the pure form is the plain fit
    plain = fit_max_affine(X[~test], y[~test], pieces=pieces, features=GEMM_FEATURES, seed=0)
    np.testing.assert_allclose(res.profile.pure()(X), plain(X), rtol=1e-12)


def test_repeated_measurements_do_not_switch_the_surface_off() -> None:
    """Every shape measured twice: the reach comes from distinct points, not the zero
    distance between a shape's two rows (which would make it reach nothing)."""
    X, y = _grid()
    X2, y2 = np.vstack([X, X]), np.r_[y, y * 1.01]
    once = build_surface(X, y, PROFILE(X))
    twice = build_surface(X2, y2, PROFILE(X2))
    assert twice.radius == pytest.approx(once.radius) and twice.radius > 0
    mid = np.array([[np.sqrt(200.0 * 300.0), 50.0]])
    assert PROFILE.with_residual(twice)(mid)[0] / PROFILE(mid)[0] == pytest.approx(1.3, rel=0.02)
    with pytest.raises(SpecError, match="every feature is constant"):
        build_surface(X[:1].repeat(5, axis=0), y[:1].repeat(5), PROFILE(X[:1]).repeat(5))


def test_a_feature_constant_in_the_data_still_counts_as_distance() -> None:
    """Fitted at v = 100 only: at v = 100 the step is corrected; 100x away in v (the
    feature the data never varied) the profile is the pure form again."""
    u = np.geomspace(10, 1e4, 30)
    X = np.c_[u, np.full(30, 100.0)]
    y = PROFILE(X) * np.where((u >= 100) & (u < 1000), 1.5, 1.0)
    prof = PROFILE.with_residual(build_surface(X, y, PROFILE(X)))
    q = np.array([[300.0, 100.0], [300.0, 1e4], [300.0, 1.0]])
    ratio = prof(q) / PROFILE(q)
    assert ratio[0] == pytest.approx(1.5, rel=1e-6)
    np.testing.assert_allclose(ratio[1:], 1.0)
