"""Numeric formats: bytes per element as a float (int4 is 0.5, not 4 // 8).

Block-scaled 4-bit floats carry their scales in ``bytes``: NVFP4 is E2M1 with one E4M3
scale per 16 elements (0.5 + 1/16 B), MXFP4 (OCP microscaling) E2M1 with one E8M0
scale per 32 (0.5 + 1/32 B); both compute at the device's ``fp4`` peak.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cache

from perfmodel.errors import SpecError


@dataclass(frozen=True)
class DType:
    """A numeric format. ``compute_key`` names the device peak used for math in it."""

    name: str
    bytes: float
    compute_key: str

    @property
    def kernel_key(self) -> str:
        """The engine kernel-efficiency class (``hardware/engines/*.toml [efficiency]``):
        formats that run the same kernels at the same peak share one entry."""
        return _KERNEL_CLASS.get(self.compute_key, self.compute_key)


#: bf16 and fp16 run the same tensor-core kernels at the same peak on every device family
#: modelled (A100/H100/B200, MI250/MI300X, Ascend 910B/C, Gaudi): one calibration serves both.
_KERNEL_CLASS = {"bf16": "fp16"}


_DTYPES: dict[str, DType] = {
    d.name: d
    for d in (
        DType("fp32", 4.0, "fp32"),
        DType("tf32", 4.0, "tf32"),
        DType("bf16", 2.0, "bf16"),
        DType("fp16", 2.0, "fp16"),
        DType("fp8", 1.0, "fp8"),
        DType("int8", 1.0, "int8"),
        DType("int4", 0.5, "int4"),
        DType("fp4", 0.5, "fp4"),
        DType("nvfp4", 0.5 + 1 / 16, "fp4"),
        DType("mxfp4", 0.5 + 1 / 32, "fp4"),
    )
}

_ALIASES = {
    "float32": "fp32",
    "float": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "e4m3": "fp8",
    "float8": "fp8",
    "fp8_e4m3": "fp8",
    "float8_e4m3fn": "fp8",
    "e2m1": "fp4",
}

DTYPE_NAMES: tuple[str, ...] = tuple(_DTYPES)


def get_dtype(name: str | DType) -> DType:
    """Look a dtype up by name or common alias (``bfloat16`` -> ``bf16``)."""
    if isinstance(name, DType):
        return name
    hit = _DTYPES.get(name)  # the canonical name: no normalising
    if hit is not None:
        return hit
    key = _ALIASES.get(name.strip().lower(), name.strip().lower())
    try:
        return _DTYPES[key]
    except KeyError:
        raise SpecError(f"unknown dtype {name!r}; valid: {', '.join(DTYPE_NAMES)}") from None


MODULES: tuple[str, ...] = ("attention", "dense_mlp", "shared_experts", "routed_experts")


@dataclass(frozen=True)
class ModuleDTypes:
    """Weight formats per module kind (embedding and LM head follow ``attention``)."""

    attention: str = "bf16"
    dense_mlp: str = "bf16"
    shared_experts: str = "bf16"
    routed_experts: str = "bf16"
    embedding: str = ""  # embedding and LM head; "" = as ``attention``

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if v or f.name != "embedding":
                object.__setattr__(self, f.name, get_dtype(v).name)

    @staticmethod
    @cache
    def uniform(dtype: str) -> ModuleDTypes:
        d = get_dtype(dtype).name
        return ModuleDTypes(d, d, d, d)

    def bytes_of(self, module: str) -> float:
        """Bytes per weight of ``module`` (a ``MODULES`` name, ``embedding`` or ``other``)."""
        name = getattr(self, module) if module in MODULES else self.embedding or self.attention
        return get_dtype(name).bytes

    @property
    def is_uniform(self) -> bool:
        return len({self.attention, self.dense_mlp, self.shared_experts, self.routed_experts}) == 1

    def describe(self) -> str:
        if self.is_uniform:
            return self.attention
        return ", ".join(f"{m} {getattr(self, m)}" for m in MODULES)
