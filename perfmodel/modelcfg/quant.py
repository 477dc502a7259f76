"""``quantization_config`` of a checkpoint -> weight formats per module and the math dtype.

Recognised methods: ``fp8`` (DeepSeek / Qwen block FP8), ``compressed-tensors``
(int4 / int8 / fp8 / nvfp4 groups with an ``ignore`` list), ``mxfp4`` (gpt-oss),
``modelopt`` (FP8 / NVFP4), ``awq`` and ``gptq`` (4/8-bit integer weights, 16-bit math).
Modules a method leaves out (``ignore``, ``modules_to_not_convert``, ``exclude_modules``)
keep the checkpoint's ``torch_dtype``; the embedding and LM head always do.
Anything else is reported, never guessed: ``parse_quantization`` returns warnings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from perfmodel.dtypes import MODULES, ModuleDTypes, get_dtype
from perfmodel.errors import SpecError

#: a representative weight name per module kind, as vLLM / HF name them
_PROBES = {
    "attention": ("model.layers.1.self_attn.q_proj", "model.layers.1.self_attn.o_proj"),
    "dense_mlp": ("model.layers.0.mlp.gate_proj", "model.layers.0.mlp.down_proj"),
    "shared_experts": (
        "model.layers.1.mlp.shared_experts.gate_proj",
        "model.layers.1.mlp.shared_expert.down_proj",
    ),
    "routed_experts": ("model.layers.1.mlp.experts.0.gate_proj", "model.layers.1.mlp.experts"),
}
_MARKERS = {
    "attention": ("self_attn", "attention", "attn"),
    "dense_mlp": ("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "mlp.gate_up_proj"),
    "shared_experts": ("shared_expert",),
    "routed_experts": ("experts.", ".experts"),
}


@dataclass(frozen=True)
class Quantization:
    """What a checkpoint's ``quantization_config`` says."""

    method: str
    weights: ModuleDTypes
    act_dtype: str  # the math / activation format the method implies
    embedding_dtype: str  # embedding and LM head (never quantized by these methods)

    def describe(self) -> str:
        return f"{self.method}: weights {self.weights.describe()}, math {self.act_dtype}"


def _excluded(module: str, ignore: list[str]) -> bool:
    """Whether the method's exclusion list leaves ``module`` in the base dtype."""
    for pat in ignore:
        if not isinstance(pat, str):
            continue
        if pat.startswith("re:"):
            rx = re.compile(pat[3:])
            if any(rx.match(p) for p in _PROBES[module]):
                return True
        elif module == "routed_experts":
            if pat.endswith(("experts", "experts.*")) and "shared" not in pat:
                return True
        elif module == "dense_mlp":
            if any(m in pat for m in _MARKERS[module]) and "expert" not in pat:
                return True
        elif any(m in pat for m in _MARKERS[module]) and (
            module != "attention" or "expert" not in pat
        ):
            return True
    return False


def _ct_dtype(weights: dict[str, Any], where: str) -> str:
    bits = weights.get("num_bits")
    kind = str(weights.get("type", "int")).lower()
    if kind == "float" and bits == 8:
        return "fp8"
    if kind == "float" and bits == 4:
        return "nvfp4" if weights.get("group_size") in (16, None) else "mxfp4"
    if kind == "int" and bits in (4, 8):
        return f"int{bits}"
    raise SpecError(f"{where}: quantization_config weights {bits}-bit {kind} is not modelled")


def parse_quantization(
    cfg: dict[str, Any], *, base: str, where: str
) -> tuple[Quantization | None, list[str]]:
    """Per-module weight formats from ``cfg['quantization_config']`` (``base``: the
    checkpoint's ``torch_dtype``). Returns the result and warnings."""
    q = cfg.get("quantization_config")
    if not isinstance(q, dict):
        return None, []
    method = str(q.get("quant_method", "")).lower()
    warns: list[str] = []
    ignore: list[str] = list(
        q.get("ignore") or q.get("modules_to_not_convert") or q.get("exclude_modules") or []
    )
    act = base
    if method == "fp8":
        w = "fp8"
        act = "fp8" if q.get("activation_scheme", "dynamic") in ("dynamic", "static") else base
    elif method == "compressed-tensors":
        groups = q.get("config_groups") or {}
        if not groups:
            raise SpecError(f"{where}: quantization_config.config_groups is empty")
        g = next(iter(groups.values()))
        w = _ct_dtype(g.get("weights") or {}, where)
        ia = g.get("input_activations")
        if isinstance(ia, dict) and ia.get("num_bits") in (4, 8):
            act = _ct_dtype(ia, where)
        if len(groups) > 1:
            warns.append(
                f"quantization_config.config_groups: {len(groups)} groups; "
                f"only the first ({w}) is modelled"
            )
    elif method == "mxfp4":
        w = "mxfp4"
    elif method == "modelopt":
        algo = str(q.get("quant_algo", "")).upper()
        if algo not in ("FP8", "NVFP4"):
            raise SpecError(f"{where}: quantization_config.quant_algo {algo!r} is not modelled")
        w = algo.lower()
        act = w
    elif method in ("awq", "gptq"):
        bits = int(q.get("bits") or q.get("w_bit") or 4)
        if bits not in (4, 8):
            raise SpecError(f"{where}: quantization_config.bits {bits} is not modelled")
        w = f"int{bits}"
    else:
        warns.append(
            f"quantization_config.quant_method {method!r} is not modelled; "
            f"weights counted in {base}"
        )
        return None, warns
    per = {m: (base if _excluded(m, ignore) else w) for m in MODULES}
    if act != base and get_dtype(per["attention"]).name == get_dtype(base).name:
        act = base  # the math stays 16-bit where the attention is not quantized
    weights = ModuleDTypes(**per, embedding=base)
    return Quantization(method, weights, get_dtype(act).name, base), warns
