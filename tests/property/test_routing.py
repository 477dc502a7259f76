"""Routing batches: generator arithmetic, seeding, and the counts CSV."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from perfmodel.errors import SpecError
from perfmodel.model import load_model
from perfmodel.moe.routing import (
    RoutingBatch,
    batch_for_model,
    counts_csv_text,
    expert_popularity,
    generate_batch,
    load_counts_csv,
    sample_counts,
)


def test_zipf_popularity_hand_derived() -> None:
    # p_i = i^-1 / H_4 with H_4 = 25/12: 12/25, 6/25, 4/25, 3/25.
    p = expert_popularity(4, dist="zipf", exponent=1.0, permute=False)
    assert p == pytest.approx([0.48, 0.24, 0.16, 0.12])
    assert expert_popularity(5, exponent=0.0, permute=False) == pytest.approx([0.2] * 5)


def test_hot_set_popularity() -> None:
    # 25% of 8 experts = 2 hot ones share half the mass: 0.25 each, the 6 others 1/12.
    p = expert_popularity(8, dist="hot", hot_fraction=0.25, hot_mass=0.5, permute=False)
    assert p[:2] == pytest.approx([0.25, 0.25])
    assert p[2:] == pytest.approx([0.5 / 6] * 6)


@given(st.integers(2, 64), st.integers(0, 300), st.floats(0.0, 2.0), st.integers(0, 2**31 - 1))
def test_topk_rows_and_distinct_experts(E: int, T: int, s: float, seed: int) -> None:
    k = min(8, E)
    b = generate_batch(E, k, T, skew=s, seed=seed, layers=2)
    assert b.counts.shape == (2, E)
    assert np.all(b.counts.sum(axis=1) == k * T)  # every token picks k experts
    assert np.all(b.counts <= T)  # distinct experts per token


def test_seeded_and_reproducible() -> None:
    a = generate_batch(128, 8, 512, skew=1.2, seed=3).counts
    assert np.array_equal(a, generate_batch(128, 8, 512, skew=1.2, seed=3).counts)
    assert not np.array_equal(a, generate_batch(128, 8, 512, skew=1.2, seed=4).counts)


def test_top1_counts_follow_popularity() -> None:
    # With top-1 routing the count of expert i is Binomial(T, p_i): mean T·p_i.
    p = expert_popularity(4, exponent=1.0, permute=False)
    c = sample_counts(p, 200_000, 1, seed=1)[0]
    assert c / 200_000 == pytest.approx(p, abs=0.004)


def test_topk_saturates_hot_experts() -> None:
    # A very hot expert takes at most one row per token (top-k without replacement):
    # with-replacement sampling would give it ~0.97·2000 = 1940 rows.
    p = np.array([0.97, 0.01, 0.01, 0.01])
    c = sample_counts(p, 1000, 2, seed=0)[0]
    assert 990 <= c[0] <= 1000
    assert c.sum() == 2000


def test_batch_for_model_uses_expert_count_and_topk() -> None:
    m = load_model("deepseek-v3")
    b = batch_for_model(m, 100, skew=0.5, seed=0)
    assert b.num_experts == 256 and b.top_k == 8
    assert b.tokens[0] == pytest.approx(100.0)
    with pytest.raises(SpecError, match="not a mixture-of-experts"):
        batch_for_model(load_model("llama-3.1-8b"), 10)


def test_csv_round_trip(tmp_path) -> None:
    b = generate_batch(16, 2, 64, skew=1.0, layers=3, seed=5)
    f = tmp_path / "counts.csv"
    f.write_text(counts_csv_text(b, step=7))
    r = load_counts_csv(f, num_experts=16, top_k=2)
    assert np.array_equal(r.counts, b.counts)
    assert r.steps is not None and r.steps.tolist() == [7, 7, 7]
    assert r.layer_ids is not None and r.layer_ids.tolist() == [0, 1, 2]
    assert r.tokens == pytest.approx([64.0] * 3)


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("step,layer,e0,e1\n0,0,1,2\n", "2 expert columns but the model has 4"),
        ("step,layer,e0,e1,e2,e3\n0,0,1,-2,3,4\n", ">= 0"),
        ("step,layer,e0,e1,e2,e3\n0,0,1,x,3,4\n", "is not an integer"),
        ("layer,step,e0,e1,e2,e3\n0,0,1,2,3,4\n", "step,layer"),
        ("step,layer,e0,e1,e2,e3\n0,0,1,2\n", "expected 6 fields"),
    ],
)
def test_csv_errors(tmp_path, text: str, match: str) -> None:
    f = tmp_path / "c.csv"
    f.write_text(text)
    with pytest.raises(SpecError, match=match):
        load_counts_csv(f, num_experts=4)


def test_bad_inputs() -> None:
    with pytest.raises(SpecError, match="exponent"):
        expert_popularity(8, exponent=-1.0)
    with pytest.raises(SpecError, match="top_k"):
        sample_counts(np.full(4, 0.25), 10, 5)
    with pytest.raises(SpecError, match="unknown routing distribution"):
        expert_popularity(8, dist="gauss")
    with pytest.raises(SpecError, match=r"\(layers, experts\)"):
        RoutingBatch(np.zeros(3, dtype=np.int64), 1, "x")
