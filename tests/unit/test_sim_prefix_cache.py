"""The simulator's prefix cache (perfmodel.sim.prefix_cache): vLLM V1's LRU free queue, by hand."""

from __future__ import annotations

import numpy as np

from hardware.device import load_device
from hardware.engine import load_engine
from perfmodel.model import load_model
from perfmodel.plan import ParallelPlan
from perfmodel.sim.prefix_cache import FreeQueueCache
from perfmodel.sim.simulate import make_setup, simulate
from perfmodel.step.instance import Instance


def test_tail_evicted_first_in_whole_blocks() -> None:
    # 1,000 tokens, full; the victim frees 100 = 6 full blocks of 16 + 4 (at the queue head).
    # 40 tokens allocated: the partial 4 and 36 more → 3 blocks evicted, 3 kept = 48 tokens
    q = FreeQueueCache(16)
    q.preempt(7, 100, kv_used_after=900, capacity=1000)
    assert q.cached(7, kv_used=940, context=100) == 48
    assert q.cached(7, kv_used=900, context=100) == 96  # nothing allocated: 6 blocks
    assert q.cached(7, kv_used=900, context=96) == 95  # a full hit recomputes the last token


def test_free_tokens_ahead_are_used_first() -> None:
    # 100 tokens were already free in front of the victim: 60 allocated evict none of it
    q = FreeQueueCache(16)
    q.preempt(1, 100, kv_used_after=800, capacity=1000)
    assert q.cached(1, kv_used=860, context=100) == 96
    assert q.cached(1, kv_used=940, context=100) == 48  # 140 allocated: 40 of the victim


def test_completions_queue_behind_the_victim() -> None:
    # a completion frees 500 after the victim: they join the tail, the victim is still eaten
    q = FreeQueueCache(16)
    q.preempt(7, 100, kv_used_after=900, capacity=1000)
    q.freed += 500  # kv_used 900 → 400
    assert q.cached(7, kv_used=440, context=100) == 48


def test_touch_of_an_earlier_victim_moves_the_later_one_up() -> None:
    # A (32 tokens) then B (32) preempted from a full cache: A is ahead of B. A comes back
    # with its 2 blocks (touched out of the queue); 16 allocated then evict one of B's.
    q = FreeQueueCache(16)
    q.preempt(0, 32, kv_used_after=968, capacity=1000)
    q.preempt(1, 32, kv_used_after=936, capacity=1000)
    kept = q.cached(0, kv_used=936, context=33)
    assert kept == 32
    q.take(0, kept)  # kv_used 936 → 968
    assert q.cached(1, kv_used=984, context=33) == 16


def test_simulator_recomputes_less_with_a_prefix_cache() -> None:
    inst = Instance(
        load_model("llama-3.1-8b"), load_device("a100-40gb"), ParallelPlan(),
        engine=load_engine("vllm@0.8"),
    )  # fmt: skip
    setup = make_setup(inst, kv_capacity_tokens=20_000, max_batched_tokens=512)
    assert setup.prefix_cache_block_tokens == 16
    rng = np.random.default_rng(3)
    s = rng.integers(10, 1600, 400)
    o = rng.integers(10, 1600, 400)
    full, cached = (
        simulate(
            setup.table,
            arrival_s=np.zeros(400),
            input_tokens=s,
            output_tokens=o,
            kv_capacity_tokens=20_000,
            max_batched_tokens=512,
            prefix_cache_block_tokens=b,
        )
        for b in (0, 16)
    )
    assert full.preemptions > 0 and full.recompute_tokens > 0
    assert 0 < cached.recompute_tokens < full.recompute_tokens
    assert np.all(np.isfinite(cached.finish_s))  # every request still completes
