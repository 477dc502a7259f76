"""Per-layer structure of a decoder stack and the formulas that depend on it.

A model is a stack of layers, each an attention-like mixer and an MLP-like block:

* mixer ``full`` (causal attention over the whole context), ``sliding`` (a window of
  the last ``window`` tokens), ``chunked`` (Llama-4 local attention: a query sees the
  keys of its own ``window``-token chunk), ``linear`` (a recurrent layer with a fixed
  state per sequence: Gated DeltaNet or Mamba-2), ``proj`` (DeciLM
  ``replace_with_linear``: one hidden x hidden matrix) or ``none`` (DeciLM no-op);
* MLP ``dense`` (width ``intermediate``), ``moe`` (routed experts, plus a dense MLP
  beside them when ``intermediate > 0``, Gemma-4), ``proj`` or ``none``.

Attention layers may differ in their KV heads (DeciLM ``n_heads_in_group``) and in their
head width (Gemma-4 global layers: ``global_head_dim``, ``num_global_key_value_heads``,
and ``attention_k_eq_v``: the keys also serve as values, no V projection).
"""

from __future__ import annotations

from dataclasses import dataclass

from perfmodel.dtypes import get_dtype

MIXERS = ("full", "sliding", "chunked", "linear", "proj", "none")
MLPS = ("dense", "moe", "proj", "none")
ATTENTION_MIXERS = ("full", "sliding", "chunked")


@dataclass(frozen=True)
class LayerSpec:
    """One decoder layer: its mixer and MLP kinds and their per-layer widths."""

    mixer: str = "full"
    kv_heads: int = 0  # K/V heads of an attention mixer
    window: int = 0  # tokens: the sliding window or the local-attention chunk
    mlp: str = "dense"
    intermediate: int = 0  # dense MLP width (beside the experts on an ``moe`` layer)
    head_dim: int = 0  # this layer's attention head width; 0 = the model's ``head_dim``
    k_eq_v: bool = False  # one K projection and cache also serve as V (Gemma-4 global)

    @property
    def is_attention(self) -> bool:
        return self.mixer in ATTENTION_MIXERS

    @property
    def bounded(self) -> bool:
        """Its KV stops growing at ``window`` tokens (sliding or chunked attention)."""
        return self.mixer in ("sliding", "chunked") and self.window > 0


@dataclass(frozen=True)
class LinearAttn:
    """A recurrent mixer's dimensions.

    ``kind`` ``gdn`` (Gated DeltaNet, Qwen3-Next/3.5): ``k_heads`` query/key heads of
    ``k_dim``, ``v_heads`` value heads of ``v_dim``; the state of one sequence is
    ``v_heads·k_dim·v_dim`` plus a causal-conv tail of ``(conv_kernel − 1)·(2·k_heads·k_dim
    + v_heads·v_dim)`` elements.  ``kind`` ``mamba2``: ``v_heads`` heads of ``v_dim``
    (``mamba_head_dim``), ``groups`` B/C groups of ``k_dim`` (``ssm_state_size``); state
    ``v_heads·v_dim·k_dim`` plus the conv tail ``(conv_kernel − 1)·(v_heads·v_dim +
    2·groups·k_dim)``.  ``state_dtype`` is the SSM state's format when the config fixes
    it (``mamba_ssm_dtype``), else the KV-cache dtype is used.
    """

    kind: str
    k_heads: int
    k_dim: int
    v_heads: int
    v_dim: int
    conv_kernel: int
    groups: int = 0
    state_dtype: str = ""

    @property
    def _conv_channels(self) -> int:
        if self.kind == "gdn":
            return 2 * self.k_heads * self.k_dim + self.v_heads * self.v_dim
        return self.v_heads * self.v_dim + 2 * self.groups * self.k_dim

    def params(self, hidden: int) -> int:
        """Weights of one layer (projections, conv, per-head decay/gates, output norm)."""
        v = self.v_heads * self.v_dim
        conv = self._conv_channels * self.conv_kernel
        if self.kind == "gdn":
            # in_proj_qkvz, in_proj_ba, conv1d, A_log + dt_bias, gated RMSNorm, out_proj
            k = self.k_heads * self.k_dim
            return (
                hidden * (2 * k + 2 * v)
                + hidden * 2 * self.v_heads
                + conv
                + 2 * self.v_heads
                + self.v_dim
                + v * hidden
            )
        # mamba2: in_proj (z, x, B, C, dt), conv1d (+bias), A_log, D, dt_bias, norm, out_proj
        in_proj = hidden * (2 * v + 2 * self.groups * self.k_dim + self.v_heads)
        return in_proj + conv + self._conv_channels + 3 * self.v_heads + v + v * hidden

    def state_elems(self) -> int:
        """Recurrent state of one sequence in one layer (SSM state + conv tail)."""
        return self._ssm_elems + self._conv_elems

    @property
    def _ssm_elems(self) -> int:
        return self.v_heads * self.v_dim * self.k_dim

    @property
    def _conv_elems(self) -> int:
        return (self.conv_kernel - 1) * self._conv_channels

    def state_bytes(self, cache_bytes: float) -> float:
        """Bytes of one sequence's state in one layer: the SSM state in ``state_dtype``
        when the config fixes it (vLLM's ``mamba_ssm_dtype``), the conv tail, like the
        KV cache, in ``cache_bytes`` per element."""
        ssm_b = get_dtype(self.state_dtype).bytes if self.state_dtype else cache_bytes
        return self._ssm_elems * ssm_b + self._conv_elems * cache_bytes

    def flops_per_token(self) -> int:
        """Recurrent update and read-out per token: ~6 FLOP per state element (decay,
        rank-1 update, delta correction, output)."""
        return 6 * self.v_heads * self.v_dim * self.k_dim

    def shards(self, tp: int) -> int:
        """TP splits the heads; the state is sharded ``min(tp, v_heads)`` ways."""
        return min(tp, self.v_heads)


@dataclass(frozen=True)
class SparseAttn:
    """Top-k sparse attention (DeepSeek DSA): each query attends ``top_k`` selected
    tokens, chosen by a lightning indexer of ``index_heads`` heads of ``index_dim``
    whose keys (``index_dim`` per token per layer) are cached beside the KV."""

    top_k: int
    index_heads: int
    index_dim: int

    def params(self, hidden: int, q_lora_rank: int) -> int:
        """Indexer weights: wq_b (from the query latent), wk + its norm, head weights."""
        q_in = q_lora_rank or hidden
        return (
            q_in * self.index_heads * self.index_dim
            + hidden * self.index_dim
            + 2 * self.index_dim
            + hidden * self.index_heads
        )


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
