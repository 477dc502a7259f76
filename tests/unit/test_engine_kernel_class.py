"""bf16 and fp16 share one engine kernel-efficiency class (perfmodel.dtypes.kernel_key)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from hardware.engine import engine_from_dict, load_engine
from perfmodel.dtypes import get_dtype
from perfmodel.errors import SpecError

ENGINES = Path(__file__).resolve().parents[2] / "hardware" / "engines"


def test_kernel_classes() -> None:
    assert get_dtype("bf16").kernel_key == get_dtype("fp16").kernel_key == "fp16"
    assert get_dtype("bfloat16").kernel_key == "fp16"
    assert get_dtype("fp8").kernel_key == "fp8"
    assert get_dtype("nvfp4").kernel_key == "fp4"


def test_bf16_math_uses_the_calibrated_16_bit_entry() -> None:
    """The published tables are fp16; a bf16 model on the same device runs the same
    kernels, so it gets the fitted efficiencies and the calibrated accuracy note."""
    e = load_engine("trtllm")
    assert e.kernel_efficiency("h100-sxm", "bf16") == e.kernel_efficiency("h100-sxm", "fp16")
    assert e.kernel_efficiency("h100-sxm", "bf16") != e.default_efficiency
    assert e.is_calibrated("h100-sxm", "bf16")
    assert "uncalibrated" not in e.accuracy_note("h100-sxm", "bf16")
    assert not e.is_calibrated("h100-sxm", "int8")


def test_an_engine_file_listing_both_16_bit_floats_is_refused() -> None:
    data = tomllib.loads((ENGINES / "trtllm.toml").read_text())
    data["efficiency"]["hopper/bf16"] = dict(data["efficiency"]["hopper/fp16"])
    with pytest.raises(SpecError, match="bf16 and fp16 share one kernel class"):
        engine_from_dict(data)
