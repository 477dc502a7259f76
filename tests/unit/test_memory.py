"""Memory fit: weights per device, KV capacity, largest batch, does-not-fit."""

import pytest

from hardware.device import load_device
from perfmodel.memory import (
    activation_reserve_bytes,
    describe_shortfall,
    kv_bytes_per_token_per_device,
    memory_fit,
)
from perfmodel.model import load_model
from perfmodel.plan import ParallelPlan
from perfmodel.units import GiB

H100 = load_device("h100-sxm")


def test_kv_capacity_hand_derived() -> None:
    m = load_model("llama-3.1-8b")
    plan = ParallelPlan(tp=1)
    f = memory_fit(m, H100, plan, batch=1, context_len=1)
    usable = 0.9 * 80 * GiB
    weights = m.params * 2
    reserve = 8192 * (4 * 4096 + 2 * 14336 + 128256) * 2  # 2.88 GB of activations
    assert f.weight_bytes == weights
    assert f.reserve_bytes == reserve
    assert f.kv_capacity_tokens == int((usable - weights - reserve) // 131072)
    assert f.max_batch(4096) == f.kv_capacity_tokens // 4096


def test_tp_shards_gqa_kv_but_not_mla_latent() -> None:
    llama = load_model("llama-3.1-70b")
    assert kv_bytes_per_token_per_device(llama, ParallelPlan(tp=8)) == 327_680 / 8
    ds = load_model("deepseek-v3")
    assert kv_bytes_per_token_per_device(ds, ParallelPlan(tp=8)) == 70_272


def test_405b_does_not_fit_one_h100_and_names_smallest_tp() -> None:
    m = load_model("llama-3.1-405b")
    f = memory_fit(m, H100, ParallelPlan(tp=1), batch=1, context_len=2048)
    assert not f.fits
    # 405.85e9 · 2 B = 811.7 GB of weights vs 72 GiB usable: short by > 680 GiB
    assert f.shortfall_bytes > 680 * GiB
    # tp=8: 101.5 GB/device > 72 GiB; tp=16: 50.7 GB fits
    assert f.min_tp == 16
    msg = describe_shortfall(f, m, H100, 1)
    assert "short by" in msg and "smallest TP that fits is 16" in msg


def test_fp8_weights_halve_weight_bytes() -> None:
    m = load_model("llama-3.1-70b")
    f8 = memory_fit(m, H100, ParallelPlan(tp=1, weight_dtype="fp8"))
    assert f8.weight_bytes == m.params
    assert f8.fits  # 70.6 GB of FP8 weights fit one 80 GiB H100
    assert not memory_fit(m, H100, ParallelPlan(tp=1)).fits


def test_reserve_grows_with_batched_tokens() -> None:
    m = load_model("llama-3.1-8b")
    p = ParallelPlan()
    assert activation_reserve_bytes(m, p, 16384) == pytest.approx(
        2 * activation_reserve_bytes(m, p, 8192)
    )


def test_activation_reserve_is_16_bit_under_fp8_math() -> None:
    """FP8 GEMM inputs do not make the residual stream, MLP intermediate or logits 8-bit:
    Llama-3.1-70B on one device, 8,192 tokens: 8192 · (4·8192 + 2·28672 + 128256) · 2 B
    = 3,577,741,312 B with FP8 math as with FP16."""
    from perfmodel.memory import activation_reserve_bytes

    m = load_model("llama-3.1-70b")
    fp8 = activation_reserve_bytes(m, ParallelPlan(1, "fp8", "fp8", "fp8"), 8192)
    assert fp8 == 8192 * (4 * 8192 + 2 * 28672 + 128256) * 2 == 3_577_741_312
    assert fp8 == activation_reserve_bytes(m, ParallelPlan(1), 8192)
