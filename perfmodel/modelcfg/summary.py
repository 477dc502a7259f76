"""The summary of a model spec that ``perfmodel model show --json`` prints.

It takes the :class:`perfmodel.model.ModelSpec` (which sits above this folder) as its
argument and reads only its fields and formulas: :meth:`ModelSpec.to_dict` calls it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from perfmodel.modelcfg.layers import LayerSpec

WEIGHT_DTYPES = ("bf16", "fp8", "int4")
KV_DTYPES = ("bf16", "fp8")
SEQUENCE_TOKENS = (1024, 8192, 131072)


def layer_mix(layer_plan: Iterable[LayerSpec]) -> dict[str, int]:
    """Layers by (mixer, MLP) kind, e.g. ``{'linear+moe': 36, 'full+moe': 12}``."""
    out: dict[str, int] = {}
    for ls in layer_plan:
        kind = ls.mixer + (f"{ls.window}" if ls.bounded else "") + "+" + ls.mlp
        out[kind] = out.get(kind, 0) + 1
    return out


def attention_kind(m: Any) -> str:
    """MLA, MHA (as many KV heads as heads) or GQA."""
    return "MLA" if m.mla else ("MHA" if m.kv_heads == m.heads else "GQA")


def model_summary(m: Any) -> dict[str, object]:
    """Architecture, parameter counts, weight and KV bytes of a ``ModelSpec``."""
    moe = m.moe
    return {
        "id": m.id,
        "name": m.name,
        "family": m.family,
        "attention": attention_kind(m),
        "moe": None
        if not moe
        else {
            "experts": moe.num_experts,
            "top_k": moe.top_k,
            "expert_intermediate": moe.expert_intermediate,
            "shared_intermediate": moe.shared_intermediate,
            "moe_layers": len(moe.moe_layers),
        },
        "layers": m.layers,
        "hidden": m.hidden,
        "heads": m.heads,
        "kv_heads": m.kv_heads,
        "head_dim": m.head_dim,
        "vocab": m.vocab,
        "params": m.params,
        "active_params": m.active_params,
        "weight_bytes": {d: m.weight_bytes(d) for d in WEIGHT_DTYPES},
        "kv_bytes_per_token": {d: m.kv_bytes_per_token(d) for d in KV_DTYPES},
        "published_params": m.published_params,
        "layer_mix": layer_mix(m.layer_plan),
        "kv_bytes_per_sequence_bf16": {
            str(n): m.kv_bytes_per_sequence(n, "bf16") for n in SEQUENCE_TOKENS
        },
        "state_bytes_per_sequence_bf16": m.state_bytes_per_sequence("bf16"),
        "mtp_layers": m.mtp_layers,
        "mtp_params": m.mtp_params,
        "sparse_attention_top_k": m.sparse_attn.top_k if m.sparse_attn else None,
        "quantization": None if m.quantization is None else m.quantization.describe(),
        "warnings": list(m.warnings),
    }
