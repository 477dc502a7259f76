"""The serving model of a split: the offload-slowed engine through the queueing layer."""

from __future__ import annotations

import numpy as np
import pytest

from hardware.device import load_device
from perfmodel.cache.offload import (
    _mean_chunk_tokens,
    mean_fetch_s,
    offload_latency,
    slowed_service_rate,
)
from perfmodel.cache.serving import (
    CacheBudgetSpec,
    budget_context,
    evaluate_engine,
    offloaded_experts,
    popularity_activation,
)
from perfmodel.model import load_model
from perfmodel.plan import ParallelPlan
from perfmodel.serving.classic_queues import (
    nie_memory_rate_per_s,
    work_conserving_capacity_tokens_per_s,
)
from perfmodel.serving.service import ServiceRate, latency, service_rate
from perfmodel.step.instance import Instance
from perfmodel.units import GiB
from perfmodel.workload.presets import preset
from perfmodel.workload.slo import SLO

B = 2048


@pytest.fixture(scope="module")
def qwen() -> CacheBudgetSpec:
    q = load_model("qwen3-30b-a3b")
    return CacheBudgetSpec(
        q,
        load_device("a100-40gb"),
        ParallelPlan(),
        preset("chat"),
        0.2,
        SLO(ttft_s=30.0, tpot_s=4.0),
        offload_experts=True,
        expert_activation=popularity_activation(q, 1.0),
        max_batched_tokens=B,
    )


@pytest.fixture(scope="module")
def qwen_sr(qwen: CacheBudgetSpec) -> ServiceRate:
    return service_rate(
        Instance(qwen.model, qwen.device, qwen.plan), qwen.workload, kv_capacity_tokens=200_000,
        max_batched_tokens=B,
    )  # fmt: skip


def test_without_offload_it_is_the_queueing_layer(qwen_sr: ServiceRate) -> None:
    assert slowed_service_rate(qwen_sr, None) is qwen_sr
    lam = 2.0
    ref, got = latency(qwen_sr, lam), offload_latency(qwen_sr, None, lam)
    assert got.equivalent_rate_per_s == lam and got.fetch_s == 0.0
    for q in (0.5, 0.9, 0.99):
        assert got.ttft_quantile_s(q) == pytest.approx(ref.ttft_quantile_s(q), rel=1e-12)
        assert got.tpot_quantile_s(q) == pytest.approx(ref.tpot_quantile_s(q), rel=1e-12)


def test_a_cache_of_every_expert_costs_nothing(qwen: CacheBudgetSpec, qwen_sr: ServiceRate) -> None:
    off = offloaded_experts(budget_context(qwen), 128.0)
    assert off is not None
    slow = slowed_service_rate(qwen_sr, off)
    assert slow.rate_per_s == pytest.approx(qwen_sr.rate_per_s, rel=1e-12)
    lat = offload_latency(qwen_sr, off, 0.2)
    assert lat.fetch_s == 0.0
    assert lat.tpot_mean_s == pytest.approx(latency(qwen_sr, 0.2).tpot_mean_s, rel=1e-12)


def test_slowed_bounds_are_the_classic_formulas_with_effective_kv(
    qwen: CacheBudgetSpec,
    qwen_sr: ServiceRate,
) -> None:
    """μ_c = B/((t_full + p(B))·E[tok]); μ_m = M_eff/((b̄ + p̄)·E[g]) with the queueing M_eff."""
    sr, off = qwen_sr, offloaded_experts(budget_context(qwen), 8.0)
    assert off is not None
    mo = sr.moments
    slow = slowed_service_rate(sr, off)
    t_full = sr.full_step_s + off.penalty_s(B, sr.full_step_s)
    assert slow.compute_rate_per_s == pytest.approx(
        work_conserving_capacity_tokens_per_s(B, t_full) / mo.tokens, rel=1e-12
    )
    r = sr.effective_kv_tokens / mo.lifetime_kv_token_steps
    n_d = r * mo.decode_steps
    p = mean_fetch_s(
        off,
        decode_seqs=n_d,
        chunk_rate=r * mo.prefill_chunks,
        chunk_tokens=_mean_chunk_tokens(sr, n_d),
        max_batched_tokens=B,
        step_s=sr.memory_step_s,
    )
    b = sr.memory_step_s + p
    mu_m = nie_memory_rate_per_s(sr.effective_kv_tokens, b, mo.lifetime_kv_token_steps)
    assert slow.memory_rate_per_s == pytest.approx(mu_m, rel=1e-12)
    # the raw M (the old second copy) would be > 1 % higher: watermark 1 % + admission slack
    raw = nie_memory_rate_per_s(sr.kv_capacity_tokens, b, mo.lifetime_kv_token_steps)
    assert raw > 1.01 * slow.memory_rate_per_s
    # the fetches of a batch are concave in its tokens: the Poisson mix is below the
    # fetches of the mean batch and above those of the decodes alone
    mean_t = n_d + r * mo.input_tokens
    assert off.penalty_s(n_d, sr.memory_step_s) < p < off.penalty_s(mean_t, sr.memory_step_s)


@pytest.mark.slow
def test_more_expert_cache_never_slows_the_engine(qwen: CacheBudgetSpec) -> None:
    ctx = budget_context(qwen)
    evs = [evaluate_engine(ctx, 20 * GiB, c) for c in (8.0, 40.0, 128.0)]
    assert all(e.stable and e.latency is not None for e in evs)
    mus = [e.service.rate_per_s for e in evs if e.service is not None]
    tpots = [e.latency.tpot_mean_s for e in evs if e.latency is not None]
    assert mus == sorted(mus) and tpots == sorted(tpots, reverse=True)
    lat = evs[0].latency
    assert lat is not None
    # the operating point is the fixed point f = 1 + p̄/b of the equivalent rate f·λ
    f = lat.equivalent_rate_per_s / lat.rate_per_s
    assert f == pytest.approx(1.0 + lat.fetch_s / lat.base.step_s, rel=2e-3)
    assert lat.step_s == pytest.approx(f * lat.base.step_s, rel=2e-3)
    # a request waits at least its own prefill's fetches (one chunk for most prompts)
    assert lat.ttft_quantile_s(0.5) > lat.prefill_fetch_s > lat.fetch_s > 0


def test_more_kv_never_lowers_mu_by_more_than_one_percent() -> None:
    """Once b̄ was costed at a fixed decode count n_d, μ fell 1.75 % as n_d crossed a
    128-row GEMM tile (M 340k -> 345k here); the decode count is now Poisson(n_d)."""
    m, d, w = load_model("llama-3.1-8b"), load_device("a100-40gb"), preset("chat")
    mus = [
        service_rate(Instance(m, d, ParallelPlan()), w, kv_capacity_tokens=kv).rate_per_s
        for kv in (330_000, 340_000, 345_000, 360_000)
    ]
    best = np.maximum.accumulate(mus)
    assert np.all(np.asarray(mus[1:]) >= 0.99 * best[:-1])
