"""TP degrees left unsearched because a smaller one of the same device dominates them
(``solvers.fleet.candidates.dominated_by``): exactly those the fleet MILPs would prune,
with the same answers and a fifth of the time."""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Iterator

import pytest

from hardware.device import load_device
from perfmodel.cost.prices import catalog_prices
from perfmodel.model import load_model
from perfmodel.workload.slo import SLO
from solvers.fleet.candidates import Candidate, Unsearched, dominated_by, planning_workload
from solvers.fleet.plan import PlanInputs, plan_fleet

H100 = load_device("h100-sxm")


def _cand(tp: int, goodput: float) -> Candidate:
    return Candidate(H100, tp, 1, "bf16", "colocated", goodput, 2 * goodput, "memory", 1, 8192)


def test_dominated_by_hand_values() -> None:
    one = _cand(1, 10.0)
    assert dominated_by(8, 80.0, [one]) is not None  # 8 x 10 >= mu = 80: at the same price
    assert dominated_by(8, 80.1, [one]) is None  # mu above what 8 TP1 instances serve
    assert dominated_by(3, 1.0, [one]) is None  # k = 3: the costs are not equal to the bit
    assert dominated_by(8, 1.0, [_cand(1, 0.0), "h100-sxm TP1: does not fit"]) is None
    why = dominated_by(4, 30.0, [one, _cand(2, 16.0)])
    assert why is not None and why.startswith("dominated by TP1: 4 of its instances serve 40")


@pytest.fixture(scope="module")
def plans() -> Iterator[tuple]:  # type: ignore[type-arg]
    devs = tuple(load_device(d) for d in ("h100-sxm", "b200"))
    inp = PlanInputs(
        load_model("llama-3.1-8b"), planning_workload("chat"), SLO(1.0, 0.05, 0.9, 0.9), 40.0,
        devs, catalog_prices(devs), allow_pd=False,
    )  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PERFMODEL_CACHE_DIR", "off")  # both searched, not read back
        yield plan_fleet(inp), plan_fleet(dataclasses.replace(inp, skip_dominated=False))


def _timeless(fleet):  # type: ignore[no-untyped-def]
    return None if fleet is None else dataclasses.replace(fleet, solve_s=0.0)


def test_skipping_changes_no_fleet(plans: tuple) -> None:  # type: ignore[type-arg]
    skip, full = plans
    assert _timeless(skip.recommendation) == _timeless(full.recommendation)
    for t, alt in full.best_single_device.items():
        assert _timeless(skip.best_single_device[t].fleet) == _timeless(alt.fleet)
    assert _timeless(skip.colocated_only.fleet) == _timeless(full.colocated_only.fleet)
    assert skip.sensitivity == full.sensitivity


def test_the_skipped_degrees_are_dominated_in_the_full_search(plans: tuple) -> None:  # type: ignore[type-arg]
    skip, full = plans
    kept = {c.key for c in skip.candidates}
    gone = [c for c in full.candidates if c.key not in kept]
    assert len(gone) == 6  # TP2, TP4, TP8 of both devices: TP1 serves more per device
    assert kept <= {c.key for c in full.candidates}
    for b in gone:
        smaller = [a for a in full.candidates if a.device.id == b.device.id and a.tp < b.tp]
        # whole instances of a smaller degree serve its goodput at the same price: the
        # MILP's own dominance rule (prune_dominated) removes it from every fleet
        assert any((b.tp // a.tp) * a.goodput_per_instance_per_s >= b.goodput_per_instance_per_s
                   for a in smaller)  # fmt: skip
        assert any(r.startswith(f"{b.device.id} TP{b.tp}: dominated by TP") for r in skip.rejected)
    unsearched = [r for r in skip.rejected if isinstance(r, Unsearched)]
    assert len(unsearched) == len(gone)
    assert all(isinstance(pickle.loads(pickle.dumps(r)), Unsearched) for r in unsearched)  # cache
    assert f"not searched to the end: {len(gone)}," in skip.why[0]


@pytest.mark.parametrize("case", ["minimum", "unpriced"])
def test_skipping_changes_no_fleet_with_minimums_or_without_prices(
    case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A minimum count on one type (the single-type fleets of others are then not taken),
    and device counts instead of prices: every fleet the same with and without skipping."""
    from perfmodel.cost.prices import DevicePrice, PriceBook

    monkeypatch.setenv("PERFMODEL_CACHE_DIR", "off")
    devs = tuple(load_device(d) for d in ("h100-sxm", "b200", "l40s"))
    book = catalog_prices(devs)
    if case == "minimum":
        book = book.override(PriceBook({"h100-sxm": DevicePrice("h100-sxm", None, None, 4)}))
    else:
        book = PriceBook({})
    inp = PlanInputs(
        load_model("llama-3.1-8b"), planning_workload("code"), SLO(0.5, 0.05, 0.9, 0.9), 60.0,
        devs, book, allow_pd=False,
    )  # fmt: skip
    skip, full = plan_fleet(inp), plan_fleet(dataclasses.replace(inp, skip_dominated=False))
    assert len(skip.candidates) < len(full.candidates)
    assert _timeless(skip.recommendation) == _timeless(full.recommendation)
    for t, alt in full.best_single_device.items():
        assert _timeless(skip.best_single_device[t].fleet) == _timeless(alt.fleet)
    assert skip.sensitivity == full.sensitivity
    if case == "minimum":
        assert sum(p.devices for p in skip.recommendation.pools
                   if p.candidate.device.id == "h100-sxm") >= 4  # fmt: skip
