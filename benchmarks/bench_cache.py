"""Speed of the cache-budget models and solver. Run: ``python benchmarks/bench_cache.py``."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from hardware.device import load_device
from perfmodel.hitrate import (
    che_lru,
    inclusion_probabilities,
    irm_requests,
    simulate_lru,
    zipf_popularity,
)
from perfmodel.model import load_model
from perfmodel.parallel import ParallelPlan
from perfmodel.routing import expert_popularity
from perfmodel.units import GiB
from perfmodel.workload import SLO, preset
from solvers.cache_budget import (
    CacheBudgetSpec,
    SplitProblem,
    brute_force_split,
    plan_cache_budget,
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
    levels = tuple(np.sort(rng.uniform(1, 20, 8)) * GiB for _ in range(3))
    prob = SplitProblem(
        ("kv", "experts", "adapters"),
        levels,
        rng.normal(size=(8, 8, 8)),
        rng.random((8, 8, 8)) < 0.7,
        30 * GiB,
    )
    timed("split MILP, 8x8x8 grid (HiGHS)", lambda: solve_split(prob))
    timed("split brute force, 8x8x8 grid", lambda: brute_force_split(prob))
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
    from solvers.cache_budget import popularity_activation

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


if __name__ == "__main__":
    main()
