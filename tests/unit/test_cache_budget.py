"""The cache-budget plan: stable plans confirmed by the simulator, explained failures, errors.

The MILP itself is tested against brute force in ``test_cache_milp.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

from hardware.device import load_device
from perfmodel.errors import InfeasibleError, SpecError
from perfmodel.model import load_model
from perfmodel.plan import ParallelPlan
from perfmodel.serving.service import service_rate, stability
from perfmodel.step.instance import Instance
from perfmodel.units import GiB
from perfmodel.workload.presets import preset
from perfmodel.workload.slo import SLO
from solvers.cache.budget import (
    CacheBudgetSpec,
    plan_cache_budget,
    popularity_activation,
    simulate_plan,
)


def _specs() -> list[CacheBudgetSpec]:
    q = load_model("qwen3-30b-a3b")
    return [
        CacheBudgetSpec(
            load_model("llama-3.1-8b"),
            load_device("a100-40gb"),
            ParallelPlan(),
            preset("chat"),
            4.0,
            SLO(ttft_s=1.0, tpot_s=0.1),
            adapters=200,
            adapter_rank=64,
            kv_levels=4,
            adapter_levels=3,
        ),
        CacheBudgetSpec(
            load_model("llama-3.1-8b"),
            load_device("l40s"),
            ParallelPlan(),
            preset("code"),
            2.0,
            SLO(ttft_s=2.0, tpot_s=0.1),
            kv_levels=4,
        ),
        CacheBudgetSpec(
            q,
            load_device("a100-40gb"),
            ParallelPlan(),
            preset("chat"),
            0.2,
            SLO(ttft_s=30.0, tpot_s=4.0),
            offload_experts=True,
            expert_activation=popularity_activation(q, 1.0),
            low_precision_dtype="int4",
            low_fraction=0.5,
            prefetched=0.5,
            kv_levels=3,
            expert_levels=3,
            max_batched_tokens=2048,
        ),
    ]


@pytest.mark.slow
@pytest.mark.parametrize("case", [0, 1, 2])
def test_plan_is_stable_and_the_simulator_confirms_it(case: int) -> None:
    spec = _specs()[case]
    plan = plan_cache_budget(spec)
    assert plan.feasible, plan.explanation
    ev = plan.evaluation
    assert ev is not None and ev.stable and ev.utilization < 1.0
    assert sum(plan.split_bytes.values()) == pytest.approx(plan.pool_budget_bytes)
    assert ev.attainment >= spec.slo.goal
    if not spec.offload_experts:  # the queueing layer's own verdict at the plan's KV
        sr = service_rate(
            Instance(spec.model, spec.device, spec.plan),
            spec.workload,
            kv_capacity_tokens=plan.kv_capacity_tokens,
        )
        assert stability(sr, spec.rate_per_s).stable
    sim = simulate_plan(spec, plan, n_requests=1500, seed=1)
    assert sim.rejected == 0
    assert sim.throughput_per_s == pytest.approx(spec.rate_per_s, rel=0.08)
    assert abs(sim.queue_growth_per_s()) < 0.01 * spec.rate_per_s
    # measured (seed 1, 1,500 requests): TPOT mean 22.5/23.1, 35.3/35.1, 1356/1359 ms;
    # TTFT p90 0.23/0.29, 0.39/0.44, 3.7/4.3 s (analytic/simulated)
    assert ev.tpot_mean_s == pytest.approx(sim.tpot().mean_s, rel=0.08)
    assert ev.ttft_quantile_s == pytest.approx(sim.ttft().p90_s, rel=0.25)


def test_unstable_rate_gives_an_explained_infeasible_plan() -> None:
    s = _specs()[1]
    spec = CacheBudgetSpec(s.model, s.device, s.plan, s.workload, 500.0, s.slo, kv_levels=3)
    plan = plan_cache_budget(spec)
    assert not plan.feasible and "no split is stable" in plan.explanation


def test_budget_larger_than_device_is_rejected() -> None:
    s = _specs()[1]
    with pytest.raises(SpecError, match="capacity of one l40s"):
        CacheBudgetSpec(s.model, s.device, s.plan, s.workload, 1.0, s.slo, budget_bytes=100 * GiB)


def test_adapter_that_cannot_fit_alone() -> None:
    s = _specs()[1]
    spec = CacheBudgetSpec(
        s.model, s.device, s.plan, s.workload, 1.0, s.slo, adapters=10, adapter_rank=20000
    )
    with pytest.raises(InfeasibleError, match="cannot fit even alone"):
        plan_cache_budget(spec)


def test_zero_popularity_experts_rejected() -> None:
    q = load_model("qwen3-30b-a3b")
    spec = CacheBudgetSpec(
        q,
        load_device("a100-40gb"),
        ParallelPlan(),
        preset("chat"),
        0.2,
        SLO(30.0, 4.0),
        offload_experts=True,
        expert_activation=np.zeros(128),
        kv_levels=2,
        expert_levels=2,
    )
    with pytest.raises(SpecError, match="zero popularity"):
        plan_cache_budget(spec)
