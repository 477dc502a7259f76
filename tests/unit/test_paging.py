"""Paging costs, the low-precision fallback bound and the paging-vs-reservation arithmetic."""

from __future__ import annotations

import numpy as np
import pytest

from hardware.comm import COLLECTIVE_OVERHEAD_S, COMM_EFFICIENCY
from hardware.device import load_device
from perfmodel.cache.footprint import expert_bytes
from perfmodel.cache.kv_paging import paging_vs_reservation
from perfmodel.cache.paging import (
    OffloadedExperts,
    adapter_paging,
    bandwidth_for_speedup,
    expert_fetch,
    expert_misses,
    fallback_speedup,
    fetch_time_s,
    link_transfer_s,
    nvme_link,
    step_with_misses_s,
)
from perfmodel.errors import InfeasibleError, SpecError
from perfmodel.model import load_model
from perfmodel.plan import ParallelPlan
from perfmodel.step.instance import Instance
from perfmodel.workload.lengths import fixed_lengths
from perfmodel.workload.presets import preset

MIXTRAL_EXPERT = 3 * 4096 * 14336 * 2


def test_mixtral_expert_over_pcie_gen5_by_hand() -> None:
    h100 = load_device("h100-sxm")  # PCIe Gen5 x16: 64e9 B/s per direction, 10 us
    t = link_transfer_s(MIXTRAL_EXPERT, h100.host_link)
    assert t == pytest.approx(
        COLLECTIVE_OVERHEAD_S + MIXTRAL_EXPERT / (COMM_EFFICIENCY * 64e9) + 1e-5
    )
    assert 7.8e-3 < t < 8.0e-3
    # Gen4 (A100) takes twice the wire time: the "11-14 ms at 25-32 GB/s" of §6.2
    t4 = fetch_time_s(MIXTRAL_EXPERT, load_device("a100-sxm-80gb"))
    assert 11e-3 < t4 < 16e-3


def test_nvme_is_the_slow_leg() -> None:
    d = load_device("h100-sxm")
    t = fetch_time_s(1e9, d, source="nvme")
    assert t == pytest.approx(link_transfer_s(1e9, nvme_link()))
    assert t > 5 * fetch_time_s(1e9, d)
    fast = nvme_link(bw_bytes_per_s=1e12, latency_s=0.0)
    assert fetch_time_s(1e9, d, source="nvme", nvme=fast) == fetch_time_s(1e9, d)


def test_uniform_static_cache_of_half_the_experts() -> None:
    # E = 8, top-2, one token: half the experts cached -> half the activations miss.
    pi = np.full(8, 0.25)
    s = expert_misses(pi, 1, 4, policy="static")
    assert s.misses == pytest.approx(1.0) and s.hit_ratio == pytest.approx(0.5)
    lru = expert_misses(pi, 1, 4, policy="lru")
    assert lru.hit_ratio == pytest.approx(0.5, abs=1e-9)  # symmetric catalog: LRU = static
    big = expert_misses(pi, 256, 6, policy="static")  # large batch: every expert every step
    assert big.distinct == pytest.approx(8.0) and big.misses == pytest.approx(2.0)


def test_prefetch_overlap() -> None:
    assert step_with_misses_s(1.0, 0.4, prefetched=1.0) == 1.0
    assert step_with_misses_s(1.0, 3.0, prefetched=1.0) == 3.0
    assert step_with_misses_s(1.0, 0.4) == pytest.approx(1.4)
    assert step_with_misses_s(1.0, 0.4, prefetched=0.5) == pytest.approx(1.2)


def test_fallback_bound_is_the_transfer_ratio() -> None:
    link = load_device("a100-40gb").host_link
    m = load_model("mixtral-8x7b")
    hi, lo = expert_bytes(m, "bf16"), expert_bytes(m, "int4")
    f = expert_fetch(hi, link, low_bytes=lo, low_fraction=1.0)
    assert f.saved_bytes_per_miss == pytest.approx(0.75 * hi)
    s = fallback_speedup(0.0, 64.0, f)
    assert s.speedup == pytest.approx(s.bound) and 3.9 < s.bound < 4.0
    assert fallback_speedup(0.05, 64.0, f).speedup < s.bound  # compute dilutes it
    with pytest.raises(InfeasibleError, match="out of reach"):
        bandwidth_for_speedup(
            9.93, compute_s=0.01, misses_per_step=64, high_bytes=hi, low_bytes=lo, low_fraction=1.0
        )
    bw = bandwidth_for_speedup(
        3.0, compute_s=0.01, misses_per_step=64, high_bytes=hi, low_bytes=lo, low_fraction=1.0
    )
    from hardware.device import Link

    at = expert_fetch(hi, Link("x", bw, 0.0), low_bytes=lo, low_fraction=1.0)
    assert fallback_speedup(0.01, 64, at).speedup == pytest.approx(3.0, rel=1e-6)


def test_offloaded_experts_table_matches_direct() -> None:
    pi = np.full(8, 0.25)
    f = expert_fetch(MIXTRAL_EXPERT, load_device("h100-sxm").host_link)
    off = OffloadedExperts(pi, 32, 4.0, "static", f)
    tab = off.miss_table(64)
    assert tab[0] == 0.0
    assert tab[1] == pytest.approx(off.misses_per_step(1)) == pytest.approx(32.0)
    assert tab[64] == pytest.approx(off.misses_per_step(64))
    assert off.penalty_s(1, 0.01) == pytest.approx(32 * f.mean_s)


def test_adapter_paging_hit_and_load() -> None:
    d = load_device("a100-40gb")
    pop = np.full(10, 0.1)
    ap = adapter_paging(pop, 5, 1e8, d, policy="static", source="nvme")
    assert ap.hit_ratio == pytest.approx(0.5)
    assert ap.mean_load_s == pytest.approx(0.5 * fetch_time_s(1e8, d, source="nvme"))


def test_paging_vs_reservation_by_hand() -> None:
    m, d = load_model("llama-3.1-8b"), load_device("a100-sxm-80gb")
    c = paging_vs_reservation(
        Instance(m, d, ParallelPlan()), fixed_lengths(100, 50), block_tokens=16
    )
    # step-averaged context (50·100 + 50·49/2)/50 = 124.5; paged adds (16-1)/2
    assert c.mean_context_tokens == pytest.approx(124.5)
    assert c.paged.footprint_tokens == pytest.approx(132.0)
    assert c.reserved_max.batch == c.kv_capacity_tokens // 150
    assert c.reserved_actual.footprint_tokens == pytest.approx(150.0)
    assert c.paged.batch == pytest.approx(c.kv_capacity_tokens / 132.0)
    # with every request at the maximum length, only the block rounding is saved
    assert c.batch_ratio == pytest.approx(150 / 132, rel=0.01)


def test_paging_gain_on_chat_is_larger_than_on_code() -> None:
    m, d = load_model("llama-3.1-70b"), load_device("h100-sxm")
    chat = paging_vs_reservation(Instance(m, d, ParallelPlan(tp=4)), preset("chat").lengths)
    code = paging_vs_reservation(Instance(m, d, ParallelPlan(tp=4)), preset("code").lengths)
    for c in (chat, code):
        assert c.paged.batch > c.reserved_actual.batch > c.reserved_max.batch
        assert 1.0 < c.throughput_ratio < c.batch_ratio  # step time grows with the batch
    assert chat.throughput_ratio > code.throughput_ratio


def test_bad_paging_input() -> None:
    with pytest.raises(SpecError):
        nvme_link(bw_bytes_per_s=0)
    with pytest.raises(SpecError):
        fetch_time_s(1e6, load_device("h100-sxm"), source="tape")
    with pytest.raises(SpecError):
        expert_fetch(1e6, load_device("h100-sxm").host_link, low_bytes=2e6, low_fraction=0.5)
    with pytest.raises(SpecError):
        paging_vs_reservation(
            Instance(load_model("llama-3.1-8b"), load_device("h100-sxm"), ParallelPlan()),
            fixed_lengths(100, 50),
            max_len_tokens=10,
        )
    with pytest.raises(InfeasibleError):
        paging_vs_reservation(
            Instance(load_model("llama-3.1-8b"), load_device("a100-40gb"), ParallelPlan()),
            fixed_lengths(100, 50),
            max_len_tokens=10_000_000,
        )
