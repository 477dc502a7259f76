"""DeepSeek EPLB reproduction (deepseek-ai/EPLB README example = formal_models.md T9)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from perfmodel.errors import SpecError
from solvers.placement.eplb import balanced_packing, rebalance_experts, replicate_experts

# deepseek-ai/EPLB README: 2 layers, 12 experts, 16 replicas, 4 groups, 2 nodes, 8 GPUs.
T9_WEIGHT = [
    [90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
    [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27],
]
T9_PHY2LOG = [
    [5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1],
    [7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1],
]


def test_eplb_readme_example() -> None:
    r = rebalance_experts(T9_WEIGHT, 16, 4, 2, 8)
    assert r.policy == "hierarchical"
    assert r.phy2log.tolist() == T9_PHY2LOG
    # log2phy is the inverse map and logcnt counts the replicas.
    for layer in range(2):
        for e in range(12):
            slots = [s for s in r.log2phy[layer, e] if s >= 0]
            assert len(slots) == r.logcnt[layer, e]
            assert all(r.phy2log[layer, s] == e for s in slots)
    assert r.logcnt.sum(axis=1).tolist() == [16, 16]


def test_replicate_experts_hand_example() -> None:
    # weights 10 and 3 with 4 slots: extra replicas go to 10 (10/1), then 10/2=5 > 3.
    p2l, rank, cnt = replicate_experts(np.array([[10.0, 3.0]], dtype=np.float32), 4)
    assert p2l.tolist() == [[0, 1, 0, 0]]
    assert rank.tolist() == [[0, 0, 1, 2]]
    assert cnt.tolist() == [[3, 1]]


def test_balanced_packing_hand_example() -> None:
    # Sorted 9,7,5,3 into 2 packs of 2: 9->p0, 7->p1, 5->p1 (7<9), 3->p0.
    idx, rank = balanced_packing(np.array([[5.0, 9.0, 3.0, 7.0]], dtype=np.float32), 2)
    assert idx.tolist() == [[1, 0, 0, 1]]
    assert rank.tolist() == [[1, 0, 1, 0]]


def test_global_policy_when_groups_do_not_split() -> None:
    # 3 groups over 2 nodes is not hierarchical: EPLB falls back to the global policy.
    w = np.arange(1, 13, dtype=float)[None, :]
    r = rebalance_experts(w, 16, 3, 2, 8)
    assert r.policy == "global"
    g = rebalance_experts(w, 16, 1, 1, 8, policy="global")
    assert np.array_equal(r.phy2log, g.phy2log)


@given(
    st.lists(st.integers(0, 1000), min_size=8, max_size=8),
    st.sampled_from([8, 12, 16]),
)
def test_every_expert_placed_and_slots_full(w: list[int], phys: int) -> None:
    r = rebalance_experts([w], phys, 4, 2, 4)
    assert sorted(set(r.phy2log[0].tolist())) == list(range(8))
    assert np.bincount(r.slot_gpu(), minlength=4).tolist() == [phys // 4] * 4


def test_eplb_bad_input() -> None:
    with pytest.raises(SpecError, match="do not split over"):
        rebalance_experts(T9_WEIGHT, 15, 4, 2, 8)
    with pytest.raises(SpecError, match=">= 0"):
        rebalance_experts([[1, -2, 3, 4]], 4, 1, 1, 2)
