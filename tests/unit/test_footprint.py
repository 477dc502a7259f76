"""Footprints: expert bytes per precision, expert sharding/replication, LoRA adapter bytes."""

from __future__ import annotations

import pytest

from perfmodel.cache.footprint import expert_bytes, lora_adapter_bytes, weight_footprint
from perfmodel.errors import SpecError
from perfmodel.memory import weight_bytes_per_device
from perfmodel.model import load_model
from perfmodel.plan import ParallelPlan


def test_mixtral_expert_bytes_per_precision() -> None:
    # formal_models.md §6.2: Mixtral-8x7B expert = 3·4096·14336 params = 352 MB in BF16.
    m = load_model("mixtral-8x7b")
    bf16 = 3 * 4096 * 14336 * 2
    assert expert_bytes(m, "bf16") == bf16 == 352_321_536
    assert expert_bytes(m, "fp8") == bf16 / 2
    assert expert_bytes(m, "int4") == bf16 / 4
    assert expert_bytes(m, "bf16", tp=2) == bf16 / 2


def test_llama7b_rank16_qkvo_adapter_is_33_6_mb() -> None:
    # formal_models.md §6.3: 4·2·16·4096·32·2 B = 33.6 MB (MHA: square projections).
    assert lora_adapter_bytes(load_model("llama-2-7b"), 16) == 4 * 2 * 16 * 4096 * 32 * 2


def test_gqa_adapter_smaller_than_square_rule_of_thumb() -> None:
    # Llama-3.1-70B: q,o 8192x8192; k,v 8192x1024 (8 KV heads of 128).
    m = load_model("llama-3.1-70b")
    per_layer = 16 * (2 * (8192 + 8192) + 2 * (8192 + 1024))
    assert lora_adapter_bytes(m, 16) == per_layer * 80 * 2 == 131_072_000
    square = 4 * 2 * 16 * 8192 * 80 * 2  # the blog table's 83.9 M params = 168 MB
    assert lora_adapter_bytes(m, 16) < square
    mlp = lora_adapter_bytes(m, 8, targets=("gate", "up", "down"))
    assert mlp == 8 * 3 * (8192 + 28672) * 80 * 2


def test_ep1_footprint_matches_foundation_weights() -> None:
    m = load_model("mixtral-8x7b")
    plan = ParallelPlan(tp=2)
    wf = weight_footprint(m, plan)
    assert wf.resident_bytes == pytest.approx(weight_bytes_per_device(m, plan), rel=1e-12)
    off = weight_footprint(m, plan, offload_experts=True)
    assert off.resident_bytes == pytest.approx(wf.dense_bytes)
    assert off.resident_bytes < 0.05 * wf.resident_bytes + 2e9  # experts are ~96 % of Mixtral


def test_ep_with_redundant_replicas() -> None:
    m = load_model("deepseek-v3")
    wf = weight_footprint(m, ParallelPlan(tp=1, weight_dtype="fp8"), ep=8, redundant_experts=32)
    assert wf.experts_per_layer == 36  # ceil((256 + 32) / 8)
    assert wf.expert_bytes == 3 * 7168 * 2048  # whole FP8 experts on each device
    assert wf.expert_pool_bytes == 58 * 36 * 3 * 7168 * 2048


@pytest.mark.parametrize(
    "call",
    [
        lambda: lora_adapter_bytes(load_model("llama-2-7b"), 0),
        lambda: lora_adapter_bytes(load_model("llama-2-7b"), 8, targets=("q", "x")),
        lambda: lora_adapter_bytes(load_model("deepseek-v3"), 8, targets=("k",)),
        lambda: weight_footprint(load_model("llama-2-7b"), ParallelPlan(), offload_experts=True),
        lambda: weight_footprint(load_model("mixtral-8x7b"), ParallelPlan(), redundant_experts=2),
        lambda: expert_bytes(load_model("llama-2-7b")),
    ],
)
def test_bad_footprint_input_raises_spec_error(call: object) -> None:
    with pytest.raises(SpecError):
        call()  # type: ignore[operator]
