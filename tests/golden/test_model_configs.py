"""Config import of current model families: per-layer stacks, hybrid linear attention,
windows, per-layer MoE, MTP, DSA, nested text_config, quantization_config.

Each parameter count is checked twice: against the formula written out here by hand
(so a parser change shows up exactly) and against the model card (2 %, cited).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from perfmodel.errors import SpecError
from perfmodel.model import load_model, model_from_config
from perfmodel.step.batch import Batch
from tests.conftest import shared_file
from tests.golden import decilm_published

DATA = Path(__file__).parents[1] / "data" / "hf"


def _shared(name: str) -> dict[str, Any]:
    return json.loads(shared_file("hf-configs", name).read_text())


# ---- hybrid Gated DeltaNet + MoE, nested text_config --------------------------------------


def test_qwen3_next_hybrid_params_kv_and_state() -> None:
    m = load_model(str(DATA / "qwen3-next-80b-a3b.json"))
    plan = m.layer_plan
    assert [ls.mixer for ls in plan[:4]] == ["linear", "linear", "linear", "full"]
    assert sum(ls.mixer == "full" for ls in plan) == 12
    h, v = 2048, 151936
    emb = 2 * v * h
    full = h * 16 * 256 * 2 + 2 * h * 2 * 256 + 16 * 256 * h  # gated q, k, v, o
    lin = h * (2 * 2048 + 2 * 4096) + h * 64 + 8192 * 4 + 2 * 32 + 128 + 4096 * h
    moe_all = 512 * 3 * h * 512 + h * 512 + 3 * h * 512  # experts, router, shared
    moe_act = 10 * 3 * h * 512 + h * 512 + 3 * h * 512
    norms = 48 * 2 * h + h
    assert m.params == emb + 12 * full + 36 * lin + 48 * moe_all + norms
    assert m.active_params == emb + 12 * full + 36 * lin + 48 * moe_act + norms
    # Model card (huggingface.co/Qwen/Qwen3-Next-80B-A3B-Instruct): "80B in total and
    # 3B activated", "Number of Parameters (Non-Embedding): 79B".
    assert m.params == pytest.approx(80e9, rel=0.02)
    assert m.params - m.embedding_params() == pytest.approx(79e9, rel=0.02)
    # "3B activated" has one significant figure: [2.5, 3.5) B (non-embedding 3.25 B)
    assert 2.5e9 <= m.active_params - m.embedding_params() < 3.5e9
    # KV only on the 12 full-attention layers: 12 · 2 · 2 KV heads · 256 · 2 B
    assert m.kv_bytes_per_token("bf16") == 12 * 2 * 2 * 256 * 2 == 24_576
    # state per sequence: 36 layers · (32·128·128 SSM + 3·(2·16·128 + 32·128) conv) · 2 B
    assert m.state_bytes_per_sequence("bf16") == 36 * (32 * 128 * 128 + 3 * 8192) * 2
    assert m.kv_bytes_per_sequence(1000) == 1000 * 24_576 + 39_518_208


# Qwen/Qwen3.5-397B-A17B text_config. The config.json itself was not found verbatim; these
# values agree across four public copies of its geometry (the architecture table of the
# mlx-community/Qwen3.5-397B-A17B-4bit card, adapted from the original card; the flash-moe
# engine's manifest defaults; a Qwen3.5 port's model contract; a model-spec table citing
# the file): 60 layers = 15 x (3 Gated DeltaNet + 1 full attention), hidden 4096, 32 query /
# 2 KV heads of 256, GDN 16 key / 64 value heads of 128, 512 experts (10 routed + 1 shared)
# of 1024, vocabulary 248,320, untied head. The release dialect (attn_output_gate,
# mamba_ssm_dtype float32, one MTP layer) as the Qwen3.5-122B/3.6 release configs write it.
QWEN35_397B = {
    "architectures": ["Qwen3_5MoeForConditionalGeneration"],
    "model_type": "qwen3_5_moe",
    "text_config": {
        "model_type": "qwen3_5_moe_text",
        "attention_bias": False,
        "attn_output_gate": True,
        "full_attention_interval": 4,
        "head_dim": 256,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 15,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 64,
        "linear_value_head_dim": 128,
        "mamba_ssm_dtype": "float32",
        "moe_intermediate_size": 1024,
        "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False,
        "num_attention_heads": 32,
        "num_experts": 512,
        "num_experts_per_tok": 10,
        "num_hidden_layers": 60,
        "num_key_value_heads": 2,
        "shared_expert_intermediate_size": 1024,
        "tie_word_embeddings": False,
        "vocab_size": 248320,
    },
    "vision_config": {"depth": 27, "hidden_size": 1152, "out_hidden_size": 4096},
}


def test_qwen35_397b_hybrid_params_kv_and_state() -> None:
    m = model_from_config(QWEN35_397B, id="qwen3.5-397b-a17b")
    plan = m.layer_plan
    assert sum(ls.mixer == "full" for ls in plan) == 15 and plan[3].mixer == "full"
    assert m.n_moe_layers == 60 and not m.warnings
    h, v = 4096, 248320
    emb = 2 * v * h
    full = h * 32 * 256 * 2 + 2 * h * 2 * 256 + 32 * 256 * h  # gated q, k, v, o
    k, val = 16 * 128, 64 * 128
    conv = 2 * k + val  # 12,288 channels
    lin = h * (2 * k + 2 * val) + h * 2 * 64 + conv * 4 + 2 * 64 + 128 + val * h
    moe_all = 512 * 3 * h * 1024 + h * 512 + 3 * h * 1024  # experts, router, shared
    moe_act = 10 * 3 * h * 1024 + h * 512 + 3 * h * 1024
    norms = 60 * 2 * h + h
    assert m.params == emb + 15 * full + 45 * lin + 60 * moe_all + norms
    assert m.active_params == emb + 15 * full + 45 * lin + 60 * moe_act + norms
    # Model card (huggingface.co/Qwen/Qwen3.5-397B-A17B, as the MLX and SGLang pages quote
    # it): 397B total, 17B activated. The card's total also holds the vision encoder
    # (27 blocks of width 1152, under 0.5 B by a rough count), not modelled here.
    assert m.params == pytest.approx(397e9, rel=0.02)  # 396.35 B
    assert 16.5e9 <= m.active_params < 17.5e9  # 17.35 B; "17B": two significant figures
    # KV on the 15 full-attention layers only: 15 · 2 · 2 KV heads · 256 · 2 B
    assert m.kv_bytes_per_token("bf16") == 15 * 2 * 2 * 256 * 2 == 30_720
    # state: 45 layers · (64·128·128 SSM in fp32 (mamba_ssm_dtype) + 3·12,288 conv in bf16)
    assert m.state_bytes_per_sequence("bf16") == 45 * (64 * 128 * 128 * 4 + 3 * conv * 2)
    # one MTP module: a full-attention MoE layer, fc 2h -> h, 3 norms; embedding shared
    assert m.mtp_layers == 1
    assert m.mtp_params == full + moe_all + 2 * h + 2 * h * h + 3 * h


# ---- sliding window and chunked local attention --------------------------------------------


def test_mistral_sliding_window_bounds_kv() -> None:
    m = load_model(str(DATA / "mistral-7b-v0.1.json"))
    assert all(ls.mixer == "sliding" and ls.window == 4096 for ls in m.layer_plan)
    # Mistral AI, "Mistral 7B" (2023): "a 7.3B parameter model"
    assert m.params == pytest.approx(7.3e9, rel=0.02)
    per_tok = 32 * 2 * 8 * 128 * 2  # 131,072 B while the context is inside the window
    assert m.kv_bytes_per_token() == 0  # nothing grows without bound
    assert m.kv_bytes_per_sequence(1000) == 1000 * per_tok
    assert m.kv_bytes_per_sequence(100_000) == 4096 * per_tok


def test_gemma3_sliding_pattern() -> None:
    m = load_model(str(DATA / "gemma-3-27b.json"))
    full = [i for i, ls in enumerate(m.layer_plan) if ls.mixer == "full"]
    assert full == [5, 11, 17, 23, 29, 35, 41, 47, 53, 59]  # every 6th layer global
    # Gemma 3 technical report, Table 1 (27B): 25,600 M non-embedding parameters
    assert m.params - m.embedding_params() == pytest.approx(25.6e9, rel=0.02)
    assert m.kv_bytes_per_token() == 10 * 2 * 16 * 128 * 2 == 81_920
    assert m.kv_bytes_per_sequence(4096) == 4096 * 81_920 + 52 * 2 * 16 * 128 * 2 * 1024


def test_llama4_maverick_interleaved_moe_and_chunked_attention() -> None:
    m = load_model(str(DATA / "llama-4-maverick.json"))
    assert m.moe is not None and m.moe.moe_layers == tuple(range(1, 48, 2))
    assert sum(ls.mixer == "chunked" for ls in m.layer_plan) == 36
    h = 5120
    attn = h * 40 * 128 + 2 * h * 8 * 128 + 40 * 128 * h
    dense = 3 * h * 16384
    expert = 3 * h * 8192
    emb = 2 * 202048 * h
    norms = 48 * 2 * h + h
    moe_all = 128 * expert + h * 128 + expert  # routed + router + shared
    assert m.params == emb + 48 * attn + 24 * dense + 24 * moe_all + norms
    assert m.active_params == emb + 48 * attn + 24 * dense + 24 * (2 * expert + h * 128) + norms
    # Llama 4 model card: Maverick 400B total, 17B activated
    assert m.params == pytest.approx(400e9, rel=0.02)
    assert m.active_params == pytest.approx(17e9, rel=0.02)
    assert m.kv_bytes_per_token() == 12 * 2 * 8 * 128 * 2 == 49_152  # the 12 NoPE layers


def test_scout_from_shared_config_is_chunked() -> None:
    m = load_model(
        str(shared_file("hf-configs", "meta-llama--Llama-4-Scout-17B-16E-Instruct.json"))
    )
    assert m.kv_bytes_per_token() == 12 * 2 * 8 * 128 * 2
    assert m.kv_bytes_per_sequence(20_000) == 20_000 * 49_152 + 36 * 4096 * 8192


def test_window_pair_counts_by_hand() -> None:
    pre = Batch.prefill(1, 8192)
    pairs, read = pre.windowed(4096)
    assert float(pairs) == 4096 * 4097 / 2 + 4096 * 4096  # min(x, W) summed to 8192
    pairs, _ = Batch.prefill(1, 10_000).windowed(8192, chunked=True)
    assert float(pairs) == 8192 * 8193 / 2 + 1808 * 1809 / 2  # restart every 8192
    pairs, read = Batch.decode(4, 10_000).windowed(4096)
    assert float(pairs) == 4 * (4096 + 1) and float(read) == 4 * 4096
    full_pairs = float(Batch.prefill(1, 8192).attn_pairs)
    assert float(Batch.prefill(1, 8192).windowed(1e9)[0]) == full_pairs


# ---- DeciLM / Nemotron-NAS per-layer blocks -------------------------------------------------

DECILM = {
    "model_type": "nemotron-nas",
    "architectures": ["DeciLMForCausalLM"],
    "hidden_size": 1024,
    "num_hidden_layers": 4,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "head_dim": 64,
    "vocab_size": 1000,
    "intermediate_size": 4096,
    "block_configs": [
        {"attention": {"n_heads_in_group": 4}, "ffn": {"ffn_mult": 2.0}},
        {"attention": {"no_op": True, "n_heads_in_group": None}, "ffn": {"ffn_mult": 1.0}},
        {"attention": {"replace_with_linear": True}, "ffn": {"no_op": True}},
        {"attention": {"n_heads_in_group": 16}, "ffn": {"ffn_mult": 3.5}},
    ],
}


def test_decilm_blocks_by_hand() -> None:
    m = model_from_config(DECILM, id="decilm")
    kinds = [(ls.mixer, ls.kv_heads, ls.mlp, ls.intermediate) for ls in m.layer_plan]
    # ffn_mult -> 2·mult·1024/3 rounded up to 256: 2.0 -> 1536, 1.0 -> 768, 3.5 -> 2560
    assert kinds == [
        ("full", 4, "dense", 1536),
        ("none", 0, "dense", 768),
        ("proj", 0, "none", 0),
        ("full", 1, "dense", 2560),
    ]
    h = 1024
    attn = lambda kv: 2 * h * h + 2 * h * kv * 64  # noqa: E731
    want = 2 * 1000 * h + attn(4) + 3 * h * 1536 + 3 * h * 768 + h * h + attn(1) + 3 * h * 2560
    # a pre-norm per sub-block that exists: 2 + 1 (no-op attention) + 1 (no-op FFN) + 2
    assert m.params == want + 6 * h + h
    assert m.kv_bytes_per_token("bf16") == (2 * 4 * 64 + 2 * 1 * 64) * 2  # 1,280 B


def test_decilm_bad_group_names_the_field() -> None:
    bad = json.loads(json.dumps(DECILM))
    bad["block_configs"][3]["attention"]["n_heads_in_group"] = 3
    with pytest.raises(SpecError, match=r"block_configs\[3\]\.attention\.n_heads_in_group"):
        model_from_config(bad, id="bad")


def test_nemotron_super_49b_published_blocks() -> None:
    cfg = decilm_published.super_49b()
    m = model_from_config(cfg, id="nemotron-super-49b")
    plan = m.layer_plan
    assert len(plan) == 80 and not m.warnings
    assert sum(ls.mixer == "full" for ls in plan) == 49  # 31 attention blocks are no-ops
    assert {ls.kv_heads for ls in plan if ls.is_attention} == {8}  # 64 heads / 8 per group
    assert all(ls.mlp == "dense" for ls in plan)
    # ffn_mult -> int(2·mult·8192/3) rounded up to 256, by hand
    width = {5.25: 28672, 3.28125: 17920, 2.625: 14336, 1.3125: 7168, 1.0: 5632, 0.5: 2816}
    mults = Counter(mult for _, mult in decilm_published.expand(decilm_published.SUPER_49B_BLOCKS))
    assert mults == {5.25: 49, 1.3125: 10, 1.0: 8, 2.625: 6, 0.5: 6, 3.28125: 1}
    assert [ls.intermediate for ls in plan[:8]] == [14336] + [28672] * 5 + [14336] * 2
    h = 8192
    attn = 2 * h * h + 2 * h * 8 * 128  # q, o; k, v of 8 KV heads
    ffn = sum(n * 3 * h * width[mult] for mult, n in mults.items())
    norms = (49 + 80) * h + h  # input norms of the attention blocks, FFN norms, final
    assert m.params == 2 * 128256 * h + 49 * attn + ffn + norms == 49_867_145_216
    assert m.active_params == m.params  # dense
    # Hugging Face lists the checkpoint at 49.9B parameters (the Safetensors count, as
    # whatmodel.sh/model/llama-3-3-nemotron-super-49b-v1 quotes it); NVIDIA's NeMo
    # AutoModel model-coverage page says "49B"
    assert m.params == pytest.approx(49.9e9, rel=0.02)
    assert 49e9 <= m.params < 50e9
    # KV: only the 49 attention layers, 2 (K, V) · 8 heads · 128 · 2 B
    assert m.kv_bytes_per_token("bf16") == 49 * 2 * 8 * 128 * 2 == 200_704
    uniform = model_from_config({**cfg, "block_configs": None}, id="as-70b")
    assert uniform.kv_bytes_per_token("bf16") == 80 * 2 * 64 * 128 * 2  # the old reading: x13


def test_nemotron_ultra_253b_published_blocks() -> None:
    m = model_from_config(decilm_published.ultra_253b(), id="nemotron-ultra-253b")
    plan = m.layer_plan
    assert len(plan) == 162 and not m.warnings
    assert sum(ls.mixer == "full" for ls in plan) == 64
    assert {ls.kv_heads for ls in plan if ls.is_attention} == {8}  # 128 heads / 16 per group
    assert sum(ls.mixer == ls.mlp == "none" for ls in plan) == 81  # whole layers skipped
    blocks = decilm_published.expand(decilm_published.ULTRA_253B_BLOCKS)
    mults = Counter(mult for _, mult in blocks if mult is not None)
    # int(2·mult·16384/3) rounded up to 256, by hand
    width = {
        0.4875: 5376,
        0.975: 10752,
        1.4625: 16128,
        1.95: 21504,
        2.4375: 26624,
        2.925: 32000,
        3.4125: 37376,
        4.875: 53248,
        27.5625: 301056,
        31.40625: 343040,
        36.5625: 399360,
        39.0: 425984,
    }
    assert set(mults) == set(width) and sum(mults.values()) == 81
    h = 16384
    attn = 2 * h * h + 2 * h * 8 * 128
    ffn = sum(n * 3 * h * width[mult] for mult, n in mults.items())
    norms = (64 + 81) * h + h
    assert m.params == 2 * 128256 * h + 64 * attn + ffn + norms
    # Model card: "Llama-3.1-Nemotron-Ultra-253B-v1", 253B parameters
    assert m.params == pytest.approx(253e9, rel=0.02)
    assert m.kv_bytes_per_token("bf16") == 64 * 2 * 8 * 128 * 2 == 262_144


# ---- Nemotron-H style Mamba-2 hybrid ---------------------------------------------------------


def test_mamba2_hybrid_state_by_hand() -> None:
    cfg = {
        "model_type": "nemotron_h",
        "hidden_size": 512,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "vocab_size": 1000,
        "intermediate_size": 1024,
        "hidden_act": "relu2",
        "hybrid_override_pattern": "M-*-",
        "mamba_num_heads": 8,
        "mamba_head_dim": 64,
        "ssm_state_size": 16,
        "n_groups": 2,
        "conv_kernel": 4,
    }
    m = model_from_config(cfg, id="nh")
    assert [(ls.mixer, ls.mlp) for ls in m.layer_plan] == [
        ("linear", "none"),
        ("none", "dense"),
        ("full", "none"),
        ("none", "dense"),
    ]
    # state: 8 heads · 64 · 16 + conv 3 · (512 + 2·2·16) = 9,920 elements · 2 B
    assert m.state_bytes_per_sequence("bf16") == (8 * 64 * 16 + 3 * 576) * 2 == 19_840
    assert m.kv_bytes_per_token("bf16") == 2 * 2 * 64 * 2  # the one attention layer
    mamba = 512 * (2 * 512 + 2 * 2 * 16 + 8) + 576 * 4 + 576 + 3 * 8 + 512 + 512 * 512
    attn = 2 * 512 * 512 + 2 * 512 * 128
    # NemotronHBlock: one norm before its single mixer or MLP
    assert m.params == 2 * 1000 * 512 + mamba + attn + 2 * (2 * 512 * 1024) + 4 * 512 + 512


# ---- per-layer MoE patterns, dense MLP beside the experts, aliases, warnings -------------


def _moe_cfg(**extra: Any) -> dict[str, Any]:
    base = {
        "model_type": "custom_moe",
        "hidden_size": 512,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "vocab_size": 1000,
        "intermediate_size": 1024,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 256,
    }
    return {**base, **extra}


def test_moe_layer_freq_list() -> None:
    m = model_from_config(_moe_cfg(moe_layer_freq=[0, 1, 1, 0]), id="x")
    assert m.moe is not None and m.moe.moe_layers == (1, 2)
    h = 512
    attn = 4 * h * h
    assert m.params == (
        2 * 1000 * h + 4 * attn + 2 * 3 * h * 1024 + 2 * (8 * 3 * h * 256 + 8 * h) + 9 * h
    )
    with pytest.raises(SpecError, match="moe_layer_freq has 3 entries for 4 layers"):
        model_from_config(_moe_cfg(moe_layer_freq=[0, 1, 1]), id="x")


def test_first_k_dense_replace_and_step() -> None:
    m = model_from_config(_moe_cfg(first_k_dense_replace=1, moe_layer_freq=2), id="x")
    assert m.moe is not None and m.moe.moe_layers == (2,)  # i >= 1 and i % 2 == 0


def test_gemma4_style_aliases_dense_beside_experts_and_warning() -> None:
    cfg = {
        "model_type": "gemma4_text",
        "hidden_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "vocab_size": 1000,
        "intermediate_size": 512,
        "enable_moe_block": True,
        "num_experts": 8,
        "top_k_experts": 2,
        "moe_intermediate_size": 128,
        "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
        "sliding_window": 128,
        "global_head_dim": 256,
        "num_kv_shared_layers": 2,
        "tie_word_embeddings": True,
    }
    m = model_from_config(cfg, id="g4")
    assert m.moe is not None and m.moe.top_k == 2 and m.n_moe_layers == 4
    assert all(ls.intermediate == 512 for ls in m.layer_plan)  # dense MLP beside experts
    h = 256
    rest = 3 * h * 512 + h * 8 + 2 * h  # dense MLP, router, norms
    sliding = 2 * h * 4 * 64 + 2 * h * 2 * 64 + rest
    full = 2 * h * 4 * 256 + 2 * h * 2 * 256 + rest  # global_head_dim 256, same 2 KV heads
    assert m.params == 1000 * h + 3 * sliding + full + 4 * 8 * 3 * h * 128 + h
    assert m.active_params == 1000 * h + 3 * sliding + full + 4 * 2 * 3 * h * 128 + h
    assert m.kv_bytes_per_token("bf16") == 2 * 2 * 256 * 2  # the one full layer, d = 256
    assert any("'num_kv_shared_layers'" in w for w in m.warnings)
    assert not any("global_head_dim" in w for w in m.warnings)
    # without layer_types there are no global layers to give it to: named, not applied
    uniform = model_from_config({**cfg, "layer_types": None}, id="u")
    assert all(ls.head_dim == 0 and ls.mixer == "sliding" for ls in uniform.layer_plan)
    assert any("'global_head_dim'" in w for w in uniform.warnings)


# google/gemma-4-26B-A4B text_config, as reproduced by several public ports (a TensorRT-LLM
# style parser test, an MLX weight planner, a GGUF repacker and DiffusionGemma, which
# reuses the 26B-A4B decoder): the config.json itself was not found verbatim. 30 layers
# = 5 x (5 sliding (window 1024) + 1 full), hidden 2816, 16 query heads; sliding layers
# 8 KV heads of 256, full layers 2 KV heads of 512 with K = V; a dense MLP of 2112 beside
# 128 experts of 704 (top 8) on every layer; vocabulary 262,144, tied.
GEMMA4_26B = {
    "architectures": ["Gemma4ForConditionalGeneration"],
    "model_type": "gemma4",
    "text_config": {
        "model_type": "gemma4_text",
        "attention_k_eq_v": True,
        "enable_moe_block": True,
        "final_logit_softcapping": 30.0,
        "global_head_dim": 512,
        "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_size": 2816,
        "hidden_size_per_layer_input": 0,
        "intermediate_size": 2112,
        "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 5,
        "max_position_embeddings": 262144,
        "moe_intermediate_size": 704,
        "num_attention_heads": 16,
        "num_experts": 128,
        "num_global_key_value_heads": 2,
        "num_hidden_layers": 30,
        "num_key_value_heads": 8,
        "num_kv_shared_layers": 0,
        "sliding_window": 1024,
        "tie_word_embeddings": True,
        "top_k_experts": 8,
        "vocab_size": 262144,
    },
    "tie_word_embeddings": True,
}


def test_gemma4_26b_a4b_global_layers_and_card() -> None:
    m = model_from_config(GEMMA4_26B, id="gemma-4-26b-a4b")
    full = [i for i, ls in enumerate(m.layer_plan) if ls.mixer == "full"]
    assert full == [5, 11, 17, 23, 29] and not m.warnings
    g = m.layer_plan[5]
    assert (g.kv_heads, g.head_dim, g.k_eq_v) == (2, 512, True)
    h = 2816
    sliding = 2 * h * 16 * 256 + 2 * h * 8 * 256  # q, o; k, v
    glob = 2 * h * 16 * 512 + h * 2 * 512  # q, o; k only (K = V)
    rest = 3 * h * 2112 + h * 128 + 2 * h  # dense MLP, router, 2 norms (Gemma's extra
    # pre/post-FFN norms, ~0.4 M in all, are not counted)
    expert = 3 * h * 704
    base = 262144 * h + 25 * sliding + 5 * glob + 30 * rest + h
    assert m.params == base + 30 * 128 * expert
    assert m.active_params == base + 30 * 8 * expert
    # Model card (huggingface.co/google/gemma-4-26B-A4B): 25.2B total, 3.8B active
    # parameters (the ~550M vision encoder apart)
    assert m.params == pytest.approx(25.2e9, rel=0.02)  # 25.23 B
    assert m.active_params == pytest.approx(3.8e9, rel=0.02)  # 3.82 B
    # KV growing with the context: the 5 global layers' unified K = V, 2 heads · 512 · 2 B
    assert m.kv_bytes_per_token("bf16") == 5 * 2 * 512 * 2 == 10_240
    # inside the window the 25 sliding layers add 2 · 8 · 256 · 2 B each: 210 KiB/token
    swa = 25 * 2 * 8 * 256 * 2
    assert m.kv_bytes_per_sequence(1024) == 1024 * (10_240 + swa) == 1024 * 210 * 1024
    assert m.kv_bytes_per_sequence(8192) == 8192 * 10_240 + 1024 * swa


def test_unknown_cost_field_is_named() -> None:
    cfg = json.loads((DATA / "mistral-7b-v0.1.json").read_text())
    assert load_model(str(DATA / "mistral-7b-v0.1.json")).warnings == ()
    cfg["num_memory_heads"] = 7
    m = model_from_config(cfg, id="m")
    assert any("'num_memory_heads'" in w and "not modelled" in w for w in m.warnings)


def test_missing_top_k_names_the_aliases() -> None:
    cfg = _moe_cfg()
    del cfg["num_experts_per_tok"]
    with pytest.raises(
        SpecError, match=r"missing field 'num_experts_per_tok' \(or .*'top_k_experts'"
    ):
        model_from_config(cfg, id="x")


def test_bad_value_names_the_key_actually_read() -> None:
    with pytest.raises(SpecError, match="field 'top_k_experts' must be an integer in"):
        model_from_config(
            {**_moe_cfg(), "num_experts_per_tok": None, "top_k_experts": "two"}, id="x"
        )


# ---- MTP, DSA and quantization on the DeepSeek / Kimi configs ---------------------------


def test_deepseek_v3_mtp_and_fp8() -> None:
    m = model_from_config(_shared("deepseek-ai--DeepSeek-V3.json"), id="ds")
    assert m.mtp_layers == 1
    # DeepSeek-V3 model card: "671B of the Main Model weights and 14B of the MTP Module
    # weights", 685B on Hugging Face (the MTP layer stores its own embedding and head).
    assert m.params == pytest.approx(671e9, rel=0.02)
    assert m.params + m.mtp_params == pytest.approx(685e9, rel=0.02)
    assert m.mtp_params == pytest.approx(14e9, rel=0.05)  # "14B": two significant figures
    q = m.quantization
    assert q is not None and q.method == "fp8" and q.weights.is_uniform
    assert q.weights.attention == "fp8" and q.act_dtype == "fp8"
    assert q.weights.bytes_of("embedding") == 2.0  # embedding and head stay bf16


def test_deepseek_v32_dsa() -> None:
    cfg = {**_shared("deepseek-ai--DeepSeek-V3.json"), "index_topk": 2048}
    cfg.update(index_n_heads=64, index_head_dim=128)
    m = model_from_config(cfg, id="ds32")
    assert m.sparse_attn is not None and m.sparse_attn.top_k == 2048
    idx = 1536 * 64 * 128 + 7168 * 128 + 2 * 128 + 7168 * 64  # wq_b, wk + norm, weights
    v3 = model_from_config(_shared("deepseek-ai--DeepSeek-V3.json"), id="ds")
    assert m.params - v3.params == 61 * idx
    # DeepSeek-V3.2-Exp on Hugging Face: 685B (main model + MTP)
    assert m.params + m.mtp_params == pytest.approx(685e9, rel=0.02)
    assert m.kv_bytes_per_token("bf16") == 61 * (512 + 64 + 128) * 2  # latent + indexer key


KIMI_INT4 = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 4, "type": "int", "group_size": 32, "strategy": "group"},
            "input_activations": None,
        }
    },
    "ignore": [
        "lm_head",
        "re:.*self_attn.*",
        "re:.*shared_experts.*",
        "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
    ],
}


def test_int4_expert_checkpoint_keeps_attention_bf16() -> None:
    cfg = {**_shared("moonshotai--Kimi-K2-Instruct.json"), "quantization_config": KIMI_INT4}
    m = model_from_config(cfg, id="kimi-int4")
    q = m.quantization
    assert q is not None
    w = q.weights
    assert (w.attention, w.dense_mlp, w.shared_experts, w.routed_experts) == (
        "bf16",
        "bf16",
        "bf16",
        "int4",
    )
    assert q.act_dtype == "bf16"


def test_mxfp4_and_nvfp4_dtypes() -> None:
    from perfmodel.dtypes import get_dtype

    assert get_dtype("nvfp4").bytes == 0.5 + 1 / 16  # E2M1 + one E4M3 scale per 16
    assert get_dtype("mxfp4").bytes == 0.5 + 1 / 32  # E2M1 + one E8M0 scale per 32
    cfg = _moe_cfg(
        quantization_config={
            "quant_method": "mxfp4",
            "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router"],
        }
    )
    q = model_from_config(cfg, id="oss").quantization
    assert q is not None and q.weights.routed_experts == "mxfp4" and q.weights.attention == "bf16"


def test_every_shared_config_parses_without_warnings_or_crash() -> None:
    d = shared_file("hf-configs")
    for p in sorted(d.glob("*.json")):
        m = load_model(str(p))
        assert m.params > 0 and not m.warnings, (p.name, m.warnings)


def test_tp_check_covers_linear_heads() -> None:
    m = load_model(str(DATA / "qwen3-next-80b-a3b.json"))
    m.check_tp(4)
    with pytest.raises(SpecError, match="tp=3"):
        m.check_tp(3)
    assert np.isfinite(m.kv_bytes_per_sequence(10))


def test_qwen25_small_dense_card() -> None:
    m = load_model(str(DATA / "qwen2.5-1.5b.json"))
    assert m.layer_specs == ()  # use_sliding_window false: uniform full attention
    # Qwen2.5-1.5B model card: 1.54B parameters, 1.31B non-embedding (tied embeddings)
    assert m.params == pytest.approx(1.54e9, rel=0.02)
    assert m.params - m.embedding_params() == pytest.approx(1.31e9, rel=0.02)
    assert m.kv_bytes_per_token() == 28 * 2 * 2 * 128 * 2  # 28,672 B


def test_unmodelled_hybrid_fields_warn_and_bad_values_name_the_field() -> None:
    # MiMo-V2-Flash-like: a per-layer MoE list, sliding-window layers with their own heads
    cfg = _moe_cfg(
        moe_layer_freq=[0, 1, 1, 1],
        hybrid_layer_pattern=[0, 1, 1, 0],
        swa_num_key_value_heads=8,
        sliding_window=128,
        layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
    )
    m = model_from_config(cfg, id="mimo-like")
    assert m.moe is not None and m.moe.moe_layers == (1, 2, 3)
    named = " ".join(m.warnings)
    assert "'hybrid_layer_pattern'" in named and "'swa_num_key_value_heads'" in named
    with pytest.raises(SpecError, match="field 'sliding_window' must be a non-negative integer"):
        model_from_config({**cfg, "sliding_window": "128k"}, id="x")
    with pytest.raises(SpecError, match=r"layer_types\[1\] 'sparse' is not a known layer type"):
        model_from_config(
            {**cfg, "layer_types": ["full_attention", "sparse", "full", "full"]}, id="x"
        )


def test_gemma4_global_layers_in_the_step() -> None:
    from perfmodel.plan import ParallelPlan
    from perfmodel.step.ops import attention_ops

    m = model_from_config(GEMMA4_26B, id="gemma-4-26b-a4b")
    ops = {op.name: op for op in attention_ops(m, ParallelPlan(2), Batch.decode(8, 4096))}
    assert ops["qkv_proj_swa"].count == 25 and ops["qkv_proj"].count == 5
    # one decode token per sequence (unpadded rows); per device (TP 2) the global q is 8
    # heads of 512 and the unified K one KV head of 512: 2 FLOP · 8 · (4096 + 512) · 2816
    assert float(ops["qkv_proj"].unpadded_flops) == 2 * 8 * (8 * 512 + 512) * 2816
    assert float(ops["qkv_proj_swa"].unpadded_flops) == 2 * 8 * (8 * 256 + 2 * 4 * 256) * 2816
