"""Serving policies added for the claim checks, on hand-worked cases.

Static batching, prefill-prioritizing stalls, speculative decoding and the per-sequence
KV of windowed / recurrent layers.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from hardware.device import load_device
from perfmodel.cache.context_memory import concurrent_sequences, sequence_kv_bytes
from perfmodel.errors import SpecError
from perfmodel.memory import memory_fit
from perfmodel.model import load_model
from perfmodel.plan import ParallelPlan
from perfmodel.serving.classic_queues import pollaczek_khinchine_wait_s
from perfmodel.serving.prefill_priority import (
    PrefillTimes,
    stall_goodput,
    stall_operating_point,
    tbt_budget,
)
from perfmodel.serving.speculative import expected_tokens_per_pass, speculative_speedup
from perfmodel.serving.static_batching import expected_max, static_batching
from perfmodel.step.batch import Batch
from perfmodel.step.instance import Instance
from perfmodel.step.time import step_time
from perfmodel.workload.lengths import fixed_lengths
from perfmodel.workload.presets import preset

M8 = load_model("llama-3.1-8b")
A100 = load_device("a100-sxm-80gb")
PLAN = ParallelPlan()
INST = Instance(M8, A100, PLAN)


def test_expected_max_two_point() -> None:
    # values {1, 3} with p = 1/2: max of 2 draws is 1 only if both are 1 (1/4)
    assert expected_max(np.array([1, 3]), np.array([0.5, 0.5]), 2) == pytest.approx(2.5)
    assert expected_max(np.array([1, 3]), np.array([0.5, 0.5]), 1) == pytest.approx(2.0)
    # three draws: P(max = 1) = 1/8
    assert expected_max(np.array([3, 1]), np.array([0.5, 0.5]), 3) == pytest.approx(2.75)


def test_static_batching_fixed_lengths_by_hand() -> None:
    s, o = 200, 50
    M = 10_000
    r = static_batching(INST, fixed_lengths(s, o), kv_capacity_tokens=M, reserved_tokens=1000)
    assert r.batch == 10  # ⌊10,000 / 1,000⌋
    t_p = float(step_time(M8, A100, Batch.prefill(10, s), plan=PLAN).total_s)
    t_d = sum(
        float(step_time(M8, A100, Batch.decode(10, s + j), plan=PLAN).total_s) for j in range(o)
    )
    assert r.prefill_s == pytest.approx(t_p)
    assert r.decode_s == pytest.approx(t_d, rel=1e-9)
    assert r.rate_per_s == pytest.approx(10 / (t_p + t_d))
    assert r.output_tokens_per_s == pytest.approx(10 * o / (t_p + t_d))


def test_static_batching_caps_and_refuses() -> None:
    L = fixed_lengths(100, 100)
    assert static_batching(INST, L, kv_capacity_tokens=10_000, max_batch=3).batch == 3
    with pytest.raises(Exception, match="holds no request"):
        static_batching(INST, L, kv_capacity_tokens=150)


def _times(td: float, tp: float) -> PrefillTimes:
    """One prompt length with prefill time tp; decode step constant td at every batch."""
    n = np.geomspace(1, 4096, 64)
    return PrefillTimes(
        np.array([100.0]), np.array([1.0]), np.array([tp]), 150.0, 20.0, n, np.full(64, td)
    )


def test_stall_fixed_point_and_latencies_by_hand() -> None:
    td, tp, lam = 0.02, 0.1, 2.0
    op = stall_operating_point(_times(td, tp), lam, kv_capacity_tokens=10**7, percentile=0.99)
    rho = lam * tp  # 0.2
    assert op.prefill_utilization == pytest.approx(rho)
    # n = λ·E[o]·t_d/(1 − ρ) = 2·20·0.02/0.8 = 1.0
    assert op.decode_seqs == pytest.approx(1.0)
    assert op.tpot_mean_s == pytest.approx(td / (1 - rho))
    # M/D/1 prefill queue: W = λ·tp²/(2(1−ρ)) = 2·0.01/1.6
    assert op.ttft_mean_s == pytest.approx(pollaczek_khinchine_wait_s(lam, tp, tp**2) + tp)
    assert op.ttft_mean_s == pytest.approx(0.0125 + 0.1)
    # a stall in a gap has probability 1 − e^{−λ·td} = 3.9% > 1%: p99 TBT = td + tp/(1 − ρ)
    assert op.tbt_quantile_s == pytest.approx(td + tp / (1 - rho))
    # at the median no stall: TBT = td
    med = stall_operating_point(_times(td, tp), lam, kv_capacity_tokens=10**7, percentile=0.5)
    assert med.tbt_quantile_s == pytest.approx(td)


def test_stall_unstable_when_prefill_saturates_or_kv_overflows() -> None:
    assert not stall_operating_point(_times(0.02, 0.1), 10.0, kv_capacity_tokens=10**7).stable
    # n = 1.0 needs 150 tokens of KV (c̄ = 150): 100 tokens are not enough
    assert not stall_operating_point(_times(0.02, 0.1), 2.0, kv_capacity_tokens=100).stable


def test_stall_goodput_tighter_slo_never_higher() -> None:
    L = preset("chat").lengths
    M = memory_fit(M8, A100, PLAN).kv_capacity_tokens
    loose = stall_goodput(INST, L, kv_capacity_tokens=M, tbt_slo_s=math.inf, ttft_slo_s=math.inf)
    tight = stall_goodput(INST, L, kv_capacity_tokens=M, tbt_slo_s=0.1, ttft_slo_s=math.inf)
    assert 0 < tight <= loose


def test_tbt_budget_takes_the_largest_budget_within_the_target() -> None:
    w = preset("chat")
    rates: dict = {}
    sr = tbt_budget(INST, w, tbt_slo_s=0.1, rates=rates)
    assert sr is not None and sr.full_step_s <= 0.1
    bigger = [b for b in rates if b > sr.max_batched_tokens]
    assert all(rates[b].full_step_s > 0.1 for b in bigger)
    assert tbt_budget(INST, w, tbt_slo_s=1e-4, rates=rates) is None


def test_expected_tokens_per_pass_by_hand() -> None:
    assert expected_tokens_per_pass(0.5, 2) == pytest.approx((1 - 0.125) / 0.5)  # 1.75
    assert expected_tokens_per_pass(1.0, 4) == 5
    assert expected_tokens_per_pass(0.0, 4) == 1
    with pytest.raises(SpecError):
        expected_tokens_per_pass(1.5, 2)


def test_speculative_speedup_by_hand() -> None:
    r = speculative_speedup(
        INST,
        gamma=3,
        alpha=0.8,
        draft_cost_ratio=0.1,
        context_len=1000,
        extra_step_s=0.05,
    )
    t_dev = float(step_time(M8, A100, Batch.decode(1, 1000), plan=PLAN).total_s)
    tv = float(step_time(M8, A100, Batch.prefill(1, 4, 1000), plan=PLAN).total_s) + 0.05
    e = (1 - 0.8**4) / 0.2
    assert r.target_step_s == pytest.approx(t_dev + 0.05)
    assert r.draft_step_s == pytest.approx(0.1 * t_dev)  # the draft does not stream weights
    assert r.speedup == pytest.approx(e * (t_dev + 0.05) / (3 * 0.1 * t_dev + tv))
    assert r.bound == pytest.approx(4 * (t_dev + 0.05) / tv)
    with pytest.raises(SpecError, match="either a draft model"):
        speculative_speedup(INST, gamma=3, alpha=0.8)


def test_sequence_bytes_full_window_state_by_hand() -> None:
    assert sequence_kv_bytes(1000, 5000) == 5_000_000
    # half the layers windowed at 1,000 tokens, a 2 MB recurrent state
    b = sequence_kv_bytes(
        1000, 5000, full_fraction=0.5, window_fraction=0.5, window_tokens=1000, state_bytes=2e6
    )
    assert b == pytest.approx(0.5 * 1000 * 5000 + 0.5 * 1000 * 1000 + 2e6)
    assert concurrent_sequences(10e6, b) == 2
    assert concurrent_sequences(-1.0, b) == 0
    with pytest.raises(SpecError):
        sequence_kv_bytes(1000, 10, full_fraction=0.8, window_fraction=0.5)
