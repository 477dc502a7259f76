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
from perfmodel.memory import kv_elems_per_token_per_layer_per_device
from perfmodel.model import ModelSpec
from perfmodel.moe.distinct import distinct_experts_uniform
from perfmodel.moe.expert import expert_weight_elems
from perfmodel.plan import ParallelPlan
from perfmodel.step.batch import Batch

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


def _gemm(name: str, m: Arr, n: float, k: float, plan: ParallelPlan, count: int) -> Op:
    f, b = gemm_flops_bytes(m, n, k, act_bytes=plan.act_bytes, weight_bytes=plan.weight_bytes)
    return Op(name, "compute", f, b, count)


def _allreduce(name: str, tokens: Arr, model: ModelSpec, plan: ParallelPlan, count: int) -> Op:
    return Op(
        name,
        "comm",
        np.zeros_like(tokens),
        tokens * model.hidden * plan.act_bytes,
        count,
        collective="all_reduce",
    )


def attention_ops(model: ModelSpec, plan: ParallelPlan, batch: Batch) -> list[Op]:
    t = plan.tp
    h = model.hidden
    T = batch.tokens
    L = model.layers
    heads = model.heads / t
    kv_elems = kv_elems_per_token_per_layer_per_device(model, t)
    ops: list[Op] = []
    if model.mla:
        m = model.mla
        if m.q_lora_rank:
            ops.append(_gemm("q_a_proj", T, m.q_lora_rank, h, plan, L))
            ops.append(
                _gemm(
                    "q_b_proj",
                    T,
                    heads * (m.qk_nope_head_dim + m.qk_rope_head_dim),
                    m.q_lora_rank,
                    plan,
                    L,
                )
            )
        else:
            ops.append(
                _gemm("q_proj", T, heads * (m.qk_nope_head_dim + m.qk_rope_head_dim), h, plan, L)
            )
        ops.append(_gemm("kv_a_proj", T, m.kv_lora_rank + m.qk_rope_head_dim, h, plan, L))
        ops.append(
            _gemm(
                "kv_b_proj", T, heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank, plan, L
            )
        )
        decode_pair_flops = 2 * heads * (2 * m.kv_lora_rank + m.qk_rope_head_dim)
        prefill_pair_flops = 2 * heads * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim)
        q_elems = heads * (m.kv_lora_rank + m.qk_rope_head_dim)
        o_in = heads * m.v_head_dim
    else:
        d = model.head_dim
        ops.append(_gemm("qkv_proj", T, heads * d + kv_elems, h, plan, L))
        decode_pair_flops = prefill_pair_flops = 4 * heads * d
        q_elems = heads * d
        o_in = heads * d
    softmax_flops = 5 * heads
    pair_decode = batch.decode_context + batch.decode_seqs
    attn_flops = batch.prefill_pairs * (prefill_pair_flops + softmax_flops) + pair_decode * (
        decode_pair_flops + softmax_flops
    )
    attn_bytes = (
        batch.kv_read_tokens * kv_elems * plan.kv_bytes  # read the cache
        + T * kv_elems * plan.kv_bytes  # append this step's K/V
        + 2 * T * q_elems * plan.act_bytes  # read Q, write O
    )
    ops.append(Op("attention", "compute", attn_flops, attn_bytes, L))
    ops.append(_gemm("o_proj", T, h, o_in, plan, L))
    if t > 1:
        ops.append(_allreduce("attn_allreduce", T, model, plan, L))
    return ops


def mlp_ops(model: ModelSpec, plan: ParallelPlan, batch: Batch) -> list[Op]:
    t = plan.tp
    h = model.hidden
    T = batch.tokens
    ops: list[Op] = []
    up = 2 if model.gated_mlp else 1
    nd = model.n_dense_layers
    if nd:
        inter = model.intermediate / t
        ops.append(_gemm("mlp_up", T, up * inter, h, plan, nd))
        ops.append(_gemm("mlp_down", T, h, inter, plan, nd))
    if model.moe:
        moe = model.moe
        nm = model.n_moe_layers
        E, k = moe.num_experts, moe.top_k
        inter = moe.expert_intermediate / t
        ops.append(_gemm("router", T, E, h, plan, nm))
        active = distinct_experts_uniform(E, k, T)
        rows = T * k
        per_expert = np.where(active > 0, rows / np.maximum(active, 1e-12), 0.0)
        padded = active * padded_rows(per_expert)
        expert_w = expert_weight_elems(h, inter, up + 1)
        flops = gemm_flops(padded, expert_w, 1.0)
        bytes_ = (
            active * expert_w * plan.weight_bytes + rows * (2 * h + 2 * up * inter) * plan.act_bytes
        )
        ops.append(Op("moe_experts", "compute", flops, bytes_, nm, kernels=2.0))
        if moe.shared_intermediate:
            sh = moe.shared_intermediate / t
            ops.append(_gemm("shared_up", T, up * sh, h, plan, nm))
            ops.append(_gemm("shared_down", T, h, sh, plan, nm))
    if t > 1:
        ops.append(_allreduce("mlp_allreduce", T, model, plan, model.layers))
    return ops


def elementwise_op(model: ModelSpec, plan: ParallelPlan, batch: Batch) -> Op:
    """Norms, residual adds, activation, RoPE: ~10 hidden-width passes + 3 MLP-width."""
    T = batch.tokens
    width = (
        model.intermediate
        if not model.moe
        else (model.moe.top_k * model.moe.expert_intermediate + model.moe.shared_intermediate)
    )
    elems = T * (10 * model.hidden + 3 * width / plan.tp)
    return Op("elementwise", "compute", elems, elems * plan.act_bytes, model.layers, kernels=4.0)


def head_ops(model: ModelSpec, plan: ParallelPlan, batch: Batch) -> list[Op]:
    """Embedding lookup and the (vocab-parallel) LM head for the rows that need logits."""
    rows = batch.logit_rows
    emb_bytes = batch.tokens * model.hidden * plan.act_bytes * 2
    ops = [
        Op("embedding", "compute", np.zeros_like(emb_bytes), emb_bytes, 1),
        _gemm("lm_head", rows, model.vocab / plan.tp, model.hidden, plan, 1),
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


def layer_ops(model: ModelSpec, plan: ParallelPlan, batch: Batch) -> list[Op]:
    """Every operator of one iteration on one device, in execution order."""
    return [
        *head_ops(model, plan, batch)[:1],
        *attention_ops(model, plan, batch),
        *mlp_ops(model, plan, batch),
        elementwise_op(model, plan, batch),
        *head_ops(model, plan, batch)[1:],
    ]
