"""Per-layer patterns of Hugging Face configs -> ``LayerSpec`` tuples.

Mixers (first match wins): DeciLM / Nemotron-NAS ``block_configs``; Nemotron-H
``hybrid_override_pattern`` (``M`` Mamba-2, ``*`` attention, ``-`` MLP, ``E`` MoE, one
block per layer); ``layer_types`` (``full_attention`` / ``sliding_attention`` /
``chunked_attention`` / ``linear_attention`` / ``mamba``); Qwen3-Next
``full_attention_interval`` (every N-th layer full, the rest Gated DeltaNet);
Llama-4 ``attention_chunk_size`` with ``no_rope_layers`` (RoPE layers chunked, NoPE
layers global; default every 4th global); Gemma ``sliding_window_pattern``; a plain
``sliding_window`` (Mistral; Qwen2 only with ``use_sliding_window`` from
``max_window_layers`` on).

MoE layers: ``moe_layer_freq`` as a per-layer 0/1 list; DeepSeek rule (``i ≥
first_k_dense_replace`` and ``i mod moe_layer_freq = 0``); Llama-4 rule (``(i+1) mod
interleave_moe_layer_step = 0``); Qwen rule (``(i+1) mod decoder_sparse_step = 0`` and
``i ∉ mlp_only_layers``).
"""

from __future__ import annotations

import math
from typing import Any

from perfmodel.errors import SpecError
from perfmodel.modelcfg.layers import LayerSpec

_LAYER_TYPES = {
    "full_attention": "full",
    "attention": "full",
    "global": "full",
    "full": "full",
    "sliding_attention": "sliding",
    "sliding_window": "sliding",
    "sliding": "sliding",
    "local": "sliding",
    "chunked_attention": "chunked",
    "linear_attention": "linear",
    "mamba": "linear",
    "gdn": "linear",
}


def is_count(v: object) -> bool:
    """A non-negative whole number (an int, or a float with an integer value)."""
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return False
    return v == int(v) and v >= 0


def _n(table: dict[str, Any], key: str, where: str, default: int = 0) -> int:
    """A non-negative integer field (``default`` when absent, null or 0); the error
    names the field."""
    v = table.get(key)
    if v is None or v == 0:
        return default
    if (
        isinstance(v, bool)
        or not isinstance(v, int | float)
        or not math.isfinite(v)
        or v != int(v)
        or v < 0
    ):
        raise SpecError(f"{where}: field {key!r} must be a non-negative integer, got {v!r}")
    return int(v) or default


def decilm_intermediate(ffn_mult: float, hidden: int) -> int:
    """DeciLM's FFN width: ``2·ffn_mult·hidden/3`` rounded up to a multiple of 256
    (``_ffn_mult_to_intermediate_size`` of the Nemotron-NAS modeling code)."""
    return 256 * math.ceil(int(2 * ffn_mult * hidden / 3) / 256)


def _decilm(cfg: dict[str, Any], heads: int, hidden: int, where: str) -> list[LayerSpec]:
    out = []
    for i, b in enumerate(cfg["block_configs"]):
        if not isinstance(b, dict) or not isinstance(b.get("attention"), dict):
            raise SpecError(f"{where}: block_configs[{i}] needs an 'attention' table")
        a, f = b["attention"], b.get("ffn") or {}
        if a.get("no_op"):
            mixer, kv, win = "none", 0, 0
        elif a.get("replace_with_linear"):
            mixer, kv, win = "proj", 0, 0
        else:
            g = a.get("n_heads_in_group")
            if not isinstance(g, int) or g <= 0 or heads % g:
                raise SpecError(
                    f"{where}: block_configs[{i}].attention.n_heads_in_group must divide "
                    f"the {heads} heads, got {g!r}"
                )
            kv, win = heads // g, _n(a, "window_length", f"{where}: block_configs[{i}].attention")
            mixer = "sliding" if win else "full"
        if f.get("no_op"):
            mlp, inter = "none", 0
        elif f.get("replace_with_linear"):
            mlp, inter = "proj", 0
        else:
            mult = f.get("ffn_mult")
            if f.get("intermediate_size"):
                inter = _n(f, "intermediate_size", f"{where}: block_configs[{i}].ffn")
            elif isinstance(mult, int | float) and mult > 0:
                inter = decilm_intermediate(float(mult), hidden)
            else:
                raise SpecError(f"{where}: block_configs[{i}].ffn.ffn_mult must be > 0")
            mlp = "dense"
        out.append(LayerSpec(mixer, kv, win, mlp, inter))
    return out


def mixers(cfg: dict[str, Any], layers: int, where: str) -> list[tuple[str, int]] | None:
    """(mixer, window) per layer, or None for a uniform full-attention stack."""
    window = _n(cfg, "sliding_window", where)
    lt = cfg.get("layer_types")
    if isinstance(lt, list):
        if len(lt) != layers:
            raise SpecError(f"{where}: layer_types has {len(lt)} entries for {layers} layers")
        out = []
        for i, t in enumerate(lt):
            kind = _LAYER_TYPES.get(str(t).lower())
            if kind is None:
                raise SpecError(f"{where}: layer_types[{i}] {t!r} is not a known layer type")
            w = _n(cfg, "attention_chunk_size", where) if kind == "chunked" else window
            if kind in ("sliding", "chunked") and not w:
                raise SpecError(f"{where}: layer_types[{i}] is {t!r} but no window size is set")
            out.append((kind, w if kind in ("sliding", "chunked") else 0))
        return out
    interval = cfg.get("full_attention_interval")
    if interval and "linear_num_value_heads" in cfg:
        n = _n(cfg, "full_attention_interval", where, 1)
        return [("full", 0) if (i + 1) % n == 0 else ("linear", 0) for i in range(layers)]
    chunk = _n(cfg, "attention_chunk_size", where)
    if chunk:
        nope = cfg.get("no_rope_layers")
        if not isinstance(nope, list) or len(nope) != layers:
            step = _n(cfg, "no_rope_layer_interval", where, 4)
            nope = [int((i + 1) % step != 0) for i in range(layers)]
        return [("chunked", chunk) if r else ("full", 0) for r in nope]
    pattern = cfg.get("sliding_window_pattern")
    if window and isinstance(pattern, int) and pattern > 0:
        return [
            ("full", 0) if (i + 1) % pattern == 0 else ("sliding", window) for i in range(layers)
        ]
    if window and cfg.get("use_sliding_window", True) is not False:
        first = _n(cfg, "max_window_layers", where) if "use_sliding_window" in cfg else 0
        return [("sliding", window) if i >= first else ("full", 0) for i in range(layers)]
    return None


def moe_layers(cfg: dict[str, Any], layers: int, where: str) -> tuple[int, ...]:
    """Indices of the layers whose MLP is an MoE block."""
    freq = cfg.get("moe_layer_freq")
    if isinstance(freq, list):
        if len(freq) != layers:
            raise SpecError(f"{where}: moe_layer_freq has {len(freq)} entries for {layers} layers")
        return tuple(i for i, f in enumerate(freq) if f)
    first = _n(cfg, "first_k_dense_replace", where)
    if "first_k_dense_replace" in cfg or "moe_layer_freq" in cfg:
        step = _n(cfg, "moe_layer_freq", where, 1)
        return tuple(i for i in range(first, layers) if i % step == 0)
    if cfg.get("interleave_moe_layer_step"):
        step = _n(cfg, "interleave_moe_layer_step", where, 1)
        return tuple(i for i in range(layers) if (i + 1) % step == 0)
    step = _n(cfg, "decoder_sparse_step", where, 1)
    only_mlp = cfg.get("mlp_only_layers") or []
    if not isinstance(only_mlp, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in only_mlp
    ):
        raise SpecError(f"{where}: field 'mlp_only_layers' must be a list of layer indices")
    only_mlp = set(only_mlp)
    return tuple(i for i in range(layers) if (i + 1) % step == 0 and i not in only_mlp)


def layer_specs(
    cfg: dict[str, Any],
    *,
    layers: int,
    heads: int,
    kv_heads: int,
    hidden: int,
    intermediate: int,
    moe_idx: tuple[int, ...],
    dense_beside_moe: bool,
    where: str,
) -> tuple[LayerSpec, ...]:
    """Per-layer specs (empty tuple when the stack is uniform full attention)."""
    if (
        isinstance(cfg.get("block_configs"), list)
        and cfg["block_configs"]
        and isinstance(
            cfg["block_configs"][0].get("attention")
            if isinstance(cfg["block_configs"][0], dict)
            else None,
            dict,
        )
    ):
        specs = _decilm(cfg, heads, hidden, where)
        if len(specs) != layers:
            raise SpecError(f"{where}: block_configs has {len(specs)} entries for {layers} layers")
        return tuple(specs)
    pat = cfg.get("hybrid_override_pattern")
    if isinstance(pat, str):
        if len(pat) != layers:
            raise SpecError(
                f"{where}: hybrid_override_pattern has {len(pat)} layers, "
                f"num_hidden_layers {layers}"
            )
        table = {
            "M": ("linear", "none"),
            "*": ("full", "none"),
            "-": ("none", "dense"),
            "E": ("none", "moe"),
        }
        if set(pat) - set(table):
            raise SpecError(
                f"{where}: hybrid_override_pattern has unknown symbols {set(pat) - set(table)}"
            )
        return tuple(
            LayerSpec(table[c][0], kv_heads, 0, table[c][1], intermediate if c == "-" else 0)
            for c in pat
        )
    mix = mixers(cfg, layers, where)
    moe = set(moe_idx)
    if mix is None and not dense_beside_moe:
        return ()
    mix = mix or [("full", 0)] * layers
    # Gemma-4: the full-attention layers have their own head width and KV heads
    g_dim = _n(cfg, "global_head_dim", where) if isinstance(cfg.get("layer_types"), list) else 0
    g_kv = _n(cfg, "num_global_key_value_heads", where, kv_heads)
    k_eq_v = bool(cfg.get("attention_k_eq_v")) and bool(g_dim)
    out = []
    for i, (kind, win) in enumerate(mix):
        if i in moe:
            mlp, inter = "moe", intermediate if dense_beside_moe else 0
        else:
            mlp, inter = "dense", intermediate
        if kind == "full" and g_dim:
            out.append(LayerSpec(kind, g_kv, 0, mlp, inter, head_dim=g_dim, k_eq_v=k_eq_v))
            continue
        out.append(LayerSpec(kind, kv_heads if kind != "linear" else 0, win, mlp, inter))
    return tuple(out)
