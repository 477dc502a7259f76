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
from perfmodel.serving.preemption import recompute_tokens_per_request
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
