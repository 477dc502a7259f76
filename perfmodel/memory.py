"""Device memory: weights per device, KV-cache capacity, largest batch, and fit.

Capacity accounting (bytes are GiB-like counts from the device file):

    usable = hbm_bytes · gpu_memory_utilization           (vLLM default 0.90)
    kv     = usable − weights/device − activation reserve

The activation reserve is the peak activation footprint of one forward pass of
``max_batched_tokens`` tokens: ``tokens · (4·hidden + 2·mlp_width/tp + vocab/tp) ·
act_bytes`` (residual stream, Q/K/V, MLP intermediate, logits).
"""

from __future__ import annotations

from dataclasses import dataclass

from hardware.device import Device
from perfmodel.errors import SpecError
from perfmodel.model import ModelSpec
from perfmodel.ops import kv_elems_per_token_per_layer_per_device
from perfmodel.parallel import ParallelPlan
from perfmodel.units import GiB

DEFAULT_GPU_MEMORY_UTILIZATION = 0.90
DEFAULT_MAX_BATCHED_TOKENS = 8192
TP_CANDIDATES = (1, 2, 4, 8, 16, 32, 64)


def weight_bytes_per_device(model: ModelSpec, plan: ParallelPlan) -> float:
    """Weights one TP rank holds: everything sharded ``tp`` ways (norms are negligible)."""
    return model.params * plan.weight_bytes / plan.tp


def kv_bytes_per_token_per_device(model: ModelSpec, plan: ParallelPlan) -> float:
    """KV bytes one device stores per token (GQA heads sharded, MLA latent replicated)."""
    return model.layers * kv_elems_per_token_per_layer_per_device(model, plan.tp) * plan.kv_bytes


def activation_reserve_bytes(
    model: ModelSpec, plan: ParallelPlan, max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS
) -> float:
    width = model.intermediate
    if model.moe:
        width = max(width, model.moe.top_k * model.moe.expert_intermediate)
    per_token = 4 * model.hidden + 2 * width / plan.tp + model.vocab / plan.tp
    return max_batched_tokens * per_token * plan.act_bytes


@dataclass(frozen=True)
class MemoryFit:
    """How a model fits on ``tp`` devices: all bytes per device."""

    fits: bool
    capacity_bytes: float
    usable_bytes: float
    weight_bytes: float
    reserve_bytes: float
    kv_budget_bytes: float  # may be negative: the shortfall
    kv_bytes_per_token: float
    kv_capacity_tokens: int
    needed_bytes: float  # weights + reserve + KV of the requested batch
    shortfall_bytes: float  # > 0 when it does not fit
    min_tp: int | None  # smallest TP (same device, same dtypes) that fits; None if none

    def max_batch(self, context_len: int) -> int:
        """Largest number of concurrent requests that each hold ``context_len`` tokens."""
        if context_len <= 0:
            raise SpecError("context length must be positive")
        return max(0, self.kv_capacity_tokens // context_len)


def memory_fit(
    model: ModelSpec,
    device: Device,
    plan: ParallelPlan,
    *,
    batch: int = 1,
    context_len: int = 1,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS,
    search_tp: bool = True,
) -> MemoryFit:
    """Whether ``batch`` requests of ``context_len`` tokens fit, and the KV capacity."""
    if not 0 < gpu_memory_utilization <= 1:
        raise SpecError("gpu_memory_utilization must be in (0, 1]")
    model.check_tp(plan.tp)
    usable = device.hbm_bytes * gpu_memory_utilization
    w = weight_bytes_per_device(model, plan)
    reserve = activation_reserve_bytes(model, plan, max_batched_tokens)
    kv_tok = kv_bytes_per_token_per_device(model, plan)
    budget = usable - w - reserve
    cap = int(budget // kv_tok) if budget > 0 else 0
    needed = w + reserve + batch * context_len * kv_tok
    short = max(0.0, needed - usable)
    min_tp: int | None = plan.tp if short == 0 else None
    if short > 0 and search_tp:
        for t in TP_CANDIDATES:
            if t <= plan.tp:
                continue
            try:
                model.check_tp(t)
            except SpecError:
                continue
            f = memory_fit(
                model,
                device,
                ParallelPlan(t, plan.weight_dtype, plan.act_dtype, plan.kv_dtype),
                batch=batch,
                context_len=context_len,
                gpu_memory_utilization=gpu_memory_utilization,
                max_batched_tokens=max_batched_tokens,
                search_tp=False,
            )
            if f.fits:
                min_tp = t
                break
    return MemoryFit(
        fits=short == 0,
        capacity_bytes=device.hbm_bytes,
        usable_bytes=usable,
        weight_bytes=w,
        reserve_bytes=reserve,
        kv_budget_bytes=budget,
        kv_bytes_per_token=kv_tok,
        kv_capacity_tokens=cap,
        needed_bytes=needed,
        shortfall_bytes=short,
        min_tp=min_tp,
    )


def describe_shortfall(fit: MemoryFit, model: ModelSpec, device: Device, tp: int) -> str:
    """One sentence: by how much it does not fit, and what would."""
    msg = (
        f"{model.id} does not fit on {tp}x {device.id}: needs {fit.needed_bytes / GiB:.1f} GiB "
        f"per device, {fit.usable_bytes / GiB:.1f} GiB usable (short by "
        f"{fit.shortfall_bytes / GiB:.1f} GiB)"
    )
    if fit.min_tp:
        msg += f"; the smallest TP that fits is {fit.min_tp}"
    else:
        msg += "; no TP up to 64 fits -- use a lower-precision weight dtype or a larger device"
    return msg
