"""The one largest-rate bisection and the one CDF-quantile bisection (perfmodel.serving.search)."""

from __future__ import annotations

import math

import pytest

from perfmodel.serving.search import cdf_quantile, max_rate


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


def test_cdf_quantile_of_the_exponential() -> None:
    # P(X <= x) = 1 - exp(-x): the 90th percentile is ln 10 = 2.302585...
    cdf = lambda x: 1.0 - math.exp(-x)  # noqa: E731
    assert cdf_quantile(cdf, 0.9, 0.0, 10.0, iterations=60) == pytest.approx(math.log(10), 1e-12)
    # a relative tolerance stops early, above the quantile and within the tolerance
    x = cdf_quantile(cdf, 0.9, 0.0, 10.0, iterations=60, rel_tol=1e-3)
    assert math.log(10) <= x <= math.log(10) / (1 - 1e-3)


def test_cdf_quantile_closes_a_smooth_bracket_in_few_evaluations() -> None:
    """False position: ln 10 to the last ulps in ≤ 14 CDF evaluations (halving: 55)."""
    calls: list[float] = []

    def cdf(x: float) -> float:
        calls.append(x)
        return 1.0 - math.exp(-x)

    x = cdf_quantile(cdf, 0.9, 0.0, 10.0, iterations=60)
    assert x == pytest.approx(math.log(10), rel=1e-15)  # cdf(x) ≥ 0.9 in floats
    assert len(calls) <= 14


def test_cdf_quantile_of_an_atom_is_the_atom() -> None:
    """A jump from 0.475 to 0.975 at 3: every quantile in between is 3 (from above)."""
    cdf = lambda x: 0.5 * (x >= 3.0) + 0.5 * (1.0 - math.exp(-x))  # noqa: E731
    for q in (0.6, 0.7, 0.95):
        x = cdf_quantile(cdf, q, 0.0, 10.0, iterations=60, rel_tol=1e-12)
        assert 3.0 <= x <= 3.0 * (1 + 1e-12)
