"""Service rate, stability, latency, goodput and sizing of one instance."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hardware.device import load_device
from perfmodel.errors import SpecError
from perfmodel.model import load_model
from perfmodel.plan import ParallelPlan
from perfmodel.serving import goodput as q_goodput
from perfmodel.serving import service as q
from perfmodel.serving.servemix import mix_batch
from perfmodel.step.batch import Batch
from perfmodel.step.instance import Instance
from perfmodel.step.time import step_time
from perfmodel.workload.presets import preset
from perfmodel.workload.slo import SLO

M8 = load_model("llama-3.1-8b")
H100 = load_device("h100-sxm")
PLAN = ParallelPlan(tp=1)
CHAT = preset("chat")


@pytest.fixture(scope="module")
def chat_rate() -> q.ServiceRate:
    return q.service_rate(Instance(M8, H100, PLAN), CHAT)


def test_service_rate_is_min_of_bounds(chat_rate: q.ServiceRate) -> None:
    sr = chat_rate
    m = sr.moments
    # compute bound: B tokens per full iteration, E[s] + E[o] − 1 tokens per request
    t_full = float(step_time(M8, H100, mix_batch(sr.max_batched_tokens / m.tokens, m)).total_s)
    assert sr.compute_rate_per_s == pytest.approx(sr.max_batched_tokens / t_full / m.tokens)
    # memory bound: M_eff / (b̄ E[g]) at the KV-full iteration, with M_eff the capacity
    # minus the 1 % admission watermark and the mean free space E[c²]/(2E[c]) that FIFO
    # admission of whole first chunks c = min(s, C) leaves
    s, w = CHAT.lengths.input_tokens, CHAT.lengths.weights
    c = np.minimum(s, sr.chunk_size).astype(float)
    slack = float(np.dot(w, c * c)) / (2 * float(np.dot(w, c)))
    M = sr.kv_capacity_tokens
    assert sr.admission_slack_tokens == pytest.approx(slack)
    assert sr.effective_kv_tokens == pytest.approx(M - M // 100 - slack)
    assert sr.memory_rate_per_s == pytest.approx(
        (M - M // 100 - slack) / (sr.memory_step_s * m.lifetime_kv_token_steps)
    )
    assert sr.rate_per_s == min(sr.compute_rate_per_s, sr.memory_rate_per_s)
    assert sr.delta == pytest.approx(m.max_total_tokens / sr.kv_capacity_tokens)
    assert sr.guaranteed_rate_per_s == pytest.approx(sr.rate_per_s * (1 - sr.delta))


def test_small_kv_makes_memory_bind() -> None:
    big = q.service_rate(Instance(M8, H100, PLAN), CHAT)
    small = q.service_rate(Instance(M8, H100, PLAN), CHAT, kv_capacity_tokens=40_000)
    assert small.binding == "memory"
    assert small.rate_per_s < 0.8 * big.rate_per_s
    assert small.compute_rate_per_s == pytest.approx(big.compute_rate_per_s)


@settings(max_examples=15, deadline=None)
@given(m1=st.integers(20_000, 400_000), m2=st.integers(20_000, 400_000))
def test_rate_monotone_in_kv(m1: int, m2: int) -> None:
    lo, hi = sorted((m1, m2))
    a = q.service_rate(Instance(M8, H100, PLAN), CHAT, kv_capacity_tokens=lo)
    b = q.service_rate(Instance(M8, H100, PLAN), CHAT, kv_capacity_tokens=hi)
    assert a.rate_per_s <= b.rate_per_s * (1 + 1e-9)


def test_stability_verdict(chat_rate: q.ServiceRate) -> None:
    mu = chat_rate.rate_per_s
    ok = q.stability(chat_rate, 0.5 * mu)
    assert ok.stable and ok.guaranteed
    assert ok.margin == pytest.approx(0.5)
    bad = q.stability(chat_rate, 1.2 * mu)
    assert not bad.stable
    assert bad.margin == pytest.approx(-0.2)
    assert "unstable" in bad.explanation
    assert math.isinf(q.latency(chat_rate, 1.2 * mu).ttft_mean_s)


@pytest.mark.parametrize("rate", [0.0, -3.0])
def test_bad_rate(chat_rate: q.ServiceRate, rate: float) -> None:
    with pytest.raises(SpecError, match="positive"):
        q.stability(chat_rate, rate)


def test_latency_grows_with_load(chat_rate: q.ServiceRate) -> None:
    mu = chat_rate.rate_per_s
    lows, highs = q.latency(chat_rate, 0.2 * mu), q.latency(chat_rate, 0.7 * mu)
    assert highs.ttft_mean_s > lows.ttft_mean_s
    assert highs.tpot_mean_s > lows.tpot_mean_s
    for e in (lows, highs):
        assert e.ttft_p50_s <= e.ttft_p90_s <= e.ttft_p99_s
        assert e.tpot_p50_s <= e.tpot_p90_s <= e.tpot_p99_s
        assert e.ttft_cdf(e.ttft_p90_s) == pytest.approx(0.9, abs=1e-3)


def test_unloaded_latency_is_the_step_times(chat_rate: q.ServiceRate) -> None:
    """At a vanishing rate TPOT is one decode step of a lone request, TTFT its prefill."""
    e = q.latency(chat_rate, 1e-4)
    m = chat_rate.moments
    ctx = m.decode_context_tokens / m.decode_steps
    one = float(step_time(M8, H100, Batch.decode(1, ctx)).total_s)
    assert e.tpot_mean_s == pytest.approx(one, rel=0.01)
    s_med = CHAT.lengths.quantile(0.5, side="input")
    pre = float(step_time(M8, H100, Batch.prefill(1, s_med)).total_s)
    assert e.ttft_p50_s == pytest.approx(pre, rel=0.1)


def test_goodput_and_infeasible_slo(chat_rate: q.ServiceRate) -> None:
    g = q_goodput.goodput(chat_rate, SLO(ttft_s=1.0, tpot_s=0.05, percentile=0.9, goal=0.9))
    assert g.feasible and 0 < g.rate_per_s < chat_rate.rate_per_s
    assert g.at_goodput is not None and g.at_goodput.attainment >= 0.9
    above = q_goodput.slo_attainment(
        q.latency(chat_rate, min(g.rate_per_s * 1.05, 0.999 * chat_rate.rate_per_s)), g.slo
    )
    assert above.attainment < 0.9 + 1e-9 or g.rate_per_s > 0.99 * chat_rate.rate_per_s
    bad = q_goodput.goodput(chat_rate, SLO(ttft_s=0.001, tpot_s=0.05))
    assert not bad.feasible and bad.rate_per_s == 0
    assert "best achievable" in bad.explanation and "TTFT" in bad.explanation
    assert bad.best_ttft_quantile_s > 0.001


def test_goodput_unloaded_percentiles_computed_when_read(chat_rate: q.ServiceRate) -> None:
    """A feasible search leaves the unloaded percentiles uncomputed (the planner never
    reads them: two quantile searches per candidate saved); read, they are the unloaded
    estimate's own."""
    slo = SLO(ttft_s=1.0, tpot_s=0.05, percentile=0.9, goal=0.9)
    g = q_goodput.goodput(chat_rate, slo)
    assert g.feasible
    assert "ttft_quantile_s" not in vars(g.low) and "tpot_quantile_s" not in vars(g.low)
    low = q.latency(chat_rate, chat_rate.rate_per_s * 1e-4)
    assert g.low.rate_per_s == low.rate_per_s
    assert g.best_ttft_quantile_s == low.ttft_quantile_s(0.9)
    assert g.best_tpot_quantile_s == low.tpot_quantile_s(0.9)


def test_goodput_from_a_known_rate(
    chat_rate: q.ServiceRate, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``known``, a rate already estimated, is one end of the bracket: meeting the goal it
    is the low end and the unloaded estimate is not taken (until read); missing it, the
    high end. Either way the guarantee holds (the answer meets the goal, a rate within
    the tolerance above it misses), so the answer is the plain search's to the tolerance."""
    slo = SLO(ttft_s=1.0, tpot_s=0.05, percentile=0.9, goal=0.9)
    mu, tol = chat_rate.rate_per_s, 1e-3 * chat_rate.rate_per_s
    real = q_goodput.latency
    rates: list[float] = []

    def counted(sr: q.ServiceRate, r: float, **kw: Any) -> Any:
        rates.append(r)
        return real(sr, r, **kw)

    monkeypatch.setattr(q_goodput, "latency", counted)
    plain = q_goodput.goodput(chat_rate, slo)
    plain_estimates = len(rates)  # the unloaded one and the search's
    assert plain_estimates >= 4
    for frac in (0.5, 0.99):  # below the goodput (meets), above it (misses)
        known = q_goodput.slo_attainment(real(chat_rate, frac * mu), slo)
        assert known.meets_goal == (frac == 0.5)
        rates.clear()
        g = q_goodput.goodput(chat_rate, slo, known=known)
        assert g.feasible and abs(g.rate_per_s - plain.rate_per_s) <= tol
        assert g.at_goodput is not None and g.at_goodput.meets_goal
        if known.meets_goal:  # every estimate above it, none unloaded
            assert rates and min(rates) > known.rate_per_s and "low" not in vars(g)
            assert len(rates) < plain_estimates
            assert g.low.rate_per_s == mu * 1e-4  # estimated when read
            assert g.best_attainment == g.low.attainment and rates[-1] == mu * 1e-4
        else:  # the unloaded estimate, then every one below it
            assert rates[0] == mu * 1e-4 and max(rates[1:]) < known.rate_per_s
    # a known rate outside (μ·10⁻⁴, μ) is not used: the plain search, bit for bit
    far = q_goodput.slo_attainment(real(chat_rate, mu * 1e-5), slo)
    assert q_goodput.goodput(chat_rate, slo, known=far).rate_per_s == plain.rate_per_s


def test_goodput_stops_once_a_rate_below_the_ceiling_misses(chat_rate: q.ServiceRate) -> None:
    """``ceiling``: the search stops at the first missing rate at most the ceiling, and the
    goodput is below that rate; a ceiling below the goodput changes nothing."""
    slo = SLO(ttft_s=1.0, tpot_s=0.05, percentile=0.9, goal=0.9)
    g = q_goodput.goodput(chat_rate, slo).rate_per_s
    with pytest.raises(q_goodput.GoodputAtMost) as e:
        q_goodput.goodput(chat_rate, slo, ceiling=0.99 * chat_rate.rate_per_s)
    assert g < e.value.bound_per_s <= 0.99 * chat_rate.rate_per_s
    assert q_goodput.goodput(chat_rate, slo, ceiling=0.9 * g).rate_per_s == g


def test_instances_needed(chat_rate: q.ServiceRate) -> None:
    mu = chat_rate.rate_per_s
    s = q_goodput.instances_needed(chat_rate, 2.5 * mu, target_utilization=0.8)
    assert s.instances == math.ceil(2.5 / 0.8)
    assert s.necessary_instances == 3
    assert s.utilization == pytest.approx(2.5 / 4)
    g = q_goodput.instances_needed(chat_rate, 2.5 * mu, goodput_per_instance_per_s=0.3 * mu)
    assert g.instances == 9 and g.limited_by == "goodput"
    assert g.devices == 9


def test_model_that_does_not_fit() -> None:
    from perfmodel.errors import InfeasibleError

    with pytest.raises(InfeasibleError, match="does not fit"):
        q.service_rate(Instance(load_model("llama-3.1-70b"), H100, PLAN), CHAT)


def test_poisson_iteration_hand_checked() -> None:
    """Fixed 1,000-token prompts, r = 0.5 per iteration: b̄ = Σ_k Σ_j P(k)·P(j)·t(j decodes
    + k prompts) with K ~ Poisson(0.5) (each prompt one chunk, context 0) and the decode
    count J ~ Poisson(n_d) independent of K."""
    from scipy import stats

    from perfmodel.serving.servemix import poisson_iteration_s, request_moments
    from perfmodel.workload.lengths import fixed_lengths

    lengths = fixed_lengths(1000, 101)
    m = request_moments(lengths, 8192)
    r, n_d = 0.5, 50.0
    got = poisson_iteration_s(
        Instance(M8, H100, PLAN), np.array([1000.0]), np.array([1.0]), m,
        prompts_per_step=r, decode_seqs=n_d, max_batched_tokens=8192,
    )  # fmt: skip
    k, j = (a.ravel() for a in np.meshgrid(np.arange(12.0), np.arange(121.0)))
    ctx = m.decode_context_tokens / m.decode_steps
    b = Batch(1000 * k, k, k * 1000 * 1001 / 2, 1000 * k, j, j * ctx)
    p = stats.poisson.pmf(k, r) * stats.poisson.pmf(j, n_d)
    want = float(np.dot(p, step_time(M8, H100, b).total_s))
    assert got == pytest.approx(want, rel=2e-3)
    # lumps cost more than the mean batch here (a lone prompt makes the step compute-bound)
    mean_batch = Batch(*(np.array(v) for v in (500.0, 0.5, 250_250.0, 500.0, n_d, n_d * ctx)))
    assert got > float(step_time(M8, H100, mean_batch).total_s)
