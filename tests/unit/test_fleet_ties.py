"""Which least-cost fleet is recommended (``solvers.fleet.ties.simplest``): a single
device type that costs no more than the mix, unless another type has a minimum."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from solvers.fleet.milp import FleetSolution
from solvers.fleet.ties import simplest


def _solved(cost: float, counts: dict[str, int], devices: dict[str, int]) -> Any:
    sol = FleetSolution("optimal", counts, cost, 0.0, {}, {}, (), "highs", 0.0)
    return sol, {k: SimpleNamespace(devices=v) for k, v in devices.items()}


NONE = (FleetSolution("infeasible", {}, float("inf"), None, {}, {}, (), "none", 0.0), {})


def test_a_single_type_as_cheap_as_the_mix_is_recommended() -> None:
    mix = _solved(135.66, {"a": 4, "b": 1}, {"a": 4, "b": 2})  # 18 devices
    h200 = _solved(135.66, {"c": 8}, {"c": 4})  # 32 devices, the same $/h
    h100 = _solved(143.64, {"d": 9}, {"d": 4})
    assert simplest(mix, {"h100": h100, "h200": h200}) is h200
    # a mix that is cheaper by more than the tie tolerance stays
    cheaper = _solved(135.66 * (1 - 1e-6), {"a": 4, "b": 1}, {"a": 4, "b": 2})
    assert simplest(cheaper, {"h100": h100, "h200": h200}) is cheaper
    # a difference within the tolerance (float sums in another order) is a tie
    ulp = _solved(135.66 * (1 + 1e-12), {"a": 4}, {"a": 4})
    assert simplest(ulp, {"h200": h200}) is h200


def test_ties_among_single_types_fewer_devices_then_name() -> None:
    mix = _solved(10.0, {"a": 1}, {"a": 1})
    x8 = _solved(10.0, {"x": 2}, {"x": 4})
    y4 = _solved(10.0, {"y": 1}, {"y": 4})
    z4 = _solved(10.0, {"z": 4}, {"z": 1})
    assert simplest(mix, {"x": x8, "y": y4}) is y4  # 4 devices before 8
    assert simplest(mix, {"z": z4, "y": y4}) is y4  # 4 and 4: by name


def test_no_single_type_when_another_type_has_a_minimum_or_none_is_feasible() -> None:
    mix = _solved(10.0, {"a": 1, "b": 1}, {"a": 1, "b": 1})
    single = _solved(10.0, {"c": 2}, {"c": 1})
    assert simplest(mix, {"h200": single}, floors={"h100"}) is mix
    assert simplest(mix, {"h200": single}, floors={"h200"}) is single  # its own floor
    assert simplest(mix, {"h200": NONE}) is mix
    assert simplest(mix, {}) is mix
