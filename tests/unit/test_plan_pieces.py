"""Pieces of the planner with hand-derived numbers: buckets, pool shares, launch flags."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hardware.device import load_device
from perfmodel.workload.lengths import LengthDistribution
from perfmodel.workload.presets import Workload
from reports.plan_deploy import hf_repo, max_seqs, pool_commands
from solvers.fleet.candidates import Candidate, size_buckets, tp_degrees
from solvers.fleet.plan import merge_pools
from solvers.fleet.results import Pool


def _cand(**kw: object) -> Candidate:
    base: dict[str, object] = dict(
        device=load_device("h100-sxm"), tp=2, pp=1, dtype="bf16", role="colocated",
        goodput_per_instance_per_s=4.0, capacity_per_instance_per_s=5.0, limiter="memory",
        kv_capacity_tokens=100_000, max_batched_tokens=8192,
    )  # fmt: skip
    base.update(kw)
    return Candidate(**base)  # type: ignore[arg-type]


def test_size_buckets_partition_by_input_length() -> None:
    s = np.array([100, 200, 300, 400])
    lw = LengthDistribution("t", s, np.array([10, 20, 30, 40]), np.array([0.1, 0.4, 0.4, 0.1]))
    b = size_buckets(Workload("t", lw), 2)
    assert [x.weight for x in b] == pytest.approx([0.5, 0.5])
    assert (b[0].lo_tokens, b[0].hi_tokens, b[1].lo_tokens, b[1].hi_tokens) == (100, 200, 300, 400)
    # conditional law of the first bucket: 100 w.p. 0.2, 200 w.p. 0.8
    assert b[0].workload.lengths.weights == pytest.approx([0.2, 0.8])


def test_pool_utilization_and_goodput_load() -> None:
    p = Pool(_cand(), 3, 9.0, 3.99)
    assert p.devices == 6
    assert p.utilization == pytest.approx(9.0 / 15.0)
    assert p.goodput_load == pytest.approx(9.0 / 12.0)
    assert p.cost_per_hour_usd == pytest.approx(6 * 3.99)


def test_merge_pools_averages_by_instances() -> None:
    a = _cand(role="prefill", goodput_per_instance_per_s=4.0, decode_class="x TP1")
    b = _cand(role="prefill", goodput_per_instance_per_s=2.0, decode_class="x TP2")
    [(m, n)] = merge_pools([(a, 1), (b, 3)])
    assert n == 4 and m.goodput_per_instance_per_s == pytest.approx((4 + 3 * 2) / 4)


def test_launch_flags_carry_the_assumed_numbers() -> None:
    p = Pool(_cand(), 1, 3.0, 3.99)
    # KV 100,000 tokens / 1,356 tokens per request -> 74 requests resident
    assert max_seqs(p, 1356.0) == math.ceil(100_000 / 1356.0) == 74
    cmd = pool_commands(p, "meta-llama/Llama-3.1-70B", 1356.0)
    assert "--tensor-parallel-size 2" in cmd["vllm"] and "--max-num-seqs 74" in cmd["vllm"]
    assert "--max-num-batched-tokens 8192" in cmd["vllm"]
    assert "--tp 2" in cmd["sglang"] and "--chunked-prefill-size 8192" in cmd["sglang"]
    assert "--tp_size 2" in cmd["tensorrt-llm"] and "--max_num_tokens 8192" in cmd["tensorrt-llm"]
    pd = pool_commands(Pool(_cand(role="decode"), 1, 3.0, 3.99), "m/x", 1356.0)
    assert "--disaggregation-mode decode" in pd["sglang"] and "kv-transfer-config" in pd["vllm"]
    assert hf_repo(("huggingface.co/meta-llama/Llama-3.1-70B config.json",), "x") == (
        "meta-llama/Llama-3.1-70B"
    )


def test_tp_degrees_within_a_node() -> None:
    from perfmodel.model import load_model

    m = load_model("llama-3.1-70b")
    assert tp_degrees(m, load_device("h100-sxm")) == [1, 2, 4, 8]  # NVSwitch node of 8
    assert tp_degrees(m, load_device("l40s")) == [1, 2, 4, 8]  # PCIe host of 8
