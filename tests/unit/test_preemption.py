"""Recompute preemption in a full KV cache (perfmodel.serving.preemption), hand-derived."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hardware.device import load_device
from hardware.engine import load_engine
from perfmodel.errors import SpecError
from perfmodel.model import load_model
from perfmodel.plan import ParallelPlan
from perfmodel.serving.preemption import (
    completions_until_headroom,
    prefix_cache_evicted_fraction,
    recompute_tokens_per_request,
)
from perfmodel.serving.service import service_rate
from perfmodel.step.instance import Instance
from perfmodel.workload.lengths import LengthDistribution, fixed_lengths
from perfmodel.workload.presets import Workload


def test_fixed_output_race() -> None:
    # o = 100, decode growth between completions Exp(mean 99), slack 0:
    # R = 99·exp(−100/99) = 99 × 0.364199 = 36.06 tokens
    r = recompute_tokens_per_request(
        [100], [1.0], decode_growth_tokens=99, admission_slack_tokens=0
    )
    assert r == pytest.approx(36.056, abs=0.01)


def test_admission_slack_larger_than_output() -> None:
    # the slack a = 200 > o = 100 is the free space: 99·exp(−200/99) = 99 × 0.132640 = 13.13
    r = recompute_tokens_per_request(
        [100], [1.0], decode_growth_tokens=99, admission_slack_tokens=200
    )
    assert r == pytest.approx(13.131, abs=0.01)


def test_uniform_outputs_closed_form() -> None:
    # o ~ U(10, 1600), m = 804: R = m·(m/1590)·(e^{−10/m} − e^{−1600/m})
    #   = 804 × 0.50566 × (0.98764 − 0.13668) = 345.96 tokens (the 1:1 split of Nie et al.)
    o = np.linspace(10, 1600, 20_001)
    w = np.full(o.size, 1.0 / o.size)
    r = recompute_tokens_per_request(o, w, decode_growth_tokens=804, admission_slack_tokens=10)
    assert r == pytest.approx(345.96, rel=2e-3)


def test_no_decode_growth_no_recompute() -> None:
    assert (
        recompute_tokens_per_request([1], [1.0], decode_growth_tokens=0, admission_slack_tokens=5)
        == 0.0
    )


@pytest.mark.parametrize(
    ("o", "w", "m", "a"),
    [([], [], 1.0, 0.0), ([5], [-1.0], 1.0, 0.0), ([5], [1.0], -1.0, 0.0), ([5], [1.0], 1.0, -2.0)],
)
def test_bad_input(o: list[float], w: list[float], m: float, a: float) -> None:
    with pytest.raises(SpecError):
        recompute_tokens_per_request(o, w, decode_growth_tokens=m, admission_slack_tokens=a)


def _inst(engine: str | None) -> Instance:
    return Instance(
        load_model("llama-3.1-8b"), load_device("a100-40gb"), ParallelPlan(),
        engine=load_engine(engine) if engine else None,
    )  # fmt: skip


def test_service_rate_uses_the_formula_when_memory_binds() -> None:
    # fixed s = 1000, o = 500, chunk = budget = 2048 (whole prompts): slack a = c/2 = 500,
    # m = E[o − 1] = 499, S = max(500, 500): R = 499 × 0.36714 = 183.2 tokens
    sr = service_rate(
        _inst(None), Workload("f", fixed_lengths(1000, 500)),
        kv_capacity_tokens=60_000, max_batched_tokens=2048,
    )  # fmt: skip
    assert sr.binding == "memory"
    assert sr.recompute_tokens == pytest.approx(499 * math.exp(-500 / 499), rel=1e-9)
    assert sr.recompute_tokens == pytest.approx(183.2, abs=0.1)


def test_full_reservation_engine_never_preempts() -> None:
    # TensorRT-LLM reserves a request's whole KV at admission (guaranteed no evict)
    sr = service_rate(
        _inst("trtllm"), Workload("f", fixed_lengths(1000, 500)),
        kv_capacity_tokens=60_000, max_batched_tokens=2048,
    )  # fmt: skip
    assert sr.binding == "memory"
    assert sr.recompute_tokens == 0.0


def test_compute_bound_no_recompute() -> None:
    # a cache far larger than the budget fills: compute binds, the cache is never full
    lengths = LengthDistribution("x", np.array([100]), np.array([10]), np.array([1.0]))
    sr = service_rate(
        _inst(None), Workload("x", lengths), kv_capacity_tokens=150_000, max_batched_tokens=512
    )
    assert sr.binding == "compute"
    assert sr.recompute_tokens == 0.0


# --- prefix cache: the share of a preempted request's KV evicted before re-admission ---


def test_one_completion_suffices_exponential_growth() -> None:
    # every completion frees 500 ≥ h = 300: K = 1, G ~ Exp(m); x = m = 400:
    # E[min(x, G)] = m(1 − e^{−x/m}) = 400 × 0.632121 → φ = 0.632121
    phi = prefix_cache_evicted_fraction(
        [400], [1.0], [500], [1.0], decode_growth_tokens=400, headroom_tokens=300
    )
    assert phi == pytest.approx(1 - math.exp(-1), rel=1e-9)


def test_two_completions_gamma_growth() -> None:
    # completions free 100 < h = 150 ≤ 200: K = 2, G ~ Gamma(2, m); x = m:
    # E[min(m, G)]/m = ∫₀¹ e^{−t}(1 + t) dt = 2 − 3/e = 0.896362
    phi = prefix_cache_evicted_fraction(
        [250], [1.0], [100], [1.0], decode_growth_tokens=250, headroom_tokens=150
    )
    assert phi == pytest.approx(2 - 3 / math.e, rel=1e-6)


def test_completions_until_headroom_distribution() -> None:
    # L = 100 or 200 (½ each), h = 150: K = 1 iff L₁ = 200 (½), else L₁ + L₂ ≥ 200: K = 2
    assert completions_until_headroom([100, 200], [1, 1], 150) == pytest.approx([0.5, 0.5])
    # a completion that frees exactly h reaches it
    assert completions_until_headroom([150], [1], 150) == pytest.approx([1.0])
    # h = 250 with L ∈ {100, 200}: K = 2 unless L₁ = L₂ = 100 (¼, then K = 3)
    assert completions_until_headroom([100, 200], [1, 1], 250) == pytest.approx([0, 0.75, 0.25])


def test_victims_weighted_by_what_they_hold() -> None:
    # K = 1, victims x = m and 2m equally likely:
    # φ = [m(1 − e^{−1}) + m(1 − e^{−2})] / 3m = (0.632121 + 0.864665)/3 = 0.498929
    phi = prefix_cache_evicted_fraction(
        [100, 200], [1, 1], [1000], [1], decode_growth_tokens=100, headroom_tokens=10
    )
    assert phi == pytest.approx(0.498929, abs=1e-6)


def test_no_growth_nothing_evicted() -> None:
    assert (
        prefix_cache_evicted_fraction(
            [100], [1], [1000], [1], decode_growth_tokens=0, headroom_tokens=10
        )
        == 0.0
    )


@pytest.mark.parametrize(
    ("x", "L", "m"),
    [([], [5], 1.0), ([0], [5], 1.0), ([5], [0], 1.0), ([5], [], 1.0), ([5], [5], -1.0)],
)
def test_prefix_cache_bad_input(x: list[float], L: list[float], m: float) -> None:
    with pytest.raises(SpecError):
        prefix_cache_evicted_fraction(
            x, [1.0] * len(x), L, [1.0] * len(L), decode_growth_tokens=m, headroom_tokens=10
        )


def test_service_rate_prefix_cache_engine() -> None:
    # fixed s = 1000, o = 500, chunk = budget = 2048, M = 60,000, w = 0.01: R = 183.2 (above);
    # h = 600 + 1000 = 1600 > L = 1500: K = 2; x = 1000, m = 499, z = 1000/499 = 2.004008,
    # e^{−z} = 0.134794: E[min] = 998·[1 − e^{−z}(1 + z + z²/2)] + 1000·e^{−z}(1 + z)
    #   = 998 × 0.324408 + 1000 × 0.404922 = 728.68 → φ = 0.72868, φ·R = 133.5 tokens
    sr = service_rate(
        _inst("vllm@0.8"), Workload("f", fixed_lengths(1000, 500)),
        kv_capacity_tokens=60_000, max_batched_tokens=2048,
    )  # fmt: skip
    assert sr.binding == "memory"
    assert sr.recompute_evicted_fraction == pytest.approx(0.72868, abs=2e-4)
    assert sr.recompute_tokens == pytest.approx(0.72868 * 499 * math.exp(-500 / 499), rel=3e-4)


def test_engine_without_prefix_cache_recomputes_everything() -> None:
    # vLLM V0 (enable_prefix_caching off by default): φ = 1
    sr = service_rate(
        _inst("vllm"), Workload("f", fixed_lengths(1000, 500)),
        kv_capacity_tokens=60_000, max_batched_tokens=2048,
    )  # fmt: skip
    assert sr.recompute_evicted_fraction == 1.0
    assert sr.recompute_tokens == pytest.approx(499 * math.exp(-500 / 499), rel=1e-9)
