"""Workloads: trace parsing and errors, presets vs the Azure traces, arrivals, SLOs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from perfmodel.errors import SpecError
from perfmodel.workload.arrivals import RenewalArrivals
from perfmodel.workload.lengths import fixed_lengths
from perfmodel.workload.presets import Workload, preset
from perfmodel.workload.slo import SLO
from perfmodel.workload.trace import load_trace

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "azure-llm-2023"


def _write(tmp_path: Path, text: str, name: str = "t.csv") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def test_azure_format(tmp_path: Path) -> None:
    p = _write(
        tmp_path,
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:17:03.9799600,4808,10\n"
        "2023-11-16 18:17:04.0319600,3180,8\n"
        "2023-11-16 18:17:05.9799600,110,27\n",
    )
    tr = load_trace(p)
    assert tr.n == 3
    assert tr.arrival_s.tolist() == pytest.approx([0.0, 0.052, 2.0])
    assert tr.input_tokens.tolist() == [4808, 3180, 110]
    assert tr.rate_per_s == pytest.approx(2 / 2.0)
    assert tr.replay_times_s(2.0).tolist() == pytest.approx([0.0, 0.026, 1.0])


def test_generic_format_any_column_order(tmp_path: Path) -> None:
    p = _write(tmp_path, "output_tokens,arrival_s,input_tokens\n5,0.0,100\n7,0.5,200\n")
    tr = load_trace(p)
    assert tr.input_tokens.tolist() == [100, 200]
    assert tr.output_tokens.tolist() == [5, 7]
    assert Workload.from_trace(tr).lengths.mean_input_tokens == 150


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty trace"),
        ("input_tokens,output_tokens\n", "no requests"),
        ("a,b\n1,2\n", ":1: unrecognized header"),
        ("input_tokens,output_tokens\n10,5\n10\n", ":3: expected 2 fields"),
        ("input_tokens,output_tokens\n10,5\n1x,5\n", ":3: input_tokens = '1x' is not an integer"),
        ("input_tokens,output_tokens\n10,0\n", ":2: output_tokens = 0 must be >= 1"),
        ("input_tokens,output_tokens,arrival_s\n1,1,2\n1,1,1\n", ":3: arrival time goes back"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,1\n", ":2: TIMESTAMP"),
    ],
)
def test_malformed_traces_name_the_line(tmp_path: Path, text: str, message: str) -> None:
    p = _write(tmp_path, text)
    with pytest.raises(SpecError, match=message.replace("(", r"\(")):
        load_trace(p)


def test_missing_file() -> None:
    with pytest.raises(SpecError, match="cannot read trace"):
        load_trace("/nonexistent/trace.csv")


@pytest.mark.parametrize(("name", "file"), [("chat", "conv.csv"), ("code", "code.csv")])
def test_presets_match_trace_moments(name: str, file: str) -> None:
    """The presets were fit to the first two moments of each trace marginal."""
    if not (DATA / file).exists():
        pytest.skip("../shared/data/azure-llm-2023 not present")
    tr = load_trace(DATA / file)
    ln = preset(name).lengths
    for side, x in (("input", tr.input_tokens), ("output", tr.output_tokens)):
        xs = x.astype(float)
        if side == "input":
            m1 = ln.expect(lambda s, o: s)
            m2 = ln.expect(lambda s, o: s * s)
        else:
            m1 = ln.expect(lambda s, o: o)
            m2 = ln.expect(lambda s, o: o * o)
        assert m1 == pytest.approx(xs.mean(), rel=0.01), side
        assert m2 == pytest.approx((xs**2).mean(), rel=0.03), side
        # the medians are not fitted: within 30 % (worst: chat output 163 vs 129 tokens)
        assert ln.quantile(0.5, side=side) == pytest.approx(np.median(xs), rel=0.3), side


def test_trace_burstiness() -> None:
    if not (DATA / "code.csv").exists():
        pytest.skip("../shared/data/azure-llm-2023 not present")
    assert load_trace(DATA / "code.csv").arrival_cv > 5  # bursts of simultaneous requests
    assert load_trace(DATA / "conv.csv").arrival_cv == pytest.approx(1.09, abs=0.05)


@pytest.mark.parametrize("cv", [0.5, 1.0, 3.0])
def test_renewal_arrivals_rate_and_cv(cv: float) -> None:
    t = RenewalArrivals(4.0, cv).times_s(200_000, np.random.default_rng(7))
    gaps = np.diff(t)
    assert 1 / gaps.mean() == pytest.approx(4.0, rel=0.02)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.03)


@pytest.mark.parametrize("rate", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_rates(rate: float) -> None:
    with pytest.raises(SpecError, match="positive"):
        RenewalArrivals(rate)


def test_slo_validation() -> None:
    with pytest.raises(SpecError, match="ttft_s"):
        SLO(ttft_s=0.0, tpot_s=0.1)
    with pytest.raises(SpecError, match="percentile"):
        SLO(ttft_s=1.0, tpot_s=0.1, percentile=90)
    with pytest.raises(SpecError, match="unknown workload"):
        preset("chatty")


def test_sampling_matches_atoms() -> None:
    ln = preset("chat").lengths
    s, o = ln.sample(100_000, np.random.default_rng(3))
    assert s.mean() == pytest.approx(ln.mean_input_tokens, rel=0.02)
    assert o.mean() == pytest.approx(ln.mean_output_tokens, rel=0.02)
    f = fixed_lengths(10, 3)
    assert f.max_total_tokens == 13


@pytest.mark.parametrize("seed", range(6))
def test_distinct_weights_are_unique_and_bincount_bit_for_bit(seed: int) -> None:
    """The one-pass count by value gives np.unique's values and the same float sums
    (the weights of a value added in the same order), on token counts and otherwise."""
    from perfmodel.workload.lengths import distinct_weights

    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 4000))
    cases = [
        rng.integers(0, int(rng.integers(1, 20000)), n),  # token counts: the fast path
        rng.integers(-50, 50, n),  # negative: np.unique
        rng.integers(0, 10**9, n),  # sparse and large: np.unique
    ]
    w = rng.random(n)
    for v in cases:
        u_ref, inv = np.unique(v, return_inverse=True)
        u, got = distinct_weights(v, w)
        assert u.dtype == u_ref.dtype
        assert np.array_equal(u, u_ref)
        assert np.array_equal(got, np.bincount(inv, weights=w))


def test_distinct_weights_of_a_preset() -> None:
    from perfmodel.workload.lengths import distinct_weights

    lw = preset("chat").lengths
    u, w = distinct_weights(lw.input_tokens, lw.weights)
    assert u.size == 512 and np.all(np.diff(u) > 0)  # 512 input atoms, ascending
    assert w.sum() == pytest.approx(1.0, rel=1e-12)
