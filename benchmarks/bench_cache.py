"""Speed of the cache-budget models and solver. Run: ``python benchmarks/bench_cache.py``."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from hardware.device import load_device
from perfmodel.cache.hitrate import che_lru, inclusion_probabilities, irm_requests, simulate_lru
from perfmodel.cache.serving import budget_context, evaluate_engine
from perfmodel.model import load_model
from perfmodel.moe.routing import expert_popularity
from perfmodel.plan import ParallelPlan
from perfmodel.units import GiB
from perfmodel.workload.popularity import zipf_popularity
from perfmodel.workload.presets import preset
from perfmodel.workload.slo import SLO
from solvers.cache.budget import (
    CacheBudgetSpec,
    SplitProblem,
    brute_force_split,
    plan_cache_budget,
    popularity_activation,
    solve_split,
)


def timed(label: str, fn: Callable[[], object], repeat: int = 3) -> None:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    print(f"  {label:58s} {best * 1e3:10.1f} ms")


def main() -> None:
    print("cache-budget benchmarks (best of 3)")
    p256 = expert_popularity(256, dist="zipf", exponent=1.0, seed=0)
    timed(
        "inclusion probabilities, E=256 top-8 (quadrature)",
        lambda: inclusion_probabilities(p256, 8),
    )
    z = zipf_popularity(100_000, 0.8)
    timed("Che LRU, 100,000 objects, C=10,000", lambda: che_lru(z, 10_000))
    req = irm_requests(zipf_popularity(1000, 0.8), 1_000_000, np.random.default_rng(0))
    timed("exact LRU simulation, 1,000,000 requests, C=100", lambda: simulate_lru(req, 100), 1)
    rng = np.random.default_rng(1)
    n_eng, n_ad = 64, 8  # 8 KV x 8 expert levels, 8 adapter levels
    att = rng.uniform(0.5, 1.0, n_eng)
    per_miss = rng.uniform(0.0, 1.0, n_eng) * att
    prob = SplitProblem(
        engine_bytes=rng.uniform(1, 30, n_eng) * GiB,
        engine_ok=rng.random(n_eng) < 0.8,
        value=4.0 * att,
        value_per_miss=4.0 * per_miss,
        attain=att,
        attain_per_miss=per_miss,
        adapter_bytes=np.sort(rng.uniform(0, 8, n_ad)) * GiB,
        adapter_miss=np.sort(rng.uniform(0, 1, n_ad))[::-1],
        goal=0.6,
        budget_bytes=30 * GiB,
    )
    timed("split MILP, 64 engines x 8 adapter levels (HiGHS)", lambda: solve_split(prob))
    timed("split brute force, 64 x 8", lambda: brute_force_split(prob))
    spec = CacheBudgetSpec(
        load_model("llama-3.1-8b"),
        load_device("a100-40gb"),
        ParallelPlan(),
        preset("chat"),
        4.0,
        SLO(1.0, 0.1),
        adapters=200,
        adapter_rank=64,
    )
    timed("plan: llama-3.1-8b, KV 6 x adapters 5 levels", lambda: plan_cache_budget(spec), 1)
    q = load_model("qwen3-30b-a3b")
    spec2 = CacheBudgetSpec(
        q,
        load_device("a100-40gb"),
        ParallelPlan(),
        preset("chat"),
        0.2,
        SLO(30.0, 4.0),
        offload_experts=True,
        expert_activation=popularity_activation(q, 1.0),
        max_batched_tokens=2048,
    )
    timed(
        "plan: qwen3-30b-a3b offloaded, KV 6 x experts 5 levels",
        lambda: plan_cache_budget(spec2),
        1,
    )
    ctx = budget_context(spec2)
    timed(
        "one offloaded engine (KV 20 GiB, 8 experts/layer)",
        lambda: evaluate_engine(ctx, 20 * GiB, 8.0),
        1,
    )
    simulator_checks()


def _checked_specs() -> list[CacheBudgetSpec]:
    """The three plans of ``tests/test_cache_budget.py::_specs`` (kept in step by hand)."""
    q = load_model("qwen3-30b-a3b")
    return [
        CacheBudgetSpec(
            load_model("llama-3.1-8b"), load_device("a100-40gb"), ParallelPlan(),
            preset("chat"), 4.0, SLO(ttft_s=1.0, tpot_s=0.1), adapters=200,
            adapter_rank=64, kv_levels=4, adapter_levels=3,
        ),
        CacheBudgetSpec(
            load_model("llama-3.1-8b"), load_device("l40s"), ParallelPlan(), preset("code"),
            2.0, SLO(ttft_s=2.0, tpot_s=0.1), kv_levels=4,
        ),
        CacheBudgetSpec(
            q, load_device("a100-40gb"), ParallelPlan(), preset("chat"), 0.2,
            SLO(ttft_s=30.0, tpot_s=4.0), offload_experts=True,
            expert_activation=popularity_activation(q, 1.0), low_precision_dtype="int4",
            low_fraction=0.5, prefetched=0.5, kv_levels=3, expert_levels=3,
            max_batched_tokens=2048,
        ),
    ]  # fmt: skip


def simulator_checks() -> None:
    """The three simulator-confirmed plans of tests/test_cache_budget.py, with figures."""
    from perfmodel.sim.simulate import Distribution
    from solvers.cache.budget import simulate_plan

    print("simulator checks (1,500 requests, seed 1): analytic / simulated")
    for i, spec in enumerate(_checked_specs()):
        t = time.perf_counter()
        plan = plan_cache_budget(spec)
        dt = time.perf_counter() - t
        ev = plan.evaluation
        assert ev is not None
        sim = simulate_plan(spec, plan, n_requests=1500, seed=1)
        tp: Distribution = sim.tpot()
        tt: Distribution = sim.ttft()
        print(
            f"  case {i} ({spec.model.id}, {spec.device.id}, {spec.workload.name}, "
            f"{spec.rate_per_s:g}/s; plan {dt:.1f} s): mu {ev.service_rate_per_s:.3f}/s "
            f"{ev.binding}, util {ev.utilization:.2f}; TPOT mean "
            f"{ev.tpot_mean_s * 1e3:.1f} / {tp.mean_s * 1e3:.1f} ms, "
            f"p90 {ev.tpot_quantile_s * 1e3:.1f} / {tp.p90_s * 1e3:.1f} ms; "
            f"TTFT p90 {ev.ttft_quantile_s:.3f} / {tt.p90_s:.3f} s; "
            f"throughput {sim.throughput_per_s:.3f}/s"
        )


if __name__ == "__main__":
    main()
