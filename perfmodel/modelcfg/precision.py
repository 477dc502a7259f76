"""Which formats a run uses: the checkpoint's, the user's overrides, what the device has.

Order of precedence per field: an explicit option; else the checkpoint's
``quantization_config`` (``ModelSpec.quantization``); else bf16. The math format must
be one the device computes in: when it was not asked for explicitly and the device
lacks it (FP8 on an A100, bf16 on an FPGA), the nearest native format is used and the
weights are converted in the kernel (``perfmodel.ops.dequant_op``). Every such choice
is reported in ``notes``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hardware.device import Device
from perfmodel.dtypes import ModuleDTypes, get_dtype
from perfmodel.errors import SpecError
from perfmodel.model import ModelSpec

#: fallbacks for a math format the device lacks, nearest first
_FALLBACK = ("bf16", "fp16", "fp8", "int8", "fp32")


@dataclass(frozen=True)
class Precision:
    """Formats of one run, and why."""

    weights: ModuleDTypes
    act_dtype: str
    kv_dtype: str
    notes: tuple[str, ...] = ()

    @property
    def weight_dtype(self) -> str:
        """The format of the bulk of the weights (routed experts on an MoE model)."""
        return self.weights.routed_experts

    def to_dict(self) -> dict[str, object]:
        w = self.weights
        return {
            "attention": w.attention,
            "dense_mlp": w.dense_mlp,
            "shared_experts": w.shared_experts,
            "routed_experts": w.routed_experts,
            "embedding": w.embedding or w.attention,
            "act": self.act_dtype,
            "kv": self.kv_dtype,
            "notes": list(self.notes),
        }


def resolve_precision(
    model: ModelSpec,
    device: Device,
    *,
    dtype: str | None = None,
    act_dtype: str | None = None,
    kv_dtype: str | None = None,
    expert_dtype: str | None = None,
    attn_dtype: str | None = None,
) -> Precision:
    """Formats for ``model`` on ``device`` (``None``: the default described above)."""
    notes: list[str] = []
    q = model.quantization
    if dtype is not None:
        w = ModuleDTypes.uniform(dtype)
    elif q is not None:
        w = q.weights
        notes.append(
            f"checkpoint quantization_config ({q.method}): weights {w.describe()} "
            f"(override with --dtype)"
        )
    else:
        w = ModuleDTypes.uniform("bf16")
    if expert_dtype is not None:
        w = replace(w, routed_experts=get_dtype(expert_dtype).name)
    if attn_dtype is not None:
        w = replace(w, attention=get_dtype(attn_dtype).name)
    if act_dtype is not None:
        act = get_dtype(act_dtype).name
        if not device.computes(act):
            raise SpecError(
                f"{device.id} has no {act} math (it computes in: "
                f"{', '.join(device.native_dtypes)}); choose --act-dtype among those"
            )
    else:
        want = q.act_dtype if (q is not None and dtype is None) else "bf16"
        act = want
        if not device.computes(want):
            act = next((d for d in _FALLBACK if device.computes(d)), "")
            if not act:
                raise SpecError(f"{device.id} computes in none of {', '.join(_FALLBACK)}")
            notes.append(
                f"{device.id} has no {want} math: computing in {act} "
                f"(its native formats: {', '.join(device.native_dtypes)})"
            )
    converted = sorted(
        {d for d in (w.attention, w.dense_mlp, w.shared_experts, w.routed_experts)}
        - {act}
        - ({d for d in _same_math(act)})
    )
    if converted:
        notes.append(
            f"weights in {', '.join(converted)} are dequantized to {act} in the kernel "
            f"(software conversion costed as weight_dequant)"
        )
    kv = get_dtype(kv_dtype or "bf16").name
    return Precision(w, act, kv, tuple(notes))


def _same_math(act: str) -> set[str]:
    key = get_dtype(act).compute_key
    return {
        d
        for d in ("fp32", "bf16", "fp16", "fp8", "int8", "int4", "fp4", "nvfp4", "mxfp4")
        if get_dtype(d).compute_key == key
    }
