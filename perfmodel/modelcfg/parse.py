"""Reading a Hugging Face ``config.json`` (or a catalog TOML) into ``ModelSpec`` fields.

Families differ in key names; the aliases are listed once here (``_ALIASES``). Fields
that change the cost and are not modelled produce a warning naming them
(``ModelSpec.warnings``), errors name the field that is actually wrong.
"""

from __future__ import annotations

import math
import re
from typing import Any

from perfmodel.errors import SpecError
from perfmodel.modelcfg.layers import MLA, LinearAttn, MoE, SparseAttn
from perfmodel.modelcfg.patterns import layer_specs, moe_layers
from perfmodel.modelcfg.quant import parse_quantization

_ALIASES: dict[str, tuple[str, ...]] = {
    "hidden": ("hidden_size", "d_model", "n_embd", "dim"),
    "layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "heads": ("num_attention_heads", "n_head", "n_heads"),
    "kv_heads": ("num_key_value_heads", "n_kv_head", "num_kv_heads", "n_kv_heads"),
    "vocab": ("vocab_size", "padded_vocab_size"),
    "experts": ("n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts"),
    "top_k": (
        "num_experts_per_tok",
        "num_experts_per_token",
        "top_k_experts",
        "moe_topk",
        "experts_per_token",
        "moe_k",
        "top_k",
    ),
    "expert_inter": ("moe_intermediate_size", "expert_intermediate_size", "moe_ffn_hidden_size"),
    "shared_inter": ("shared_expert_intermediate_size", "moe_shared_expert_intermediate_size"),
    "n_shared": ("n_shared_experts", "num_shared_experts", "moe_num_shared_experts"),
    "mtp": ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_modules"),
}

#: keys read by this parser (or by ``patterns`` / ``quant``)
_MODELLED = {k for keys in _ALIASES.values() for k in keys} | {
    "head_dim",
    "hidden_act",
    "activation_function",
    "intermediate_size",
    "intermediate_size_mlp",
    "ffn_dim",
    "kv_lora_rank",
    "q_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "first_k_dense_replace",
    "moe_layer_freq",
    "decoder_sparse_step",
    "interleave_moe_layer_step",
    "mlp_only_layers",
    "tie_word_embeddings",
    "max_position_embeddings",
    "word_embed_proj_dim",
    "attention_bias",
    "enable_bias",
    "mlp_bias",
    "sliding_window",
    "use_sliding_window",
    "max_window_layers",
    "sliding_window_pattern",
    "layer_types",
    "attention_chunk_size",
    "no_rope_layers",
    "no_rope_layer_interval",
    "full_attention_interval",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
    "mamba_ssm_dtype",
    "block_configs",
    "hybrid_override_pattern",
    "mamba_num_heads",
    "mamba_head_dim",
    "ssm_state_size",
    "n_groups",
    "conv_kernel",
    "index_topk",
    "index_n_heads",
    "index_head_dim",
    "attn_output_gate",
    "enable_moe_block",
    "mtp_use_dedicated_embeddings",
    "quantization_config",
    "torch_dtype",
    "dtype",
    "model_type",
    "text_config",
}
#: cost-relevant keys of known families that are not modelled (named in the warning)
_UNMODELLED = {
    "num_kv_shared_layers": "layers sharing another layer's KV cache",
    "hidden_size_per_layer_input": "per-layer input embeddings",
    "swa_num_attention_heads": "separate head counts of the sliding-window layers",
    "global_head_dim": "a global-layer head_dim without layer_types",  # Gemma-4
    "num_global_key_value_heads": "global-layer KV heads without layer_types",
    "attention_k_eq_v": "K = V on global layers without layer_types",
    "swa_num_key_value_heads": "separate KV heads of the sliding-window layers",
    "swa_head_dim": "separate head_dim of the sliding-window layers",
    "attn_type_list": "lightning (linear) attention layers",
    "hybrid_layer_pattern": "a hybrid attention layer pattern",
    "num_sink_tokens": "attention sink tokens",
    "moe_latent_size": "latent MoE projections",
    "hc_count": "hyper-connection streams",
    "ngram_size": "n-gram embeddings",
}
_GLOBAL_LAYER = ("global_head_dim", "num_global_key_value_heads", "attention_k_eq_v")
_COST_WORDS = re.compile(
    r"(head|expert|layer|window|intermediate|lora|moe|attn|attention|ssm|mamba|linear|"
    r"state|kv|chunk|sparse|index|mtp|nextn|dim$|_size$)"
)
_HARMLESS = re.compile(
    r"(dropout|eps|init|rope|theta|scal|token_id|_id$|aux|loss|capacity_factor|jitter|"
    r"norm_topk|router_|routed_scaling|topk_method|topk_group|n_group|scoring|output_router|"
    r"use_cache|pad|bos|eos|softcap|logit|temperature|position_embedding|qk_norm|"
    r"max_position|transformers_version|auto_map|architectures|_name_or_path|"
    r"attn_implementation|vision|audio|image|video|mm_|sliding_window_size$|^ep_size$)"
)


MAX_LAYERS = 10_000  # a sanity bound: the per-layer structure is built layer by layer


def _get(cfg: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for k in keys:
        if k in cfg and cfg[k] is not None:
            return cfg[k]
    return default


#: Largest size field a config may hold (2**31: beyond every published model by far).
MAX_CONFIG_INT = 2**31


def _int(cfg: dict[str, Any], where: str, *keys: str, default: int | None = None) -> int:
    """The first of ``keys`` present; errors name the key that was read (or all tried)."""
    found = next((k for k in keys if k in cfg and cfg[k] is not None), None)
    if found is None:
        if default is None:
            tried = f" (or {', '.join(repr(k) for k in keys[1:])})" if len(keys) > 1 else ""
            raise SpecError(f"{where}: missing field {keys[0]!r}{tried}")
        return default
    v = cfg[found]
    if (
        isinstance(v, bool)
        or not isinstance(v, int | float)
        or not math.isfinite(v)
        or v != int(v)
        or not 0 <= v <= MAX_CONFIG_INT
    ):
        raise SpecError(
            f"{where}: field {found!r} must be an integer in [0, {MAX_CONFIG_INT}], got {v!r}"
        )
    return int(v)


def _a(cfg: dict[str, Any], where: str, name: str, default: int | None = None) -> int:
    return _int(cfg, where, *_ALIASES[name], default=default)


def _flatten(cfg: dict[str, Any]) -> dict[str, Any]:
    for key in ("text_config", "llm_config", "language_config"):
        sub = cfg.get(key)
        if isinstance(sub, dict):
            return {**cfg, **sub}
    return cfg


def _warnings(cfg: dict[str, Any]) -> list[str]:
    out = []
    for k, v in cfg.items():
        if v in (None, False, 0, [], {}, "") or k in _MODELLED:
            continue
        if k in _GLOBAL_LAYER and isinstance(cfg.get("layer_types"), list):
            continue
        if k in _UNMODELLED:
            out.append(f"config field {k!r} ({_UNMODELLED[k]}) is not modelled: costs ignore it")
        elif (
            isinstance(v, int | float | list | str)
            and _COST_WORDS.search(k)
            and not _HARMLESS.search(k)
        ):
            out.append(f"config field {k!r} = {v!r:.40} may change the cost and is not modelled")
    return out


def _moe(
    cfg: dict[str, Any], where: str, layers: int, family: str
) -> tuple[tuple[int, int, int, int] | None, tuple[int, ...]]:
    n_exp = _a(cfg, where, "experts", default=0)
    if n_exp <= 1:
        return None, ()
    top_k = _a(cfg, where, "top_k")
    llama4 = family.startswith("llama4")
    if llama4:
        e_int = _int(cfg, where, "intermediate_size")
    else:
        e_int = _int(cfg, where, *_ALIASES["expert_inter"], "intermediate_size")
    n_shared = _a(cfg, where, "n_shared", default=0)
    shared = _int(cfg, where, *_ALIASES["shared_inter"], default=n_shared * e_int)
    if llama4:
        shared = e_int  # one shared expert of the routed size
    return (n_exp, top_k, e_int, shared), moe_layers(cfg, layers, where)


def _linear_attn(cfg: dict[str, Any], where: str) -> LinearAttn | None:
    state = str(cfg.get("mamba_ssm_dtype") or "")
    if "linear_num_value_heads" in cfg:
        return LinearAttn(
            "gdn",
            k_heads=_int(cfg, where, "linear_num_key_heads"),
            k_dim=_int(cfg, where, "linear_key_head_dim"),
            v_heads=_int(cfg, where, "linear_num_value_heads"),
            v_dim=_int(cfg, where, "linear_value_head_dim"),
            conv_kernel=_int(cfg, where, "linear_conv_kernel_dim", default=4),
            state_dtype=state,
        )
    if "mamba_num_heads" in cfg:
        return LinearAttn(
            "mamba2",
            k_heads=0,
            k_dim=_int(cfg, where, "ssm_state_size"),
            v_heads=_int(cfg, where, "mamba_num_heads"),
            v_dim=_int(cfg, where, "mamba_head_dim"),
            conv_kernel=_int(cfg, where, "conv_kernel", default=4),
            groups=_int(cfg, where, "n_groups", default=1),
            state_dtype=state,
        )
    return None


def _mla(cfg: dict[str, Any], where: str) -> MLA | None:
    if not _get(cfg, "kv_lora_rank"):
        return None
    return MLA(
        kv_lora_rank=_int(cfg, where, "kv_lora_rank"),
        q_lora_rank=_int(cfg, where, "q_lora_rank", default=0),
        qk_nope_head_dim=_int(cfg, where, "qk_nope_head_dim"),
        qk_rope_head_dim=_int(cfg, where, "qk_rope_head_dim"),
        v_head_dim=_int(cfg, where, "v_head_dim"),
    )


#: Families whose MLP is two matrices (up, down) whatever their activation.
_PLAIN_MLP = ("opt", "gpt2", "gptj", "gpt_neox", "falcon", "bloom", "phi", "nemotron_h")


def _gated_mlp(cfg: dict[str, Any], family: str) -> bool:
    """Gated (gate, up, down) MLP unless the family or a relu² activation says otherwise."""
    act = str(_get(cfg, "hidden_act", "activation_function", default="silu")).lower()
    gated = act in ("silu", "swiglu", "gelu_pytorch_tanh", "geglu", "gelu")
    return gated and family not in _PLAIN_MLP and act != "relu2"


def _sparse_attn(cfg: dict[str, Any], where: str, mla: Any) -> SparseAttn | None:
    """DeepSeek DSA top-k sparse attention with its indexer (MLA models only)."""
    if not _get(cfg, "index_topk"):
        return None
    if mla is None:
        raise SpecError(f"{where}: index_topk (DSA sparse attention) is modelled with MLA only")
    return SparseAttn(
        top_k=_int(cfg, where, "index_topk"),
        index_heads=_int(cfg, where, "index_n_heads"),
        index_dim=_int(cfg, where, "index_head_dim"),
    )


def _published(cfg: dict[str, Any], where: str, key: str) -> float | None:
    """A model card's parameter count (catalog entries): a positive finite number or absent."""
    v = cfg.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not (math.isfinite(v) and v > 0):
        raise SpecError(
            f"{where}: field {key!r} must be a positive number of parameters, got {v!r}"
        )
    return float(v)


def spec_fields(cfg: dict[str, Any], *, id: str = "", where: str = "") -> dict[str, Any]:
    """Keyword arguments of ``ModelSpec`` from a config dict."""
    top = cfg
    cfg = _flatten(cfg)
    mid = id or str(cfg.get("id") or cfg.get("_name_or_path") or "custom")
    where = where or f"model {mid!r}"
    family = str(cfg.get("model_type", "")).lower()
    hidden = _a(cfg, where, "hidden")
    layers = _a(cfg, where, "layers")
    if layers > MAX_LAYERS:
        raise SpecError(f"{where}: num_hidden_layers {layers} is beyond {MAX_LAYERS}")
    heads = _a(cfg, where, "heads")
    kv_heads = _a(cfg, where, "kv_heads", default=heads)
    if heads == 0 or hidden == 0 or layers == 0:
        raise SpecError(f"{where}: hidden_size, num_hidden_layers, num_attention_heads must be > 0")
    head_dim = _int(cfg, where, "head_dim", default=hidden // heads)
    vocab = _a(cfg, where, "vocab")
    gated = _gated_mlp(cfg, family)
    intermediate = _int(
        cfg, where, "intermediate_size_mlp", "intermediate_size", "ffn_dim", default=4 * hidden
    )
    mla = _mla(cfg, where)
    moe_args, moe_idx = _moe(cfg, where, layers, family)
    beside = bool(cfg.get("enable_moe_block")) and moe_args is not None
    specs = layer_specs(
        cfg,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        hidden=hidden,
        intermediate=intermediate,
        moe_idx=moe_idx,
        dense_beside_moe=beside,
        where=where,
    )
    if specs:
        moe_idx = tuple(i for i, ls in enumerate(specs) if ls.mlp == "moe")
        if moe_idx and moe_args is None:
            raise SpecError(
                f"{where}: MoE layers in the pattern but no expert count (n_routed_experts)"
            )
    moe = MoE(*moe_args, moe_idx) if moe_args else None
    if (
        specs
        and all(ls.mixer != "linear" for ls in specs)
        and not beside
        and all(
            (ls.mixer, ls.kv_heads, ls.window, ls.mlp, ls.head_dim, ls.k_eq_v)
            == ("full", kv_heads, 0, "moe" if i in moe_idx else "dense", 0, False)
            and (ls.intermediate == (0 if i in moe_idx else intermediate))
            for i, ls in enumerate(specs)
        )
    ):
        specs = ()  # uniform after all
    sparse = _sparse_attn(cfg, where, mla)
    tied = bool(cfg.get("tie_word_embeddings", family == "opt"))
    learned_pos = 0
    if family == "opt":
        learned_pos = _int(cfg, where, "max_position_embeddings") + 2
        if _int(cfg, where, "word_embed_proj_dim", default=hidden) != hidden:
            raise SpecError(
                f"{where}: OPT with word_embed_proj_dim != hidden_size is not supported"
            )
    attn_bias = bool(_get(cfg, "attention_bias", "enable_bias", default=False)) or family in (
        "qwen2",
        "qwen2_moe",
    )
    base = str(
        _get(top, "torch_dtype", "dtype", default=None)
        or _get(cfg, "torch_dtype", "dtype", default="bf16")
    )
    quant, qwarn = parse_quantization(
        top if "quantization_config" in top else cfg, base=base, where=where
    )
    published = _published(cfg, where, "published_params")
    published_active = _published(cfg, where, "published_active_params")
    return dict(
        id=mid,
        name=str(cfg.get("name", mid)),
        family=family,
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        vocab=vocab,
        intermediate=intermediate,
        gated_mlp=gated,
        tied_embeddings=tied,
        attn_bias=attn_bias,
        mlp_bias=bool(_get(cfg, "mlp_bias", "enable_bias", default=False)),
        learned_pos_embeddings=learned_pos,
        mla=mla,
        moe=moe,
        layer_specs=specs,
        linear_attn=_linear_attn(cfg, where),
        sparse_attn=sparse,
        attn_output_gate=bool(cfg.get("attn_output_gate", family == "qwen3_next")),
        mtp_layers=_a(cfg, where, "mtp", default=0),
        # DeepSeek-style MTP stores its own embedding and head; Qwen3-Next / 3.5 share
        mtp_own_embedding=bool(
            cfg.get(
                "mtp_use_dedicated_embeddings", not family.startswith(("qwen3_next", "qwen3_5"))
            )
        ),
        quantization=quant,
        published_params=float(published) if published else None,
        published_active_params=float(published_active) if published_active else None,
        sources=tuple(str(s) for s in cfg.get("sources", ())),
        warnings=tuple(qwarn + _warnings(cfg)),
        raw=cfg,
    )
