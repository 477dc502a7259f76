"""The published per-layer architecture of two Nemotron-NAS (DeciLM) checkpoints,
transcribed as run-length groups and rebuilt into ``config.json`` dicts in code.

Source: the ``config.json`` files of nvidia/Llama-3_3-Nemotron-Super-49B-v1 and
nvidia/Llama-3_1-Nemotron-Ultra-253B-v1 on Hugging Face, as copied into NVIDIA
Megatron-Bridge (``megatron/bridge/models/llama_nemotron/llama_nemotron_config.py``).
The transcription was checked by rebuilding that file character for character
(112,110 characters; the Ultra config begins at offset 37,949 and its 36.5625 / 39.0
``ffn_mult`` entries sit at 94,992 / 99,046, as in the stored copy).

Each group is ``(layers, n_heads_in_group, ffn_mult)``: ``n_heads_in_group`` 0 is an
attention ``no_op`` block, ``ffn_mult`` None an FFN ``no_op`` block. Neither
checkpoint has a ``replace_with_linear`` or windowed block.
"""

from __future__ import annotations

from typing import Any

Group = tuple[int, int, float | None]

SUPER_49B_BLOCKS: tuple[Group, ...] = (
    (1, 8, 2.625),
    (5, 8, 5.25),
    (2, 0, 2.625),
    (3, 8, 5.25),
    (1, 0, 3.28125),
    (30, 8, 5.25),
    (1, 0, 1.3125),
    (2, 0, 2.625),
    (1, 0, 1.3125),
    (1, 0, 5.25),
    (1, 0, 1.3125),
    (1, 0, 2.625),
    (3, 0, 1.3125),
    (1, 8, 5.25),
    (1, 0, 1.3125),
    (2, 0, 1.0),
    (1, 0, 1.3125),
    (3, 0, 1.0),
    (2, 0, 1.3125),
    (2, 0, 0.5),
    (2, 0, 1.0),
    (2, 0, 0.5),
    (1, 0, 1.0),
    (2, 0, 0.5),
    (9, 8, 5.25),
)

ULTRA_253B_BLOCKS: tuple[Group, ...] = (
    (1, 16, 0.4875),
    (1, 16, 0.975),
    (6, 16, 1.4625),
    (1, 16, 1.95),
    (4, 0, None),
    (3, 16, 1.95),
    (2, 16, 4.875),
    (6, 0, None),
    (3, 16, 4.875),
    (5, 0, None),
    (3, 16, 4.875),
    (1, 16, 2.4375),
    (3, 0, None),
    (3, 16, 1.95),
    (1, 0, 1.95),
    (1, 16, 4.875),
    (1, 0, 4.875),
    (5, 0, None),
    (4, 16, 4.875),
    (5, 0, None),
    (4, 16, 4.875),
    (5, 0, None),
    (4, 16, 4.875),
    (5, 0, None),
    (4, 16, 4.875),
    (5, 0, None),
    (1, 16, 4.875),
    (3, 16, 3.4125),
    (2, 0, None),
    (1, 16, 2.925),
    (3, 16, 2.4375),
    (2, 0, 2.4375),
    (1, 16, 2.4375),
    (1, 0, None),
    (7, 0, 2.4375),
    (1, 16, 2.4375),
    (5, 0, None),
    (1, 16, 2.925),
    (1, 16, 4.875),
    (1, 0, 4.875),
    (1, 16, 4.875),
    (8, 0, None),
    (1, 0, 36.5625),
    (8, 0, None),
    (1, 0, 39.0),
    (8, 0, None),
    (1, 0, 31.40625),
    (5, 0, None),
    (1, 0, 27.5625),
    (1, 0, 1.95),
    (1, 16, 1.95),
    (1, 16, 2.4375),
    (1, 0, None),
    (2, 16, 2.4375),
    (1, 16, 3.4125),
    (4, 16, 4.875),
    (1, 16, 2.4375),
)


def expand(groups: tuple[Group, ...]) -> list[tuple[int, float | None]]:
    """One ``(n_heads_in_group, ffn_mult)`` per layer."""
    return [(g, m) for n, g, m in groups for _ in range(n)]


def _block(group: int, mult: float | None) -> dict[str, Any]:
    # the keys every block of both files carries (the unmodelled ones null / false)
    attention = {
        "n_heads_in_group": group or None,
        "no_op": not group,
        "num_sink_tokens": None,
        "replace_with_linear": False,
        "sparsify": None,
        "unshifted_sink": False,
        "use_prefill_window_in_sink_attention": False,
        "window_length": None,
    }
    ffn = {"ffn_mult": mult, "no_op": mult is None, "replace_with_linear": False, "sparsify": None}
    return {"attention": attention, "ffn": ffn}


def _config(groups: tuple[Group, ...], hidden: int, heads: int, rope_factor: float) -> dict:
    blocks = [_block(g, m) for g, m in expand(groups)]
    return {
        "architectures": ["DeciLMForCausalLM"],
        "model_type": "nemotron-nas",
        "attention_bias": False,
        "block_configs": blocks,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "intermediate_size": None,
        "max_position_embeddings": 131072,
        "mlp_bias": False,
        "num_attention_heads": heads,
        "num_hidden_layers": len(blocks),
        "num_key_value_heads": None,
        "rope_scaling": {"factor": rope_factor, "rope_type": "llama3"},
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 128256,
    }


def super_49b() -> dict[str, Any]:
    """Llama-3.3-Nemotron-Super-49B-v1: 80 layers, hidden 8192, 64 heads of 128."""
    return _config(SUPER_49B_BLOCKS, hidden=8192, heads=64, rope_factor=8.0)


def ultra_253b() -> dict[str, Any]:
    """Llama-3.1-Nemotron-Ultra-253B-v1: 162 layers, hidden 16384, 128 heads of 128."""
    return _config(ULTRA_253B_BLOCKS, hidden=16384, heads=128, rope_factor=16.0)
