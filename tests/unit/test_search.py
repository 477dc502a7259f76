"""The one largest-rate bisection (perfmodel.serving.search.max_rate)."""

from __future__ import annotations

import pytest

from perfmodel.serving.search import max_rate


def test_max_rate_brackets_the_threshold_from_below() -> None:
    got = max_rate(lambda r: r < 3.7, 10.0, rel_tol=1e-6)
    assert got < 3.7 and got == pytest.approx(3.7, abs=1e-5)


def test_tolerance_is_relative_to_scale_or_to_the_current_upper_end() -> None:
    calls: list[float] = []

    def ok(r: float) -> bool:
        calls.append(r)
        return r < 0.3

    # scale fixed at 100: stop once the bracket is below 1 — ⌈log2(100/1)⌉ = 7 halvings
    assert max_rate(ok, 100.0, rel_tol=1e-2, scale=100.0) == 0.0
    assert len(calls) == 7


def test_lo_is_returned_when_nothing_above_it_passes() -> None:
    assert max_rate(lambda r: False, 8.0, lo=2.0) == 2.0
