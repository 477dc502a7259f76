"""Model specs: built from a Hugging Face ``config.json`` or the built-in catalog.

Parameter counts, active parameters and KV bytes are derived here, once, from the
architecture fields -- never typed in twice. Supported: dense MHA/GQA (Llama, Qwen,
Mistral, OPT), MLA (DeepSeek-V2/V3, Kimi-K2) with DSA sparse attention (DeepSeek-V3.2),
MoE with routed + shared experts, per-layer MoE patterns and a dense MLP beside the
experts (Mixtral, Qwen-MoE, DeepSeek, Llama-4, Gemma-4), per-layer heterogeneous stacks
(DeciLM / Nemotron ``block_configs``), sliding-window and chunked local attention, and
hybrid stacks with recurrent layers (Gated DeltaNet, Mamba-2) whose state is per
sequence. Config parsing lives in ``perfmodel.modelcfg``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from perfmodel import datafile
from perfmodel.datafile import read_data_file
from perfmodel.dtypes import get_dtype
from perfmodel.errors import SpecError
from perfmodel.modelcfg.layers import MLA, LayerSpec, LinearAttn, MoE, SparseAttn
from perfmodel.modelcfg.quant import Quantization

__all__ = ["MLA", "LayerSpec", "LinearAttn", "MoE", "ModelSpec", "SparseAttn", "load_model"]


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer's architecture.

    ``layer_specs`` describes each layer when the stack is not uniform (empty: every
    layer is full attention with ``kv_heads`` and a dense MLP of ``intermediate``, or
    MoE on ``moe.moe_layers``); ``layer_plan`` always gives the per-layer view.
    """

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
    layer_specs: tuple[LayerSpec, ...] = ()
    linear_attn: LinearAttn | None = None
    sparse_attn: SparseAttn | None = None
    attn_output_gate: bool = False  # Qwen3-Next: q_proj also emits a per-head output gate
    mtp_layers: int = 0  # multi-token-prediction modules shipped with the checkpoint
    mtp_own_embedding: bool = True  # each MTP module stores its own embedding and head
    quantization: Quantization | None = None  # what quantization_config says
    published_params: float | None = None
    published_active_params: float | None = None
    sources: tuple[str, ...] = ()
    warnings: tuple[str, ...] = field(default=(), compare=False)
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
        if self.layer_specs:
            if len(self.layer_specs) != self.layers:
                raise SpecError(
                    f"{where}: {len(self.layer_specs)} per-layer entries for "
                    f"{self.layers} layers (num_hidden_layers)"
                )
            moe_idx = tuple(i for i, ls in enumerate(self.layer_specs) if ls.mlp == "moe")
            if moe_idx != (self.moe.moe_layers if self.moe else ()):
                raise SpecError(f"{where}: per-layer MoE entries disagree with moe_layers")
            if any(ls.mixer == "linear" for ls in self.layer_specs) and not self.linear_attn:
                raise SpecError(f"{where}: linear-attention layers need their dimensions")

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

    @cached_property
    def layer_plan(self) -> tuple[LayerSpec, ...]:
        """Every layer's mixer and MLP (derived for uniform stacks; computed once)."""
        if self.layer_specs:
            return self.layer_specs
        moe = set(self.moe.moe_layers) if self.moe else set()
        dense = LayerSpec("full", self.kv_heads, 0, "dense", self.intermediate)
        sparse = LayerSpec("full", self.kv_heads, 0, "moe", 0)
        return tuple(sparse if i in moe else dense for i in range(self.layers))

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
    def layer_head_dim(self, ls: LayerSpec) -> int:
        """Head width of one attention layer (its own, else the model's)."""
        return ls.head_dim or self.head_dim

    def attn_params_per_layer(
        self, kv_heads: int | None = None, head_dim: int = 0, k_eq_v: bool = False
    ) -> int:
        """One attention layer (``kv_heads`` and ``head_dim`` default to the model's;
        ``k_eq_v``: no V projection)."""
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
            idx = self.sparse_attn.params(h, m.q_lora_rank) if self.sparse_attn else 0
            return q + kv + self.attn_out_dim * h + idx
        d = head_dim or self.head_dim
        kv_dim = (kv_heads or self.kv_heads) * d
        q_dim = self.heads * d
        kv_mats = 1 if k_eq_v else 2
        q_out = q_dim * (2 if self.attn_output_gate else 1)
        p = h * q_out + kv_mats * h * kv_dim + q_dim * h
        if self.attn_bias:
            p += q_dim + kv_mats * kv_dim + (h if self.family == "opt" else 0)
        return p

    def mixer_params(self, ls: LayerSpec) -> int:
        if ls.is_attention:
            return self.attn_params_per_layer(ls.kv_heads, ls.head_dim, ls.k_eq_v)
        if ls.mixer == "linear":
            assert self.linear_attn is not None  # checked on construction
            return self.linear_attn.params(self.hidden)
        return self.hidden * self.hidden if ls.mixer == "proj" else 0

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

    def _norm_params(self, ls: LayerSpec) -> int:
        """The pre-norms of one layer: one per sub-block that exists (a DeciLM no-op
        attention or FFN, and the absent half of a Nemotron-H layer, have none)."""
        blocks = (ls.mixer != "none") + (ls.mlp != "none")
        n = blocks * self.hidden * (2 if self.family == "opt" else 1)  # OPT LayerNorm has bias
        if self.family in ("qwen3", "qwen3_moe") and ls.is_attention:
            n += 2 * self.layer_head_dim(ls)  # q_norm, k_norm
        return n

    def param_groups(self, *, active: bool = False) -> dict[str, int]:
        """Parameters by module kind (keys of ``ModuleDTypes`` + ``embedding``, ``other``).

        ``active``: routed experts count ``top_k`` per MoE layer instead of all.
        """
        g = dict.fromkeys(
            ("embedding", "attention", "dense_mlp", "shared_experts", "routed_experts", "other"),
            0,
        )
        g["embedding"] = self.embedding_params()
        g["other"] = self.hidden  # final norm
        for ls in self.layer_plan:
            g["attention"] += self.mixer_params(ls)
            g["other"] += self._norm_params(ls)
            if ls.mlp in ("dense", "moe") and ls.intermediate:
                g["dense_mlp"] += self.mlp_params(ls.intermediate)
            elif ls.mlp == "proj":
                g["dense_mlp"] += self.hidden * self.hidden
            if ls.mlp == "moe":
                assert self.moe is not None
                m = self.moe
                g["routed_experts"] += (m.top_k if active else m.num_experts) * self.expert_params()
                g["other"] += self.hidden * m.num_experts  # router
                if m.shared_intermediate:
                    g["shared_experts"] += self.mlp_params(m.shared_intermediate)
        return g

    @property
    def params(self) -> int:
        """Total parameters of the main model (embedding and LM head included, MTP not)."""
        return sum(self.param_groups().values())

    @property
    def active_params(self) -> int:
        """Parameters touched per token (top-k routed + shared experts)."""
        return sum(self.param_groups(active=True).values())

    @property
    def mtp_params(self) -> int:
        """Weights of the multi-token-prediction modules: per module one decoder layer
        like the last, the 2h→h projection, three norms and, as DeepSeek-V3 checkpoints
        store them, its own copy of the embedding and LM head (Qwen3-Next / Qwen3.5 MTP
        shares the main model's: ``mtp_own_embedding`` false). Not part of ``params``
        (model cards count them apart: DeepSeek-V3 671B + 14B)."""
        if not self.mtp_layers:
            return 0
        last = self.layer_plan[-1]
        one = replace(self, layer_specs=(last,), layers=1, moe=self._moe_for_one(last))
        layer = one.params - one.embedding_params() - self.hidden
        extra = 2 * self.hidden * self.hidden + 3 * self.hidden
        if self.mtp_own_embedding:
            extra += self.embedding_params()
        return self.mtp_layers * (layer + extra)

    def _moe_for_one(self, ls: LayerSpec) -> MoE | None:
        if self.moe is None or ls.mlp != "moe":
            return None
        return replace(self.moe, moe_layers=(0,))

    def weight_bytes(self, dtype: str = "bf16") -> float:
        return self.params * get_dtype(dtype).bytes

    # ---- KV cache and recurrent state --------------------------------------------------
    def layer_kv_elems(self, ls: LayerSpec) -> int:
        """Cached elements per token of one layer: 2·n_kv·d (GQA; n_kv·d when K = V) or
        d_c + d_R (MLA latent), plus the DSA indexer key; 0 for recurrent and no-op
        layers."""
        if not ls.is_attention:
            return 0
        if self.mla:
            idx = self.sparse_attn.index_dim if self.sparse_attn else 0
            return self.mla.kv_lora_rank + self.mla.qk_rope_head_dim + idx
        kv = 1 if ls.k_eq_v else 2  # Gemma-4 global layers cache one unified K = V
        return kv * ls.kv_heads * self.layer_head_dim(ls)

    def kv_elems_per_token_per_layer(self) -> int:
        """Cached elements per token of a full-attention layer with the model's KV heads."""
        return self.layer_kv_elems(LayerSpec("full", self.kv_heads))

    def kv_bytes_per_token(self, dtype: str = "bf16") -> float:
        """KV bytes per token of the layers whose cache grows with the context (full
        attention), whole model, no TP sharding. Windowed layers and recurrent state are
        per sequence: ``kv_bytes_per_sequence``."""
        elems = sum(self.layer_kv_elems(ls) for ls in self.layer_plan if not ls.bounded)
        return elems * get_dtype(dtype).bytes

    def state_bytes_per_sequence(self, dtype: str = "bf16") -> float:
        """Recurrent state of one sequence over all linear-attention layers."""
        la = self.linear_attn
        if la is None:
            return 0.0
        n = sum(1 for ls in self.layer_plan if ls.mixer == "linear")
        return n * la.state_bytes(get_dtype(dtype).bytes)

    def kv_bytes_per_sequence(self, context_len: int, dtype: str = "bf16") -> float:
        """Cache of one sequence of ``context_len`` tokens: growing layers ·context,
        windowed layers ·min(context, window), plus the recurrent state."""
        b = get_dtype(dtype).bytes
        bounded = sum(
            self.layer_kv_elems(ls) * min(context_len, ls.window)
            for ls in self.layer_plan
            if ls.bounded
        )
        return (
            self.kv_bytes_per_token(dtype) * context_len
            + bounded * b
            + self.state_bytes_per_sequence(dtype)
        )

    def kv_shards(self, tp: int) -> int:
        """Into how many distinct pieces TP splits the KV cache of a token.

        GQA KV heads are split over TP ranks (replicated when tp > kv_heads); the MLA
        latent is shared by all heads, so every rank keeps the whole latent.
        """
        if self.mla:
            return 1
        return min(tp, self.kv_heads)

    def to_dict(self) -> dict[str, object]:
        """The JSON of ``perfmodel model show`` (``perfmodel.modelcfg.summary``)."""
        from perfmodel.modelcfg.summary import model_summary

        return model_summary(self)

    @cached_property
    def _attention_kv_heads(self) -> tuple[int, ...]:
        """The distinct KV-head counts of the attention layers, ascending."""
        kvs = {ls.kv_heads for ls in self.layer_plan if ls.is_attention} or {self.kv_heads}
        return tuple(sorted(kvs))

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
        for kv in self._attention_kv_heads:
            if not self.mla and kv % tp and tp % kv:
                raise SpecError(
                    f"tp={tp} neither divides nor is a multiple of the {kv} KV heads of {self.id}"
                )
        la = self.linear_attn
        if la and (la.v_heads % tp or (la.k_heads and la.k_heads % tp)):
            raise SpecError(
                f"tp={tp} does not divide the {la.k_heads} key / {la.v_heads} value heads of "
                f"the linear-attention layers of {self.id}"
            )

    def valid_tps(self, tps: Sequence[int]) -> list[int]:
        """The degrees of ``tps`` that :meth:`check_tp` accepts, in order."""
        return [tp for tp in tps if self._tp_ok(tp)]

    def _tp_ok(self, tp: int) -> bool:
        try:
            self.check_tp(tp)
        except SpecError:
            return False
        return True


# ---- construction from config.json --------------------------------------------------------


def model_from_config(cfg: dict[str, Any], *, id: str = "", where: str = "") -> ModelSpec:
    """Build a ModelSpec from a Hugging Face config dict (or our catalog's TOML table)."""
    from perfmodel.modelcfg.arch import check_architecture
    from perfmodel.modelcfg.parse import spec_fields

    check_architecture(cfg, where=where or f"model {id or cfg.get('_name_or_path') or 'custom'!r}")
    return ModelSpec(**spec_fields(cfg, id=id, where=where))


def load_model_file(path: str | Path) -> ModelSpec:
    """A model from a user's ``config.json`` (or a catalog-style ``.toml``)."""
    p = Path(path)
    cfg = read_data_file(p, what="model config")
    return model_from_config(cfg, id=str(cfg.get("id") or p.stem), where=str(p))


def model_ids() -> list[str]:
    return datafile.catalog_ids("perfmodel.catalog")


def load_model(id_or_path: str | Path) -> ModelSpec:
    """A built-in model by id, or a ``config.json`` path."""
    s = str(id_or_path)
    if s.endswith((".json", ".toml")) or "/" in s or Path(s).is_file():
        return load_model_file(s)
    return datafile.load_catalog_entry(
        "perfmodel.catalog", s, load_model_file, kind="model", other="a config.json"
    )
