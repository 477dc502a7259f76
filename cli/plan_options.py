"""Options shared by the commands that build a plan: formats per module, EP and DP.

``--dtype`` sets every weight; ``--expert-dtype`` / ``--attn-dtype`` override the
routed experts / attention; unset options take the checkpoint's ``quantization_config``
and the device's native formats (``perfmodel.plan.resolve_precision``).
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

DtypeOpt = Annotated[
    str | None,
    typer.Option(
        "--dtype",
        help="Weight dtype of every module (bf16 fp16 fp8 int8 int4 nvfp4 mxfp4); "
        "default: the checkpoint's quantization_config, else bf16.",
    ),
]
ActDtypeOpt = Annotated[
    str | None,
    typer.Option(help="Math/activation dtype (default: the checkpoint's, if the device has it)."),
]
KvDtypeOpt = Annotated[str | None, typer.Option(help="KV-cache dtype (default bf16).")]
ExpertDtypeOpt = Annotated[
    str | None, typer.Option(help="Routed-expert weight dtype (overrides --dtype for experts).")
]
AttnDtypeOpt = Annotated[
    str | None, typer.Option(help="Attention weight dtype (overrides --dtype for attention).")
]
EpOpt = Annotated[
    int,
    typer.Option(help="Expert parallelism: routed experts split over ep of the tp x dp devices."),
]
DpOpt = Annotated[
    int,
    typer.Option(help="Attention data parallelism: dp replicas of tp devices (tp x dp x pp)."),
]


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
