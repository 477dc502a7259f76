"""Golden tests of the closed-form queueing results (formal_models.md §0 T1–T3, textbooks)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from perfmodel.serving.classic_queues import (
    distserve_ttft_inter_op_s,
    distserve_ttft_intra_op_s,
    distserve_ttft_single_s,
    erlang_c,
    lifetime_kv_token_steps,
    nie_memory_rate_per_s,
    pollaczek_khinchine_wait_s,
    renewal_mean_age,
    work_conserving_capacity_tokens_per_s,
)
from perfmodel.workload.lengths import LengthDistribution


def _distserve_prefill_ms(a: float, b: float, c: float, tokens: int) -> float:
    # DistServe's profile form (simdistserve profiler-a100-80g.distserve.json, OPT-13B):
    # prefill ms = a + b·Σl + c·Σl²
    return a + b * tokens + c * tokens**2


def test_distserve_md1_ttft_t3() -> None:
    """T3: OPT-13B 512-token prompt, R = 10 req/s -> 165.6 / 82.3 / 76.3 ms (DistServe §3.1)."""
    d1 = _distserve_prefill_ms(18.1025, 0.101912, 7.12226e-6, 512) / 1e3
    d2 = _distserve_prefill_ms(14.7430, 0.0685772, 2.44957e-6, 512) / 1e3
    assert d1 == pytest.approx(0.07215, abs=5e-6)
    k = d1 / d2
    assert k == pytest.approx(1.4288, abs=1e-3)
    assert distserve_ttft_single_s(10, d1) * 1e3 == pytest.approx(165.6, abs=0.1)
    assert distserve_ttft_inter_op_s(10, d1) * 1e3 == pytest.approx(82.3, abs=0.1)
    assert distserve_ttft_intra_op_s(10, d1, k) * 1e3 == pytest.approx(76.3, abs=0.1)
    # the published closed forms, written out
    assert distserve_ttft_inter_op_s(10, d1) == pytest.approx(d1 + 10 * d1**2 / (4 * (2 - 10 * d1)))
    assert distserve_ttft_intra_op_s(10, d1, k) == pytest.approx(
        d1 / k + 10 * d1**2 / (2 * k * (k - 10 * d1))
    )
    # max stable rates 1/D, 2/D, K/D = 13.9 / 27.7 / 19.8 req/s
    for f, limit in (
        (lambda r: distserve_ttft_single_s(r, d1), 13.86),
        (lambda r: distserve_ttft_inter_op_s(r, d1), 27.72),
        (lambda r: distserve_ttft_intra_op_s(r, d1, k), 19.80),
    ):
        assert math.isfinite(f(limit * 0.995))
        assert math.isinf(f(limit * 1.005))


def test_pollaczek_khinchine_textbook() -> None:
    # M/M/1, λ = 0.5, μ = 1: E[S²] = 2 -> W_q = ρ/(μ − λ) = 1
    assert pollaczek_khinchine_wait_s(0.5, 1.0, 2.0) == pytest.approx(1.0)
    # M/D/1, λ = 0.5, D = 1: W_q = ρD/(2(1 − ρ)) = 0.5 (half the M/M/1 wait)
    assert pollaczek_khinchine_wait_s(0.5, 1.0, 1.0) == pytest.approx(0.5)
    # M/M/1 at ρ = 0.9 with mean service 10 ms: W_q = ρ/(1−ρ)·E[S] = 90 ms
    assert pollaczek_khinchine_wait_s(90.0, 0.01, 2e-4) == pytest.approx(0.09)
    assert math.isinf(pollaczek_khinchine_wait_s(1.0, 1.0, 1.0))


def test_erlang_c_textbook() -> None:
    # c = 2, a = 1: C = 1/3 (e.g. Kleinrock Vol. 1 §3.5)
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)
    # c = 1 reduces to ρ
    assert erlang_c(1, 0.7) == pytest.approx(0.7)
    assert erlang_c(5, 5.0) == 1.0


def test_li_dai_peng_capacity_t1() -> None:
    """T1: CodeLlama-34B, t_b = 11.28 + 35.47·⌈b/128⌉ ms, b_max = 128 -> 2737.97 tok/s."""
    t_b = (11.28 + 35.47 * math.ceil(128 / 128)) / 1e3
    cap = work_conserving_capacity_tokens_per_s(128, t_b)
    assert cap == pytest.approx(2737.97, abs=0.01)
    load = (290 + 990) / 0.4675  # one (290, 990) request every 467.5 ms
    assert load == pytest.approx(cap, rel=1e-9)  # exactly the stability boundary


def _uniform_lengths(
    s_lo: int, s_hi: int, o_lo: int, o_hi: int, n: int = 200
) -> LengthDistribution:
    s = np.linspace(s_lo, s_hi, n).round().astype(np.int64)
    o = np.linspace(o_lo, o_hi, n).round().astype(np.int64)
    ss, oo = np.meshgrid(s, o, indexing="ij")
    return LengthDistribution("u", ss.ravel(), oo.ravel(), np.full(n * n, 1 / n**2))


@pytest.mark.parametrize(
    ("s_hi", "o_hi", "mu_theory", "b_ms"),
    [(1600, 1600, 3.263, 37.3), (2133, 1066, 3.956, 43.1), (1066, 2133, 2.902, 33.7)],
)
def test_nie_si_zhou_implied_step_t2(s_hi: int, o_hi: int, mu_theory: float, b_ms: float) -> None:
    """T2: Llama-3-8B, M = 131,000, chunk 512: the published μ implies b̄ ≈ 37 / 43 / 34 ms."""
    lengths = _uniform_lengths(10, s_hi, 10, o_hi)
    eg = lengths.expect(lambda s, o: lifetime_kv_token_steps(s, o, 512))
    approx = lengths.expect(lambda s, o: o * (s + o / 2))  # Nie et al.'s o(s + o/2)
    assert eg == pytest.approx(approx, rel=0.005)
    b = 131_000 / (mu_theory * eg)
    assert b * 1e3 == pytest.approx(b_ms, abs=0.6)
    assert nie_memory_rate_per_s(131_000, b, eg) == pytest.approx(mu_theory)


def test_lifetime_kv_hand_derived() -> None:
    # s = 5, o = 3, chunk 2: prefill holds 2, 4, 5 (= 11); decodes hold 6, 7 (= 13)
    assert float(lifetime_kv_token_steps(5, 3, 2)) == 24.0
    # one-token output: only the prefill
    assert float(lifetime_kv_token_steps(7, 1, 100)) == 7.0


def test_renewal_mean_age_textbook_cases() -> None:
    """E[X²]/(2E[X]): X/2 if deterministic, E[X] if exponential (inspection paradox)."""
    assert renewal_mean_age([800.0], [1.0]) == pytest.approx(400.0)
    # two sizes 1 and 3, equally likely: E[X²] = 5, E[X] = 2 -> 1.25 (not E[X]/2 = 1)
    assert renewal_mean_age([1.0, 3.0], [0.5, 0.5]) == pytest.approx(1.25)
    # exponential with mean 500 tokens, discretized finely: mean age -> 500
    x = -500.0 * np.log1p(-(np.arange(200_000) + 0.5) / 200_000)
    assert renewal_mean_age(x, np.full(x.size, 1 / x.size)) == pytest.approx(500.0, rel=2e-3)
