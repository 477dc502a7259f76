"""Units, dtypes and errors: the base everything else uses."""

import pytest

from perfmodel import units
from perfmodel.dtypes import get_dtype
from perfmodel.errors import SpecError


def test_int4_is_half_a_byte_not_zero() -> None:
    # llm-analysis shipped BYTES_INT4 = 4 // 8 == 0; ours is a float.
    assert get_dtype("int4").bytes == 0.5
    assert get_dtype("bfloat16").bytes == 2.0
    assert get_dtype("float8").name == "fp8"


def test_unknown_dtype_lists_valid_ones() -> None:
    with pytest.raises(SpecError, match="valid: fp32, tf32, bf16"):
        get_dtype("fp7")


def test_binary_and_decimal_prefixes_differ() -> None:
    # 80 GiB is 7.4% more than 80 GB: mixing them is the classic capacity error.
    assert 80 * units.GiB == 85_899_345_920
    assert 80 * units.GiB / (80 * units.GIGA) == pytest.approx(1.073741824)
    assert units.from_ms(250) == pytest.approx(0.25)
    assert units.gbit_per_s_to_bytes_per_s(400) == 50e9
