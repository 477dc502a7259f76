"""Phase diagram: the claim's two cases (Qwen3-235B EP in a node, DeepSeek-V3 EP across
nodes), pinned. Numbers are from the roofline-derived expert profile (n* = 295 tokens
on H100, 206 on H200) and hardware/comm.py; they move if those change."""

from __future__ import annotations

import pytest

from hardware.device import load_device
from perfmodel.model import load_model
from reports.dispatch_phase import phase_diagram, phase_figure_html


@pytest.fixture(scope="module")
def qwen():
    return phase_diagram(
        load_model("qwen3-235b-a22b"),
        load_device("h100-sxm"),
        num_gpus=8,
        tokens_per_gpu=(16, 32, 1024),
        skews=(0.5, 1.0),
        samples=1,
    )


@pytest.fixture(scope="module")
def deepseek():
    return phase_diagram(
        load_model("deepseek-v3"),
        load_device("h100-sxm"),
        num_gpus=32,
        tokens_per_gpu=(64, 512),
        skews=(1.0,),
        samples=1,
        dispatch_dtype="fp8",
    )


def test_qwen_in_node(qwen) -> None:
    assert qwen.link == "scale-up" and qwen.slots_per_gpu == 18
    assert qwen.n_star_tokens == pytest.approx(295.3, rel=0.01)
    # Never worse than the best proxy (it starts from every proxy).
    assert qwen.min_layer_gain >= 0.0
    # Weight-bound, 16 tokens/GPU: METRO's greedy leaves 17 activated experts on the
    # busiest GPU, the heuristic's b-matching start reaches 16 (the MILP optimum,
    # 230.4 us): 5.8% of the block.
    lo = qwen.cell(16, 0.5)
    assert lo.best_proxy == "activated"
    assert lo.heuristic_block_s == pytest.approx(230.4e-6, rel=1e-3)
    assert lo.block_gain == pytest.approx(0.058, abs=0.005)
    # Weight-bound, skewed: the heuristic cuts the max activated count 18 -> 16 where
    # every proxy leaves 18: 10.9% of the block, 9.6% of the MoE layer.
    c = qwen.cell(32, 0.5)
    assert c.regime == "weights"
    assert c.block_gain == pytest.approx(0.109, abs=0.01)
    assert c.layer_gain == pytest.approx(0.096, abs=0.01)
    assert c.comm_share == pytest.approx(0.134, abs=0.01)
    # Both regimes at 1024 tokens/GPU: token balancing wins, METRO is 1.74x slower,
    # and the makespan-aware gain over the best proxy is small (1.3% block, 0.7% layer).
    h = qwen.cell(1024, 1.0)
    assert h.regime == "mixed" and h.best_proxy == "token"
    assert h.proxy_spread == pytest.approx(1.735, abs=0.05)
    assert h.block_gain == pytest.approx(0.013, abs=0.01)
    assert h.comm_share == pytest.approx(0.468, abs=0.02)
    # Which proxy wins flips with the regime.
    assert qwen.cell(16, 0.5).best_proxy == "activated"


def test_deepseek_across_nodes_is_comm_dominated(deepseek) -> None:
    assert deepseek.link == "scale-out" and deepseek.slots_per_gpu == 10
    # Communication-dominated in the paper's sense: the dispatch + combine all-to-all over
    # the 50 GB/s NIC is the largest single part of the MoE layer and at least half of it.
    # 64 tokens/GPU: comm 339.6 us (each all-to-all 17.6 + 0.764 · 5 us of latency, the
    # rest bandwidth), routed-expert block 300.8 us, shared expert 37.9 us: share 0.501,
    # on the regime's 0.5 boundary. 512 tokens/GPU: 2417 / 546 / 62 us, share 0.799.
    for c in deepseek.cells:
        assert c.regime == "comm-dominated" and c.comm_share > 0.5
        assert c.comm_s > c.heuristic_block_s > c.shared_s
        # the dispatcher's block gain shrinks in the layer: 4.6 % (block 9.9 %) at 64
        # tokens/GPU, 0.5 % (block 2.5 %) at 512
        assert 0.0 <= c.layer_gain < 0.05
    lo, hi = deepseek.cell(64, 1.0), deepseek.cell(512, 1.0)
    assert lo.comm_share == pytest.approx(0.501, abs=0.005)
    assert lo.comm_s == pytest.approx(339.6e-6, rel=1e-3)
    assert lo.layer_gain == pytest.approx(0.046, abs=0.005)
    assert hi.comm_share == pytest.approx(0.799, abs=0.02)
    # the JSON cell's margin: the signed distance to that boundary (0.501 − 0.5, 0.799 − 0.5)
    assert lo.to_dict()["margin"] == pytest.approx(0.001, abs=0.005)
    assert hi.to_dict()["margin"] == pytest.approx(0.299, abs=0.02) and hi.margin > 0
    # At 512 tokens/GPU the heuristic's tile-balance start reaches the MILP optimum
    # (546.3 us vs 560.5 us for the exact token balance): a 2.5% block gain shrinks to
    # 0.4% of the layer.
    assert hi.heuristic_block_s == pytest.approx(546.3e-6, rel=1e-3)
    assert hi.block_gain == pytest.approx(0.025, abs=0.005)
    assert hi.layer_gain == pytest.approx(0.004, abs=0.003)
    assert hi.proxy_spread > 2.0  # METRO's activation balance is far off when token-bound


def test_figure_is_self_contained(qwen, deepseek) -> None:
    html = phase_figure_html([qwen, deepseek])
    assert html.lstrip().lower().startswith("<!doctype html>")
    assert '<script src="https://cdn' not in html and len(html) > 1_000_000  # inlined
    assert "deepseek-v3 on 32x h100-sxm" in html
