"""The verdict rule and the claim-file format on synthetic outcomes (no models)."""

from __future__ import annotations

import pytest

from perfmodel.errors import SpecError
from reports.claims.schema import Stated, claim_from_dict
from reports.claims.verdict import (
    CONSISTENT,
    INCONSISTENT,
    NEEDS,
    NOT_CHECKABLE,
    Assumption,
    Outcome,
    judge,
)

BASE = {
    "id": "t",
    "paper": {"title": "T"},
    "quote": "q",
    "claim": {"quantity": "x", "relation": ">=", "value": 2.0, "tolerance": 0.0},
    "check": {"name": "memory"},
}


def _claim(**claim: object):
    return claim_from_dict({**BASE, "claim": {**BASE["claim"], **claim}})


def test_stated_relations() -> None:
    assert Stated("q", ">=", 2.0, tolerance=0.1).holds(1.8)
    assert not Stated("q", ">=", 2.0, tolerance=0.1).holds(1.79)
    assert Stated("q", "<=", 0.1, tolerance=0.0).holds(0.1)
    assert Stated("q", "~", 4.48, tolerance=0.15).holds(4.48 * 0.85)
    assert not Stated("q", "~", 4.48, tolerance=0.15).holds(4.48 * 0.84)
    assert Stated("q", "in", low=2, high=4, tolerance=0.1).holds(4.4)
    assert not Stated("q", "in", low=2, high=4, tolerance=0.1).holds(1.7)
    # an upper bound U makes "≈ v" possible iff v(1 − t) ≤ U
    assert Stated("q", "~", 3.64, tolerance=0.1).possible_under(3.3, "upper")
    assert not Stated("q", "~", 3.64, tolerance=0.1).possible_under(3.2, "upper")


def test_consistent_at_default() -> None:
    v = judge(_claim(), Outcome(value=2.5))
    assert v.verdict == CONSISTENT and v.value == 2.5


def test_needs_an_assumption_finds_the_threshold() -> None:
    # value = 1 + a; claim value ≥ 2 needs a ≥ 1 (default 0.5, range 0–3)
    a = Assumption("a", 0.5, 0.0, 3.0, points=7, refine=12)
    o = Outcome(value=1.5, assumptions=(a,), evaluate=lambda over: 1 + over["a"])
    v = judge(_claim(), o)
    assert v.verdict == NEEDS
    assert v.needed is not None
    assert v.needed["low"] == pytest.approx(1.0, abs=0.5 / 2**12 * 2)
    assert v.needed["high"] == 3.0
    assert "a ≥ 1" in v.explanation
    rows = {r["at"]: r for r in v.sensitivity}
    assert rows[3.0]["holds"] and not rows[0.0]["holds"]


def test_no_default_is_always_an_assumption() -> None:
    a = Assumption("alpha", None, 0.0, 1.0)
    o = Outcome(value=None, assumptions=(a,), evaluate=lambda over: 4 * over["alpha"])
    v = judge(_claim(), o)
    assert v.verdict == NEEDS and v.needed is not None
    assert v.needed["low"] == pytest.approx(0.5, abs=0.02)


def test_inconsistent_reports_the_best_value() -> None:
    a = Assumption("a", 0.5, 0.0, 0.9)
    o = Outcome(value=1.5, assumptions=(a,), evaluate=lambda over: 1 + over["a"])
    v = judge(_claim(), o)
    assert v.verdict == INCONSISTENT
    assert v.value == pytest.approx(1.9)  # the breaking number: the best in range
    plain = judge(_claim(), Outcome(value=1.0))
    assert plain.verdict == INCONSISTENT and plain.value == 1.0


def test_upper_bound_below_claim_is_inconsistent() -> None:
    c = _claim(relation="~", value=3.64, tolerance=0.1)
    assert judge(c, Outcome(value=1.47, bound="upper")).verdict == INCONSISTENT
    assert judge(c, Outcome(value=5.0, bound="upper")).verdict == CONSISTENT


def test_not_checkable_keeps_the_reason() -> None:
    v = judge(_claim(), Outcome(value=None, not_checkable="no linear attention"))
    assert v.verdict == NOT_CHECKABLE and "linear attention" in v.explanation


@pytest.mark.parametrize(
    ("patch", "msg"),
    [
        ({"claim": {"quantity": "x", "relation": "!=", "value": 1}}, "relation"),
        ({"claim": {"quantity": "x", "relation": "in", "low": 3, "high": 1}}, "low <= high"),
        ({"claim": {"quantity": "x", "relation": ">=", "value": 1, "tolerance": 2}}, "tolerance"),
        ({"quote": 3}, "quote"),
    ],
)
def test_bad_claim_files_say_what_to_fix(patch: dict, msg: str) -> None:
    with pytest.raises(SpecError, match=msg):
        claim_from_dict({**BASE, **patch})


def test_narrow_window_between_grid_points_is_found() -> None:
    # value = 10·a on a 7-point grid of 0–1: the claim ≈ 4.7 ± 1% holds only for a in
    # [0.4653, 0.4747], between the grid points 0.333 and 0.5
    c = _claim(relation="~", value=4.7, tolerance=0.01)
    a = Assumption("a", 0.0, 0.0, 1.0, points=7, refine=6)
    v = judge(c, Outcome(value=0.0, assumptions=(a,), evaluate=lambda over: 10 * over["a"]))
    assert v.verdict == NEEDS and v.needed is not None
    assert 0.4653 - 0.01 <= v.needed["low"] <= v.needed["high"] <= 0.4747 + 0.01
