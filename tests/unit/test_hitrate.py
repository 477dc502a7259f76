"""Hit-rate models against exact simulations, Monte-Carlo routing and a published vector."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from perfmodel.cache.hitrate import (
    activation_from_counts,
    che_lru,
    che_lru_steps,
    inclusion_probabilities,
    irm_requests,
    simulate_lru,
    simulate_lru_steps,
    static_hit_ratio,
    step_activation,
)
from perfmodel.errors import SpecError
from perfmodel.moe.distinct import distinct_experts_uniform, expected_distinct
from perfmodel.moe.routing import counts_csv_text, expert_popularity, load_counts_csv, sample_counts
from perfmodel.workload.popularity import zipf_popularity


def test_che_t11_vector() -> None:
    # formal_models.md T11: Zipf 0.8, N = 1000, C = 100 -> T_C ≈ 133.9, hit ≈ 0.378.
    r = che_lru(zipf_popularity(1000, 0.8), 100)
    assert r.characteristic_time == pytest.approx(133.9, abs=0.05)
    assert r.hit_ratio == pytest.approx(0.378, abs=5e-4)


@pytest.mark.parametrize("exponent", [0.6, 0.8, 1.0, 1.2])
def test_che_within_2pp_of_exact_lru(exponent: float) -> None:
    n = 1000
    p = zipf_popularity(n, exponent)
    req = irm_requests(p, 120_000, np.random.default_rng(int(exponent * 10)))
    for frac in (0.01, 0.05, 0.2, 0.5):
        c = int(frac * n)
        sim = simulate_lru(req, c, warmup=20_000)
        assert abs(che_lru(p, c).hit_ratio - sim.hit_ratio) < 0.02, (exponent, c)


def test_distinct_experts_uniform_matches_monte_carlo() -> None:
    rng = np.random.default_rng(7)
    for e, k, batches in ((8, 2, (1, 2, 4, 16)), (128, 8, (1, 4, 16, 64))):
        p = np.full(e, 1.0 / e)
        for b in batches:
            counts = sample_counts(p, b, k, layers=3000, seed=rng)
            mc = float((counts > 0).sum(axis=1).mean())
            assert distinct_experts_uniform(e, k, b) == pytest.approx(mc, rel=0.01), (e, k, b)


def test_distinct_experts_skewed_matches_monte_carlo() -> None:
    # Zipf(1.0) popularity, Plackett–Luce top-8 of 128 (the routing module's sampler).
    p = expert_popularity(128, dist="zipf", exponent=1.0, seed=3)
    pi = inclusion_probabilities(p, 8)
    assert pi.sum() == pytest.approx(8.0, abs=1e-9)
    rng = np.random.default_rng(11)
    for b in (1, 8, 32):
        counts = sample_counts(p, b, 8, layers=3000, seed=rng)
        mc = float((counts > 0).sum(axis=1).mean())
        assert float(expected_distinct(pi, b)) == pytest.approx(mc, rel=0.01), b
    # skew concentrates routing: fewer distinct experts than uniform at the same batch
    assert float(expected_distinct(pi, 32)) < float(distinct_experts_uniform(128, 8, 32))


@given(st.integers(2, 40), st.floats(0.0, 1.5), st.integers(0, 10_000))
def test_top1_inclusion_is_popularity(n: int, s: float, seed: int) -> None:
    p = expert_popularity(n, dist="zipf", exponent=s, seed=seed)
    np.testing.assert_allclose(inclusion_probabilities(p, 1), p, atol=1e-9)


@given(st.integers(2, 60), st.floats(0.0, 1.5), st.floats(0.0, 1.0))
def test_static_residency_is_optimal_under_irm(n: int, s: float, frac: float) -> None:
    p = zipf_popularity(n, s)
    c = frac * n
    assert static_hit_ratio(p, c) >= che_lru(p, c).hit_ratio - 1e-12


@pytest.mark.parametrize(("tokens", "capacity"), [(1, 8), (1, 16), (8, 16), (8, 32)])
def test_per_step_che_matches_exact_step_lru(tokens: int, capacity: int) -> None:
    e, k = 64, 4
    p = expert_popularity(e, dist="zipf", exponent=1.0, seed=5)
    counts = sample_counts(p, tokens, k, layers=6000, seed=9)
    steps = [np.flatnonzero(row) for row in counts]
    sim = simulate_lru_steps(steps, capacity, warmup=500)
    a = step_activation(inclusion_probabilities(p, k), tokens)
    che = che_lru_steps(a, capacity)
    assert abs(che.hit_ratio - sim.hit_ratio) < 0.02
    assert che.miss_rate == pytest.approx(sim.misses_per_step, rel=0.05)


def test_measured_counts_from_csv(tmp_path: Path) -> None:
    p = expert_popularity(16, dist="zipf", exponent=1.2, seed=1)
    from perfmodel.moe.routing import RoutingBatch

    batch = RoutingBatch(sample_counts(p, 512, 2, layers=40, seed=2), 2, "test")
    path = tmp_path / "counts.csv"
    path.write_text(counts_csv_text(batch))
    rec = load_counts_csv(path, num_experts=16, top_k=2)
    pi = activation_from_counts(rec.counts, rec.tokens)
    assert pi.sum() == pytest.approx(2.0)
    np.testing.assert_allclose(pi, inclusion_probabilities(p, 2), atol=0.02)


def test_zero_popularity_catalog_is_a_clear_error() -> None:
    with pytest.raises(SpecError, match="zero-popularity"):
        che_lru(np.zeros(10), 3)
    with pytest.raises(SpecError, match="zero-popularity"):
        activation_from_counts(np.zeros((3, 8)), np.ones(3))
    with pytest.raises(SpecError, match="positive popularity"):
        inclusion_probabilities(np.array([1.0, 0.0, 0.0]), 2)


def test_cache_holding_everything_always_hits() -> None:
    p = zipf_popularity(50, 1.0)
    assert che_lru(p, 50).hit_ratio == 1.0
    assert static_hit_ratio(p, 0) == 0.0
    assert simulate_lru([1, 2, 1, 2], 2).hits == 2
