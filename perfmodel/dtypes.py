"""Numeric formats: bytes per element as a float (int4 is 0.5, not 4 // 8)."""

from __future__ import annotations

from dataclasses import dataclass

from perfmodel.errors import SpecError


@dataclass(frozen=True)
class DType:
    """A numeric format. ``compute_key`` names the device peak used for math in it."""

    name: str
    bytes: float
    compute_key: str


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
}

DTYPE_NAMES: tuple[str, ...] = tuple(_DTYPES)


def get_dtype(name: str | DType) -> DType:
    """Look a dtype up by name or common alias (``bfloat16`` -> ``bf16``)."""
    if isinstance(name, DType):
        return name
    key = _ALIASES.get(name.strip().lower(), name.strip().lower())
    try:
        return _DTYPES[key]
    except KeyError:
        raise SpecError(f"unknown dtype {name!r}; valid: {', '.join(DTYPE_NAMES)}") from None
