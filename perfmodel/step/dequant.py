"""Software dequantization: weights stored in a format the GEMM does not compute in.

A W8A16 / W4A16 kernel (or FP8 weights on a device without FP8 math) converts each
weight tile to the math format before the MMA; this is one more compute op of the step
(``weight_dequant``), at the device's vector (fp32) rate.
"""

from __future__ import annotations

import numpy as np

from perfmodel.dtypes import get_dtype
from perfmodel.plan import ParallelPlan
from perfmodel.step.ops import Arr, Op

#: conversion cost of a weight stored in a format the GEMM does not compute in
DEQUANT_FLOP_PER_WEIGHT = 1.0
DEQUANT_ROW_TILE = 128  # weight tiles are converted once per 128-row tile of tokens


def dequant_op(ops: list[Op], plan: ParallelPlan, tokens: Arr) -> Op | None:
    """Software dequantization of weights whose format is not the math format
    (W8A16 / W4A16 kernels, or FP8 weights on a device without FP8 math): each weight
    element read is converted once per 128-row tile of tokens, at about
    ``DEQUANT_FLOP_PER_WEIGHT`` FLOP on the vector (fp32) units, not overlapped with
    the GEMM (an upper bound for kernels that hide it behind the weight stream)."""
    act = get_dtype(plan.act_dtype).compute_key
    w = plan.weights
    names = {"attention": w.attention, "dense_mlp": w.dense_mlp}
    names |= {"shared_experts": w.shared_experts, "routed_experts": w.routed_experts}
    if all(get_dtype(d).compute_key == act for d in names.values()):
        return None
    t = np.asarray(tokens, dtype=np.float64)
    passes = np.maximum(np.ceil(t / DEQUANT_ROW_TILE), 1.0)
    conv = np.zeros_like(t)
    for op in ops:
        module = _op_module(op.name) if op.kind == "compute" else None
        if module is None or get_dtype(names[module]).compute_key == act:
            continue
        # weight elements streamed (bytes beyond the activations are weights)
        weights = np.asarray(op.weight_elems if op.weight_elems is not None else 0.0)
        conv = conv + op.count * weights * passes * DEQUANT_FLOP_PER_WEIGHT
    return Op("weight_dequant", "compute", conv, np.zeros_like(conv), 1, dtype="fp32")


def _op_module(name: str) -> str | None:
    if name.startswith("moe_experts"):
        return "routed_experts"
    if name.startswith("shared_"):
        return "shared_experts"
    if name.startswith("mlp_"):
        return "dense_mlp"
    if name.startswith(
        ("q_", "kv_", "qkv_proj", "o_proj", "attn_linear", "linear_in", "linear_out", "dsa_index_q")
    ):
        return "attention"
    return None
