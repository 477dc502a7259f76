"""Model specs: built from a Hugging Face ``config.json`` or the built-in catalog.

Parameter counts, active parameters and KV bytes are derived here, once, from the
architecture fields -- never typed in twice. Supported: dense MHA/GQA (Llama, Qwen,
Mistral, OPT), MLA (DeepSeek-V2/V3, Kimi-K2) and MoE with routed + shared experts and
leading dense layers (Mixtral, Qwen-MoE, DeepSeek, Llama-4).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from perfmodel.datafile import read_data_file
from perfmodel.dtypes import get_dtype
from perfmodel.errors import SpecError


@dataclass(frozen=True)
class MLA:
    """Multi-head latent attention dimensions (DeepSeek-V2/V3)."""

    kv_lora_rank: int
    q_lora_rank: int  # 0 = no query compression
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class MoE:
    """Routed experts (+ optional always-on shared experts)."""

    num_experts: int
    top_k: int
    expert_intermediate: int
    shared_intermediate: int  # total intermediate width of the shared expert(s); 0 = none
    moe_layers: tuple[int, ...]  # indices of layers whose MLP is an MoE block


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer's architecture."""

    id: str
    name: str
    family: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    intermediate: int  # dense MLP width (dense layers)
    gated_mlp: bool = True
    tied_embeddings: bool = False
    attn_bias: bool = False
    mlp_bias: bool = False
    learned_pos_embeddings: int = 0  # OPT: rows of the learned position table
    mla: MLA | None = None
    moe: MoE | None = None
    published_params: float | None = None
    published_active_params: float | None = None
    sources: tuple[str, ...] = ()
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        where = f"model {self.id!r}"
        for name in ("hidden", "layers", "heads", "kv_heads", "head_dim", "vocab"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v > 0):
                raise SpecError(f"{where}: {name} must be a positive integer, got {v!r}")
        if self.heads % self.kv_heads:
            raise SpecError(
                f"{where}: num_attention_heads {self.heads} is not a multiple of "
                f"num_key_value_heads {self.kv_heads}"
            )
        if self.moe is not None:
            m = self.moe
            if not 0 < m.top_k <= m.num_experts:
                raise SpecError(f"{where}: need 0 < experts per token ({m.top_k}) <= experts")
            if any(not 0 <= i < self.layers for i in m.moe_layers):
                raise SpecError(f"{where}: MoE layer index out of range")

    # ---- structure -------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.moe is not None

    @property
    def n_moe_layers(self) -> int:
        return len(self.moe.moe_layers) if self.moe else 0

    @property
    def n_dense_layers(self) -> int:
        return self.layers - self.n_moe_layers

    @property
    def q_dim(self) -> int:
        """Width of the concatenated query heads (attention output before o_proj)."""
        if self.mla:
            return self.heads * (self.mla.qk_nope_head_dim + self.mla.qk_rope_head_dim)
        return self.heads * self.head_dim

    @property
    def attn_out_dim(self) -> int:
        return self.heads * (self.mla.v_head_dim if self.mla else self.head_dim)

    # ---- parameter counts ------------------------------------------------------------
    def attn_params_per_layer(self) -> int:
        h = self.hidden
        if self.mla:
            m = self.mla
            qk = m.qk_nope_head_dim + m.qk_rope_head_dim
            if m.q_lora_rank:
                q = h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * self.heads * qk
            else:
                q = h * self.heads * qk
            kv = (
                h * (m.kv_lora_rank + m.qk_rope_head_dim)
                + m.kv_lora_rank
                + m.kv_lora_rank * self.heads * (m.qk_nope_head_dim + m.v_head_dim)
            )
            return q + kv + self.attn_out_dim * h
        kv_dim = self.kv_heads * self.head_dim
        p = h * self.q_dim + 2 * h * kv_dim + self.q_dim * h
        if self.attn_bias:
            p += self.q_dim + 2 * kv_dim + (h if self.family == "opt" else 0)
        return p

    def mlp_params(self, intermediate: int) -> int:
        mats = 3 if self.gated_mlp else 2
        p = mats * self.hidden * intermediate
        if self.mlp_bias:
            p += intermediate + self.hidden
        return p

    def expert_params(self) -> int:
        """Parameters of one routed expert."""
        if not self.moe:
            return 0
        return self.mlp_params(self.moe.expert_intermediate)

    def embedding_params(self) -> int:
        emb = self.vocab * self.hidden + self.learned_pos_embeddings * self.hidden
        head = 0 if self.tied_embeddings else self.vocab * self.hidden
        return emb + head

    def _norm_params_per_layer(self) -> int:
        n = 2 * self.hidden * (2 if self.family == "opt" else 1)  # OPT LayerNorm has bias
        if self.family in ("qwen3", "qwen3_moe"):
            n += 2 * self.head_dim  # q_norm, k_norm
        return n

    def _moe_layer_params(self, active: bool) -> int:
        assert self.moe is not None
        m = self.moe
        n_exp = m.top_k if active else m.num_experts
        p = n_exp * self.expert_params() + self.hidden * m.num_experts  # router
        if m.shared_intermediate:
            p += self.mlp_params(m.shared_intermediate)
        return p

    def _count(self, active: bool) -> int:
        per_layer = self.attn_params_per_layer() + self._norm_params_per_layer()
        total = self.layers * per_layer + self.embedding_params() + self.hidden
        total += self.n_dense_layers * self.mlp_params(self.intermediate)
        if self.moe:
            total += self.n_moe_layers * self._moe_layer_params(active)
        return total

    @property
    def params(self) -> int:
        """Total parameters (embedding and LM head included)."""
        return self._count(active=False)

    @property
    def active_params(self) -> int:
        """Parameters touched per token (top-k routed + shared experts)."""
        return self._count(active=True)

    def weight_bytes(self, dtype: str = "bf16") -> float:
        return self.params * get_dtype(dtype).bytes

    # ---- KV cache ----------------------------------------------------------------------
    def kv_elems_per_token_per_layer(self) -> int:
        """Cached elements per token per layer: 2·n_kv·d (GQA) or d_c + d_R (MLA latent)."""
        if self.mla:
            return self.mla.kv_lora_rank + self.mla.qk_rope_head_dim
        return 2 * self.kv_heads * self.head_dim

    def kv_bytes_per_token(self, dtype: str = "bf16") -> float:
        """KV-cache bytes per token over all layers (whole model, no TP sharding)."""
        return self.layers * self.kv_elems_per_token_per_layer() * get_dtype(dtype).bytes

    def kv_shards(self, tp: int) -> int:
        """Into how many distinct pieces TP splits the KV cache of a token.

        GQA KV heads are split over TP ranks (replicated when tp > kv_heads); the MLA
        latent is shared by all heads, so every rank keeps the whole latent.
        """
        if self.mla:
            return 1
        return min(tp, self.kv_heads)

    def check_tp(self, tp: int) -> None:
        """Raise SpecError unless tensor parallelism ``tp`` divides the heads evenly."""
        if not (isinstance(tp, int) and tp >= 1):
            raise SpecError(f"--tp must be a positive integer, got {tp!r}")
        if self.heads % tp:
            valid = [t for t in range(1, self.heads + 1) if self.heads % t == 0 and t <= 64]
            raise SpecError(
                f"tp={tp} does not divide the {self.heads} attention heads of {self.id}; "
                f"valid tp: {', '.join(map(str, valid))}"
            )
        if not self.mla and self.kv_heads % tp and tp % self.kv_heads:
            raise SpecError(
                f"tp={tp} neither divides nor is a multiple of the {self.kv_heads} KV heads "
                f"of {self.id}"
            )


# ---- construction from config.json --------------------------------------------------------


def _get(cfg: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for k in keys:
        if k in cfg and cfg[k] is not None:
            return cfg[k]
    return default


def _int(cfg: dict[str, Any], where: str, *keys: str, default: int | None = None) -> int:
    v = _get(cfg, *keys, default=default)
    if v is None:
        raise SpecError(f"{where}: missing field {keys[0]!r}")
    if (
        isinstance(v, bool)
        or not isinstance(v, int | float)
        or not math.isfinite(v)
        or v != int(v)
        or not 0 <= v <= MAX_CONFIG_INT
    ):
        raise SpecError(
            f"{where}: field {keys[0]!r} must be an integer in [0, {MAX_CONFIG_INT}], got {v!r}"
        )
    return int(v)


#: Largest size field a config may hold (2**31: beyond every published model by far).
MAX_CONFIG_INT = 2**31

_ENCODER_ONLY = {
    "bert", "roberta", "xlm-roberta", "distilbert", "albert", "electra", "deberta",
    "deberta-v2", "modernbert", "camembert", "mpnet", "ernie", "nomic_bert",
}  # fmt: skip
_SSM = {"mamba", "mamba2", "falcon_mamba", "jamba", "zamba", "zamba2", "bamba", "nemotron_h"}
_ATTENTION_LAYER_TYPES = {"full_attention", "sliding_attention", "attention", "chunked_attention"}


def check_architecture(cfg: dict[str, Any], *, where: str) -> None:
    """Refuse what the model would get wrong: it models decoder-only transformers.

    Encoder-only and encoder-decoder models (no autoregressive decode, no KV cache growth),
    state-space (Mamba) layers and linear-attention layers (constant state, not a KV cache
    per token) are refused with the reason, rather than modelled as attention.
    """
    family = str(cfg.get("model_type", "")).lower()
    archs = cfg.get("architectures") or []
    archs = [str(a) for a in archs] if isinstance(archs, list) else [str(archs)]
    if family in _ENCODER_ONLY or any(a.endswith("ForMaskedLM") for a in archs):
        raise SpecError(
            f"{where}: model_type {family!r} is encoder-only; perfmodel models decoder-only "
            "LLMs (autoregressive decode with a KV cache), not encoders"
        )
    if cfg.get("is_encoder_decoder") is True or family in ("t5", "mt5", "bart", "mbart", "umt5"):
        raise SpecError(
            f"{where}: {family or 'this model'} is an encoder-decoder; perfmodel models "
            "decoder-only LLMs"
        )
    ssm_keys = [k for k in ("ssm_cfg", "mamba_d_state", "attn_layer_period", "layers_block_type",
                            "hybrid_override_pattern", "mamba_expand") if k in cfg]  # fmt: skip
    if family in _SSM or ssm_keys:
        raise SpecError(
            f"{where}: {family or 'this model'} has state-space (Mamba) layers"
            f"{' (' + ', '.join(ssm_keys) + ')' if ssm_keys else ''}; perfmodel models "
            "attention layers only and would treat them as attention with a KV cache"
        )
    lt = cfg.get("layer_types")
    if isinstance(lt, list):
        other = sorted({str(t) for t in lt} - _ATTENTION_LAYER_TYPES)
        if other:
            n = sum(str(t) in other for t in lt)
            raise SpecError(
                f"{where}: {n} of {len(lt)} layers are {', '.join(other)} (layer_types); "
                "perfmodel models softmax-attention layers only (their constant-size state "
                "is not a KV cache per token)"
            )


def model_from_config(cfg: dict[str, Any], *, id: str = "", where: str = "") -> ModelSpec:
    """Build a ModelSpec from a Hugging Face config dict (or our catalog's TOML table)."""
    if "text_config" in cfg and isinstance(cfg["text_config"], dict):
        cfg = {**cfg, **cfg["text_config"]}
    mid = id or str(cfg.get("id") or cfg.get("_name_or_path") or "custom")
    where = where or f"model {mid!r}"
    check_architecture(cfg, where=where)
    family = str(cfg.get("model_type", "")).lower()
    hidden = _int(cfg, where, "hidden_size", "d_model", "n_embd")
    layers = _int(cfg, where, "num_hidden_layers", "n_layer", "num_layers")
    heads = _int(cfg, where, "num_attention_heads", "n_head")
    kv_heads = _int(cfg, where, "num_key_value_heads", "n_kv_head", default=heads)
    if heads == 0 or hidden == 0 or layers == 0:
        raise SpecError(f"{where}: hidden_size, num_hidden_layers, num_attention_heads must be > 0")
    head_dim = _int(cfg, where, "head_dim", default=hidden // heads)
    vocab = _int(cfg, where, "vocab_size")
    act = str(_get(cfg, "hidden_act", "activation_function", default="silu")).lower()
    gated = act in ("silu", "swiglu", "gelu_pytorch_tanh", "geglu") and family != "opt"
    intermediate = _int(
        cfg, where, "intermediate_size_mlp", "intermediate_size", "ffn_dim", default=4 * hidden
    )
    if family.startswith(
        "llama4"
    ):  # dense layers use intermediate_size_mlp, experts intermediate_size
        intermediate = _int(cfg, where, "intermediate_size_mlp", "intermediate_size")

    mla = None
    if _get(cfg, "kv_lora_rank"):
        mla = MLA(
            kv_lora_rank=_int(cfg, where, "kv_lora_rank"),
            q_lora_rank=_int(cfg, where, "q_lora_rank", default=0),
            qk_nope_head_dim=_int(cfg, where, "qk_nope_head_dim"),
            qk_rope_head_dim=_int(cfg, where, "qk_rope_head_dim"),
            v_head_dim=_int(cfg, where, "v_head_dim"),
        )

    moe = None
    n_exp = _int(cfg, where, "n_routed_experts", "num_local_experts", "num_experts", default=0)
    if n_exp > 1:
        top_k = _int(cfg, where, "num_experts_per_tok", "num_experts_per_token", "top_k")
        if family.startswith("llama4"):
            e_int = _int(cfg, where, "intermediate_size")
        else:
            e_int = _int(cfg, where, "moe_intermediate_size", "intermediate_size")
        n_shared = _int(cfg, where, "n_shared_experts", default=0)
        shared = _int(cfg, where, "shared_expert_intermediate_size", default=n_shared * e_int)
        if family.startswith("llama4"):
            shared = e_int  # one shared expert of the routed size
        first_dense = _int(cfg, where, "first_k_dense_replace", default=0)
        step = (
            _int(
                cfg,
                where,
                "decoder_sparse_step",
                "interleave_moe_layer_step",
                "moe_layer_freq",
                default=1,
            )
            or 1
        )
        only_raw = _get(cfg, "mlp_only_layers", default=[]) or []
        if not isinstance(only_raw, list) or not all(isinstance(i, int) for i in only_raw):
            raise SpecError(f"{where}: field 'mlp_only_layers' must be a list of layer indices")
        only_mlp = set(only_raw)
        if family.startswith("llama4"):
            moe_layers = tuple(i for i in range(layers) if (i + 1) % step == 0)
        else:
            moe_layers = (
                tuple(
                    i
                    for i in range(layers)
                    if i >= first_dense and (i + 1) % step == 0 and i not in only_mlp
                )
                if family not in ("deepseek_v3", "deepseek_v2", "kimi_k2")
                else tuple(i for i in range(first_dense, layers) if (i - first_dense) % step == 0)
            )
        moe = MoE(n_exp, top_k, e_int, shared, moe_layers)

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
    mlp_bias = bool(_get(cfg, "mlp_bias", "enable_bias", default=False))
    published = cfg.get("published_params")
    published_active = cfg.get("published_active_params")
    return ModelSpec(
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
        mlp_bias=mlp_bias,
        learned_pos_embeddings=learned_pos,
        mla=mla,
        moe=moe,
        published_params=_opt_float(published, where, "published_params"),
        published_active_params=_opt_float(published_active, where, "published_active_params"),
        sources=tuple(str(s) for s in cfg.get("sources", ())),
        raw=cfg,
    )


def _opt_float(v: Any, where: str, key: str) -> float | None:
    if not v:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
        raise SpecError(f"{where}: field {key!r} must be a positive number, got {v!r}")
    return float(v)


def load_model_file(path: str | Path) -> ModelSpec:
    """A model from a user's ``config.json`` (or a catalog-style ``.toml``)."""
    p = Path(path)
    cfg = read_data_file(p, what="model config")
    return model_from_config(cfg, id=str(cfg.get("id") or p.stem), where=str(p))


def model_ids() -> list[str]:
    files = resources.files("perfmodel.catalog").iterdir()
    return sorted(f.name.removesuffix(".toml") for f in files if f.name.endswith(".toml"))


def load_model(id_or_path: str | Path) -> ModelSpec:
    """A built-in model by id, or a ``config.json`` path."""
    s = str(id_or_path)
    if s.endswith((".json", ".toml")) or "/" in s or Path(s).is_file():
        return load_model_file(s)
    ids = model_ids()
    if s not in ids:
        raise SpecError(f"unknown model id {s!r}; valid ids: {', '.join(ids)} (or a config.json)")
    ref = resources.files("perfmodel.catalog").joinpath(f"{s}.toml")
    with resources.as_file(ref) as p:
        return load_model_file(p)
