"""Device-memory footprints of the pools that share one budget.

Weights, KV cache and the activation reserve come from :mod:`perfmodel.memory`; this
module adds what a cache budget needs on top:

* **Routed experts** as a separately accounted part of the weights, with expert
  parallelism (EP) and redundant replicas (EPLB-style), and offloading to host memory.

  - ``ep == 1``: experts are tensor-sharded ``tp`` ways like the dense MLP (vLLM's
    default, consistent with :func:`perfmodel.memory.weight_bytes_per_device`).
  - ``ep > 1``: every device holds whole experts, ``⌈(E + R)/ep⌉`` per MoE layer
    (``R`` redundant replicas per layer), as in DeepSeek-V3's EP serving.

* **One expert's bytes** at a precision: ``mats · hidden · expert_intermediate · w``
  (``mats`` = 3 for gated MLPs), e.g. Mixtral-8x7B: 3·4096·14336·2 B = 352 MB in BF16
  (formal_models.md §6.2).

* **A LoRA adapter's bytes**: ``Σ_{adapted matrices} r·(d_in + d_out)·w`` per layer,
  times the layers (formal_models.md §6.3; Llama-7B rank 16 on q,k,v,o:
  4·2·16·4096·32·2 B = 33.6 MB). GQA models have narrow ``k``/``v`` projections, so
  their adapters are smaller than the "square projections" rule of thumb.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from perfmodel.dtypes import get_dtype
from perfmodel.errors import SpecError
from perfmodel.memory import weight_bytes_per_device
from perfmodel.model import ModelSpec
from perfmodel.plan import ParallelPlan

LORA_TARGETS: tuple[str, ...] = ("q", "k", "v", "o", "gate", "up", "down")
DEFAULT_LORA_TARGETS: tuple[str, ...] = ("q", "k", "v", "o")
EXPERT_DTYPES: tuple[str, ...] = ("bf16", "fp16", "fp8", "int8", "int4")


def _moe(model: ModelSpec) -> tuple[int, int]:
    if model.moe is None:
        raise SpecError(f"{model.id} is not a mixture-of-experts model; pick an MoE model")
    return model.moe.num_experts, model.moe.top_k


def expert_bytes(model: ModelSpec, dtype: str = "bf16", *, tp: int = 1) -> float:
    """Bytes of one routed expert of one layer on one device (sharded ``tp`` ways).

    ``expert_params · bytes(dtype) / tp``; ``expert_params = mats·hidden·inter``.
    """
    _moe(model)
    if not (isinstance(tp, int) and tp >= 1):
        raise SpecError(f"tp must be a positive integer, got {tp!r}")
    return model.expert_params() * get_dtype(dtype).bytes / tp


def routed_expert_params(model: ModelSpec) -> int:
    """Parameters of all routed experts of all MoE layers."""
    n_exp, _ = _moe(model)
    return model.n_moe_layers * n_exp * model.expert_params()


@dataclass(frozen=True)
class WeightFootprint:
    """Weights one device holds, split into the dense part and the routed experts."""

    dense_bytes: float  # everything but the routed experts (attention, embeddings, shared)
    experts_per_layer: int  # routed experts (incl. replicas) resident per MoE layer
    expert_bytes: float  # one expert on this device
    moe_layers: int
    offloaded: bool  # routed experts live in host memory (only a cache is on device)

    @property
    def expert_pool_bytes(self) -> float:
        """All routed experts this device would hold if none were offloaded."""
        return self.moe_layers * self.experts_per_layer * self.expert_bytes

    @property
    def resident_bytes(self) -> float:
        """Bytes that must be on the device: dense weights, plus experts unless offloaded."""
        return self.dense_bytes + (0.0 if self.offloaded else self.expert_pool_bytes)


def weight_footprint(
    model: ModelSpec,
    plan: ParallelPlan,
    *,
    ep: int = 1,
    redundant_experts: int = 0,
    offload_experts: bool = False,
    expert_dtype: str | None = None,
) -> WeightFootprint:
    """Per-device weights with expert sharding, replication and offloading.

    ``dense = (params − routed expert params)·w/tp``; experts per layer ``E/1`` sharded
    ``tp`` ways (``ep == 1``) or ``⌈(E + R)/ep⌉`` whole experts (``ep > 1``).
    ``expert_dtype`` (default: the plan's weight dtype) is the precision experts are
    stored in on the device.
    """
    if not (isinstance(ep, int) and ep >= 1):
        raise SpecError(f"ep must be a positive integer, got {ep!r}")
    if redundant_experts < 0:
        raise SpecError(f"redundant experts must be >= 0, got {redundant_experts}")
    w_dtype = expert_dtype or plan.weight_dtype
    if model.moe is None:
        if ep > 1 or redundant_experts or offload_experts:
            raise SpecError(
                f"{model.id} is dense: expert parallelism, replicas and offloading need an "
                "MoE model"
            )
        return WeightFootprint(weight_bytes_per_device(model, plan), 0, 0.0, 0, False)
    n_exp = model.moe.num_experts
    dense = (model.params - routed_expert_params(model)) * plan.weight_bytes / plan.tp
    if ep == 1:
        if redundant_experts:
            raise SpecError("redundant expert replicas need ep > 1 (expert parallelism)")
        per_layer, e_bytes = n_exp, expert_bytes(model, w_dtype, tp=plan.tp)
    else:
        per_layer = math.ceil((n_exp + redundant_experts) / ep)
        e_bytes = expert_bytes(model, w_dtype, tp=1)
    return WeightFootprint(dense, per_layer, e_bytes, model.n_moe_layers, offload_experts)


# ---- LoRA adapters ------------------------------------------------------------------------


def _lora_shape(model: ModelSpec, target: str) -> tuple[int, int, int]:
    """(d_in, d_out, layers) of the matrix ``target`` adapts."""
    h = model.hidden
    if target in ("q", "o"):
        width = model.q_dim if target == "q" else model.attn_out_dim
        return (h, width, model.layers) if target == "q" else (width, h, model.layers)
    if target in ("k", "v"):
        if model.mla:
            raise SpecError(
                f"{model.id} uses latent attention (MLA): LoRA on k/v is not modeled; "
                "use --adapter-targets q,o"
            )
        return h, model.kv_heads * model.head_dim, model.layers
    # MLP targets: dense layers only (LoRA on routed experts is not modeled).
    if model.n_dense_layers == 0:
        raise SpecError(
            f"{model.id} has no dense MLP layers: LoRA on expert MLPs is not modeled; "
            "use attention targets q,k,v,o"
        )
    inter = model.intermediate
    if target == "down":
        return inter, h, model.n_dense_layers
    if target == "gate" and not model.gated_mlp:
        raise SpecError(f"{model.id} has no gate projection (ungated MLP); drop 'gate'")
    return h, inter, model.n_dense_layers


def lora_adapter_bytes(
    model: ModelSpec,
    rank: int,
    *,
    targets: tuple[str, ...] = DEFAULT_LORA_TARGETS,
    dtype: str = "bf16",
    tp: int = 1,
) -> float:
    """Bytes of one LoRA adapter on one device.

    ``Σ_targets r·(d_in + d_out)·layers·w / tp`` (A is ``d_in×r``, B is ``r×d_out``;
    S-LoRA shards both with the base weight's tensor parallelism).
    """
    if not (isinstance(rank, int) and rank >= 1):
        raise SpecError(f"adapter rank must be a positive integer, got {rank!r}")
    if not targets:
        raise SpecError("adapter targets must name at least one matrix, e.g. q,k,v,o")
    bad = [t for t in targets if t not in LORA_TARGETS]
    if bad:
        raise SpecError(
            f"unknown adapter target(s) {', '.join(bad)}; valid: {', '.join(LORA_TARGETS)}"
        )
    if len(set(targets)) != len(targets):
        raise SpecError("adapter targets are listed twice; name each matrix once")
    params = 0
    for t in targets:
        d_in, d_out, layers = _lora_shape(model, t)
        params += rank * (d_in + d_out) * layers
    return params * get_dtype(dtype).bytes / tp
