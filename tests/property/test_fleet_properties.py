"""Fleet MILP properties over generated problems: the mix never costs more than the best
single-type fleet, caps and minimums hold, doubling the demand never lowers the cost."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solvers.fleet.milp import FleetOption, FleetProblem, cheapest_single, solve_fleet

TYPES = ("A", "B", "C")


@st.composite
def problems(draw: st.DrawFn) -> FleetProblem:
    opts = []
    for t in TYPES[: draw(st.integers(2, 3))]:
        price = draw(st.floats(0.5, 5.0))
        for tp in draw(
            st.lists(st.sampled_from((1, 2, 4, 8)), min_size=1, max_size=3, unique=True)
        ):
            g = draw(st.floats(0.2, 20.0))
            opts.append(FleetOption(f"{t}{tp}", t, tp, price * tp, goodput_per_s=(g,)))
        if draw(st.booleans()):  # a PD class on this type
            gp, gd = draw(st.floats(0.5, 10.0)), draw(st.floats(1.0, 30.0))
            opts.append(
                FleetOption(f"{t}p", t, 1, price, "prefill", (gp,), draw(st.floats(1, 50)), t)
            )
            opts.append(FleetOption(f"{t}d", t, 2, 2 * price, "decode", (gd,), 1e9, t))
    demand = draw(st.floats(0.5, 60.0))
    return FleetProblem(tuple(opts), (demand,))


def _used(p: FleetProblem, counts: dict[str, int], t: str) -> int:
    return sum(
        o.devices_per_instance * counts.get(o.name, 0) for o in p.options if o.device_type == t
    )


@settings(max_examples=25, deadline=None)
@given(problems())
def test_mix_never_costs_more_than_best_single_type(p: FleetProblem) -> None:
    mix = solve_fleet(p)
    assert mix.status == "optimal"
    singles = [cheapest_single(p, t).cost for t in {o.device_type for o in p.options}]
    assert mix.cost <= min(singles) * (1 + 1e-5) + 1e-9
    # the solution serves the demand: colocated goodput + PD rate >= demand
    colo = sum(o.goodput_per_s[0] * mix.counts.get(o.name, 0) for o in p.options
               if o.role == "colocated")  # fmt: skip
    assert colo + sum(mix.pd_rate_per_s.values()) >= p.demand_per_s[0] * (1 - 1e-6)


@settings(max_examples=25, deadline=None)
@given(problems(), st.data())
def test_caps_and_minimums_hold(p: FleetProblem, data: st.DataObject) -> None:
    types = sorted({o.device_type for o in p.options})
    caps = {t: data.draw(st.integers(0, 40)) for t in types if data.draw(st.booleans())}
    mins = {t: data.draw(st.integers(0, min(caps.get(t, 16), 16))) for t in types
            if data.draw(st.booleans())}  # fmt: skip
    q = FleetProblem(p.options, p.demand_per_s, caps, mins)
    s = solve_fleet(q)
    if s.status == "infeasible":
        # then no cap-respecting fleet exists: without caps it is feasible
        assert solve_fleet(p).status == "optimal"
        return
    for t in types:
        used = _used(q, dict(s.counts), t)
        assert used <= caps.get(t, math.inf)
        assert used >= mins.get(t, 0)
    assert s.cost >= solve_fleet(p).cost * (1 - 1e-5) - 1e-9  # constraints never help


@settings(max_examples=25, deadline=None)
@given(problems())
def test_doubling_the_rate_never_lowers_the_cost(p: FleetProblem) -> None:
    one = solve_fleet(p)
    two = solve_fleet(FleetProblem(p.options, (2 * p.demand_per_s[0],)))
    assert two.cost >= one.cost * (1 - 1e-5) - 1e-9
    assert two.cost <= 2 * one.cost * (1 + 1e-5) + 1e-9  # twice the fleet always serves it


def test_pruning_keeps_the_optimum() -> None:
    # TP2 at $4 for 3 req/s is dominated by 2 x TP1 at $2 for 2 req/s each
    opts = (
        FleetOption("a1", "A", 1, 2.0, goodput_per_s=(2.0,)),
        FleetOption("a2", "A", 2, 4.0, goodput_per_s=(3.0,)),
    )
    s = solve_fleet(FleetProblem(opts, (7.0,)))
    assert dict(s.counts) == {"a1": 4} and s.cost == pytest.approx(8.0)
