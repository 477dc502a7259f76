"""Building a plan from the format, EP and DP options (declared in ``cli.options``).

``--dtype`` sets every weight; ``--expert-dtype`` / ``--attn-dtype`` override the
routed experts / attention; unset options take the checkpoint's ``quantization_config``
and the device's native formats (``perfmodel.plan.resolve_precision``).
"""

from __future__ import annotations

from typing import Any

PLAN_KEYS = ("dtype", "act_dtype", "kv_dtype", "expert_dtype", "attn_dtype", "ep", "dp")


def plan_kw(options: dict[str, Any]) -> dict[str, Any]:
    """The plan options among a command's arguments (``plan_kw(locals())``)."""
    return {k: options[k] for k in PLAN_KEYS if k in options}


def build_plan(
    model: Any,
    device: Any,
    *,
    tp: int,
    pp: int = 1,
    ep: int = 1,
    dp: int = 1,
    dtype: str | None = None,
    act_dtype: str | None = None,
    kv_dtype: str | None = None,
    expert_dtype: str | None = None,
    attn_dtype: str | None = None,
) -> tuple[Any, Any]:
    """A ``ParallelPlan`` and the ``Precision`` that explains its formats."""
    from perfmodel.plan import ParallelPlan, resolve_precision

    prec = resolve_precision(
        model,
        device,
        dtype=dtype,
        act_dtype=act_dtype,
        kv_dtype=kv_dtype,
        expert_dtype=expert_dtype,
        attn_dtype=attn_dtype,
    )
    plan = ParallelPlan(
        tp,
        prec.weight_dtype,
        prec.act_dtype,
        prec.kv_dtype,
        pp=pp,
        ep=ep,
        dp=dp,
        modules=None if prec.weights.is_uniform and not prec.weights.embedding else prec.weights,
    )
    return plan, prec


def plan_label(plan: Any, device_id: str) -> str:
    """``8x h200-sxm`` or ``4x h200-sxm (TP1 x DP4, EP4)``."""
    parts = [f"TP{plan.tp}"]
    if plan.dp > 1:
        parts.append(f"DP{plan.dp}")
    if plan.pp > 1:
        parts.append(f"PP{plan.pp}")
    label = f"{plan.devices}x {device_id}"
    if len(parts) > 1 or plan.ep > 1:
        label += f" ({' x '.join(parts)}{f', EP{plan.ep}' if plan.ep > 1 else ''})"
    return label
