"""Per-layer operators of a transformer iteration, with FLOPs and bytes per device.

``layer_ops`` lists what one iteration executes on one device of a tensor-parallel
group: each ``Op`` carries the FLOPs and HBM bytes of one execution (numpy arrays,
vectorized over batches), how many times it runs per iteration (``count``: layers of
that kind) and how many kernels it launches. Communication ops carry the bytes each
device contributes to a collective instead. Nothing here computes a time.

Assumptions, stated once:

* Linear layers are GEMMs over all tokens of the step (see ``hardware.roofline``).
* Attention is fused (FlashAttention-style): K/V of each sequence are read once per
  step; the score matrix never reaches HBM.
* MLA decode uses the absorbed form (scores against the 512+64 latent); MLA prefill the
  expanded form.
* MoE routing is uniform when costing a whole model: with ``T`` tokens and top-``k``
  of ``E`` experts, ``E·(1 - (1 - k/E)^T)`` experts are activated on average, each with
  ``T·k / G`` tokens padded to the kernel's row tile (``hardware.roofline.padded_rows``).
  Skewed routing and expert-parallel dispatch are modeled in ``solvers.dispatch``.
* Norms, activation, residual adds and RoPE are one elementwise group per layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from hardware.roofline import gemm_flops, gemm_flops_bytes, padded_rows
from perfmodel.memory import layer_kv_elems_per_device
from perfmodel.model import LayerSpec, ModelSpec
from perfmodel.moe.distinct import distinct_experts_uniform
from perfmodel.moe.ep_comm import ep_bytes_per_gpu
from perfmodel.moe.expert import expert_weight_elems
from perfmodel.plan import ParallelPlan
from perfmodel.step.batch import Batch
from perfmodel.step.structure import mean_mlp_width, mixer_groups, mlp_structure

Arr = NDArray[np.float64]
OpKind = Literal["compute", "comm"]


@dataclass(frozen=True)
class Op:
    """One operator of an iteration on one device."""

    name: str
    kind: OpKind
    flops: Arr  # per execution
    bytes: Arr  # HBM bytes per execution (compute) or bytes per device (comm)
    count: int  # executions per iteration (layers)
    kernels: float = 1.0
    collective: str = ""
    dtype: str = ""  # math format of a compute op when not the plan's act_dtype
    unpadded_flops: Arr | None = None  # FLOPs without GEMM row-tile padding
    weight_elems: Arr | float | None = None  # weight elements a GEMM streams per execution


def _gemm(name: str, m: Arr, n: float, k: float, plan: ParallelPlan, count: int, module: str) -> Op:
    f, b = gemm_flops_bytes(
        m, n, k, act_bytes=plan.act_bytes, weight_bytes=plan.weight_bytes_of(module)
    )
    return Op(name, "compute", f, b, count, unpadded_flops=gemm_flops(m, n, k), weight_elems=n * k)


def _allreduce(name: str, tokens: Arr, model: ModelSpec, plan: ParallelPlan, count: int) -> Op:
    return Op(
        name,
        "comm",
        np.zeros_like(tokens),
        tokens * model.hidden * plan.act_bytes,
        count,
        collective="all_reduce",
    )


def _attention_group(
    model: ModelSpec,
    plan: ParallelPlan,
    batch: Batch,
    ls: LayerSpec,
    L: int,
    sfx: str,
    decode_kv_reads: float = 1.0,
) -> list[Op]:
    """One group of ``L`` identical attention layers (full, sliding or chunked).

    ``decode_kv_reads``: times a decode step reads each cached K/V element (1 when the
    query heads of a group share one read; the engine's ``Engine.decode_kv_reads``)."""
    t = plan.tp
    h = model.hidden
    T = batch.tokens
    heads = model.heads / t
    kv_elems = layer_kv_elems_per_device(model, ls, t)
    ops: list[Op] = []
    if model.mla:
        m = model.mla
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        if m.q_lora_rank:
            ops.append(_gemm("q_a_proj" + sfx, T, m.q_lora_rank, h, plan, L, "attention"))
            ops.append(_gemm("q_b_proj" + sfx, T, heads * qk, m.q_lora_rank, plan, L, "attention"))
        else:
            ops.append(_gemm("q_proj" + sfx, T, heads * qk, h, plan, L, "attention"))
        ops.append(
            _gemm(
                "kv_a_proj" + sfx, T, m.kv_lora_rank + m.qk_rope_head_dim, h, plan, L, "attention"
            )
        )
        ops.append(
            _gemm(
                "kv_b_proj" + sfx,
                T,
                heads * (m.qk_nope_head_dim + m.v_head_dim),
                m.kv_lora_rank,
                plan,
                L,
                "attention",
            )
        )
        decode_pair_flops = 2 * heads * (2 * m.kv_lora_rank + m.qk_rope_head_dim)
        prefill_pair_flops = 2 * heads * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim)
        q_elems = heads * (m.kv_lora_rank + m.qk_rope_head_dim)
        o_in = heads * m.v_head_dim
    else:
        d = model.layer_head_dim(ls)
        q_out = heads * d * (2 if model.attn_output_gate else 1)
        ops.append(_gemm("qkv_proj" + sfx, T, q_out + kv_elems, h, plan, L, "attention"))
        decode_pair_flops = prefill_pair_flops = 4 * heads * d
        q_elems = heads * d
        o_in = heads * d
    softmax_flops = 5 * heads
    sp = model.sparse_attn
    if ls.bounded or sp:
        win = ls.window if ls.bounded else sp.top_k  # type: ignore[union-attr]
        pairs, kv_read = batch.windowed(win, chunked=ls.mixer == "chunked")
        pre_pairs = (
            pairs - batch.decode_seqs - np.minimum(batch.decode_context, batch.decode_seqs * win)
        )
        dec_pairs = pairs - pre_pairs
    else:
        pre_pairs = batch.prefill_pairs
        dec_pairs = batch.decode_context + batch.decode_seqs
        kv_read = batch.kv_read_tokens
    attn_flops = pre_pairs * (prefill_pair_flops + softmax_flops) + dec_pairs * (
        decode_pair_flops + softmax_flops
    )
    # decode KV tokens (dec_pairs counts one more pair per decoding request) read again
    # by every query head of a group that does not share the read
    kv_read = kv_read + (decode_kv_reads - 1.0) * (dec_pairs - batch.decode_seqs)
    attn_bytes = (
        kv_read * kv_elems * plan.kv_bytes  # read the cache
        + T * kv_elems * plan.kv_bytes  # append this step's K/V
        + 2 * T * q_elems * plan.act_bytes  # read Q, write O
    )
    ops.append(Op("attention" + sfx, "compute", attn_flops, attn_bytes, L))
    if sp:  # DSA lightning indexer: scores every cached token, in the KV format
        ops.append(
            _gemm(
                "dsa_index_q" + sfx,
                T,
                sp.index_heads * sp.index_dim / t,
                (model.mla.q_lora_rank if model.mla else 0) or h,
                plan,
                L,
                "attention",
            )
        )
        idx_flops = 2 * (batch.attn_pairs) * sp.index_heads * sp.index_dim / t
        idx_bytes = batch.kv_read_tokens * sp.index_dim * plan.kv_bytes
        ops.append(Op("dsa_indexer" + sfx, "compute", idx_flops, idx_bytes, L))
    ops.append(_gemm("o_proj" + sfx, T, h, o_in, plan, L, "attention"))
    return ops


def _linear_group(model: ModelSpec, plan: ParallelPlan, batch: Batch, L: int) -> list[Op]:
    """``L`` recurrent layers (Gated DeltaNet / Mamba-2): projections, the recurrent
    update over the state of every sequence (read + written once per step), out_proj."""
    la = model.linear_attn
    assert la is not None  # a linear layer implies its dimensions (ModelSpec checks)
    t = plan.tp
    h = model.hidden
    T = batch.tokens
    sh = la.shards(t)
    v = la.v_heads * la.v_dim
    if la.kind == "gdn":
        proj_in = 2 * la.k_heads * la.k_dim + 2 * v + 2 * la.v_heads
    else:
        proj_in = 2 * v + 2 * la.groups * la.k_dim + la.v_heads
    seqs = batch.prefill_seqs + batch.decode_seqs
    flops = T * la.flops_per_token() / sh
    bytes_ = 2 * seqs * la.state_bytes(plan.kv_bytes) / sh + 2 * T * proj_in / sh * plan.act_bytes
    return [
        _gemm("linear_in_proj", T, proj_in / sh, h, plan, L, "attention"),
        Op("linear_attention", "compute", flops, bytes_, L, kernels=2.0),
        _gemm("linear_out_proj", T, h, v / sh, plan, L, "attention"),
    ]


def attention_ops(
    model: ModelSpec, plan: ParallelPlan, batch: Batch, *, decode_kv_reads: float = 1.0
) -> list[Op]:
    """Token mixers of every layer on one device, grouped by kind (names suffixed per
    kind: ``_swa`` sliding, ``_chunked``, ``_w<kv>`` for minority KV widths). With
    attention data parallelism each device serves ``1/dp`` of the batch."""
    b = batch.scaled(1 / plan.dp)
    ops: list[Op] = []
    groups, mixers = mixer_groups(model)
    for (kind, kv, win, d, k_eq_v), n, sfx in groups:
        if kind == "linear":
            ops += _linear_group(model, plan, b, n)
        elif kind == "proj":
            ops.append(
                _gemm(
                    "attn_linear" + sfx, b.tokens, model.hidden, model.hidden, plan, n, "attention"
                )
            )
        else:
            ls = LayerSpec(kind, kv, win, head_dim=d, k_eq_v=k_eq_v)
            ops += _attention_group(model, plan, b, ls, n, sfx, decode_kv_reads)
    if plan.tp > 1 and mixers:
        ops.append(_allreduce("attn_allreduce", b.tokens, model, plan, mixers))
    return ops


def _experts_op(model: ModelSpec, plan: ParallelPlan, tokens: Arr, nm: int) -> Op:
    """Routed experts of one device: ``E/ep`` experts, each sharded ``tp·dp/ep`` ways,
    serving its ``1/ep`` of the stage's ``T·k`` routed rows (uniform routing)."""
    assert model.moe is not None
    moe = model.moe
    E, k = moe.num_experts, moe.top_k
    up = 2 if model.gated_mlp else 1
    inter = moe.expert_intermediate / plan.expert_tp
    active = distinct_experts_uniform(E, k, tokens) / plan.ep
    rows = tokens * k / plan.ep
    per_expert = np.where(active > 0, rows / np.maximum(active, 1e-12), 0.0)
    padded = active * padded_rows(per_expert)
    expert_w = expert_weight_elems(model.hidden, inter, up + 1)
    flops = gemm_flops(padded, expert_w, 1.0)
    bytes_ = (
        active * expert_w * plan.weight_bytes_of("routed_experts")
        + rows * (2 * model.hidden + 2 * up * inter) * plan.act_bytes
    )
    return Op(
        "moe_experts",
        "compute",
        flops,
        bytes_,
        nm,
        kernels=2.0,
        unpadded_flops=gemm_flops(rows, expert_w, 1.0),
        weight_elems=active * expert_w,
    )


def ep_alltoall_ops(model: ModelSpec, plan: ParallelPlan, tokens: Arr, nm: int) -> list[Op]:
    """Expert-parallel dispatch and combine of ``nm`` MoE layers: each device sends its
    ``T/(tp·dp)`` tokens × top-k × hidden (DeepSeek ISCA'25 §2.3.2) in the activation
    format, costed as an all-to-all over the ``ep`` group."""
    if plan.ep == 1 or model.moe is None:
        return []
    per_dev = ep_bytes_per_gpu(
        tokens / (plan.tp * plan.dp), model.moe.top_k, model.hidden, plan.act_bytes
    )
    z = np.zeros_like(per_dev)
    return [
        Op("ep_dispatch", "comm", z, per_dev, nm, collective="all_to_all"),
        Op("ep_combine", "comm", z, per_dev, nm, collective="all_to_all"),
    ]


def mlp_ops(model: ModelSpec, plan: ParallelPlan, batch: Batch) -> list[Op]:
    t = plan.tp
    h = model.hidden
    T = batch.tokens / plan.dp  # rows of one attention-DP rank (dense parts)
    ops: list[Op] = []
    up = 2 if model.gated_mlp else 1
    dense, n_proj, n_mlp = mlp_structure(model)
    for (_, width, *_), n, sfx in dense:
        ops.append(_gemm("mlp_up" + sfx, T, up * width / t, h, plan, n, "dense_mlp"))
        ops.append(_gemm("mlp_down" + sfx, T, h, width / t, plan, n, "dense_mlp"))
    if n_proj:
        ops.append(_gemm("mlp_linear", T, h, h, plan, n_proj, "dense_mlp"))
    if model.moe:
        moe = model.moe
        nm = model.n_moe_layers
        ops.append(_gemm("router", T, moe.num_experts, h, plan, nm, "other"))
        ops += ep_alltoall_ops(model, plan, batch.tokens, nm)[:1]
        ops.append(_experts_op(model, plan, batch.tokens, nm))
        ops += ep_alltoall_ops(model, plan, batch.tokens, nm)[1:]
        if moe.shared_intermediate:
            sh = moe.shared_intermediate / t
            ops.append(_gemm("shared_up", T, up * sh, h, plan, nm, "shared_experts"))
            ops.append(_gemm("shared_down", T, h, sh, plan, nm, "shared_experts"))
    if t > 1 and n_mlp:
        ops.append(_allreduce("mlp_allreduce", T, model, plan, n_mlp))
    return ops


def elementwise_op(model: ModelSpec, plan: ParallelPlan, batch: Batch) -> Op:
    """Norms, residual adds, activation, RoPE: ~10 hidden-width passes + 3 MLP-width
    (the mean MLP width over the layers: dense width, or top-k experts + shared)."""
    T = batch.tokens / plan.dp
    elems = T * (10 * model.hidden + 3 * mean_mlp_width(model) / plan.tp)
    return Op("elementwise", "compute", elems, elems * plan.act_bytes, model.layers, kernels=4.0)


def head_ops(model: ModelSpec, plan: ParallelPlan, batch: Batch) -> list[Op]:
    """Embedding lookup and the (vocab-parallel) LM head for the rows that need logits."""
    rows = batch.logit_rows / plan.dp
    emb_bytes = batch.tokens / plan.dp * model.hidden * plan.act_bytes * 2
    ops = [
        Op("embedding", "compute", np.zeros_like(emb_bytes), emb_bytes, 1),
        _gemm("lm_head", rows, model.vocab / plan.tp, model.hidden, plan, 1, "embedding"),
    ]
    if plan.tp > 1:
        ops.append(
            Op(
                "logits_gather",
                "comm",
                np.zeros_like(rows),
                rows * model.vocab * plan.act_bytes,
                1,
                collective="all_gather",
            )
        )
    return ops


def layer_ops(
    model: ModelSpec, plan: ParallelPlan, batch: Batch, *, decode_kv_reads: float = 1.0
) -> list[Op]:
    """Every operator of one iteration on one device, in execution order."""
    head = head_ops(model, plan, batch)
    ops = [
        *head[:1],
        *attention_ops(model, plan, batch, decode_kv_reads=decode_kv_reads),
        *mlp_ops(model, plan, batch),
        elementwise_op(model, plan, batch),
        *head[1:],
    ]
    from perfmodel.step.dequant import dequant_op  # builds on Op: imported here, no cycle

    dq = dequant_op(ops, plan, batch.tokens / plan.dp)
    return [*ops, dq] if dq is not None else ops
