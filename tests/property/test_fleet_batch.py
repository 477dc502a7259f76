"""``solvers.fleet.batch.solve_fleets``: the MILPs solved side by side in threads, and read
back from the plan cache, are the solutions of solving each alone."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from solvers.fleet import batch
from solvers.fleet.milp import FleetOption, FleetProblem, FleetSolution, solve_fleet
from tests.property.test_fleet_properties import problems


def _same(a: FleetSolution, b: FleetSolution) -> None:
    assert a.status == b.status
    assert dict(a.counts) == dict(b.counts)
    assert a.cost == b.cost
    assert dict(a.pd_rate_per_s) == pytest.approx(dict(b.pd_rate_per_s), rel=1e-9, abs=1e-12)
    assert [(r.name, r.binding) for r in a.rows] == [(r.name, r.binding) for r in b.rows]


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(problems(), min_size=2, max_size=5))
def test_threads_solve_as_each_alone(ps: list[FleetProblem]) -> None:
    alone = [solve_fleet(p) for p in ps]
    together = batch.solve_fleets(ps, use_cache=False, workers=2)
    assert len(together) == len(ps)
    for a, b in zip(alone, together, strict=True):
        _same(a, b)


def _problem(demand: float) -> FleetProblem:
    opts = (
        FleetOption("a1", "A", 1, 2.0, goodput_per_s=(2.0,)),
        FleetOption("b2", "B", 2, 5.0, goodput_per_s=(6.5,)),
    )
    return FleetProblem(opts, (demand,))


def test_a_proven_solution_is_read_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PERFMODEL_CACHE_DIR", str(tmp_path))
    ps = [_problem(7.0), _problem(13.0)]
    first = batch.solve_fleets(ps)
    stored = list((tmp_path / "fleet-milp").glob("*.pkl"))
    assert len(stored) == 2
    calls: list[FleetProblem] = []
    monkeypatch.setattr(batch, "solve_fleet", lambda p, **kw: calls.append(p))
    again = batch.solve_fleets(ps)
    assert calls == []  # both read back
    for a, b in zip(first, again, strict=True):
        _same(a, b)
        assert a.solve_s == b.solve_s  # the time the solve took, kept
    # by hand: 7 req/s is 1 x B (6.5) + 1 x A = $7; 13 req/s is 2 x B = $10
    assert first[0].cost == pytest.approx(7.0) and first[1].cost == pytest.approx(10.0)
    # another demand is another model: solved
    monkeypatch.undo()
    monkeypatch.setenv("PERFMODEL_CACHE_DIR", str(tmp_path))
    batch.solve_fleets([_problem(7.5)])
    assert len(list((tmp_path / "fleet-milp").glob("*.pkl"))) == 3


def test_a_time_limited_solution_is_not_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PERFMODEL_CACHE_DIR", str(tmp_path))
    real = solve_fleet(_problem(7.0))
    stopped = FleetSolution(
        "time_limit", real.counts, real.cost, 0.01, real.share, real.pd_rate_per_s,
        real.rows, real.solver, 10.0,
    )  # fmt: skip
    monkeypatch.setattr(batch, "solve_fleet", lambda p, **kw: stopped)
    got = batch.solve_fleets([_problem(7.0)])
    assert got[0].status == "time_limit"
    assert not (tmp_path / "fleet-milp").exists() or not os.listdir(tmp_path / "fleet-milp")


def test_no_cache_when_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PERFMODEL_CACHE_DIR", "off")
    monkeypatch.chdir(tmp_path)
    batch.solve_fleets([_problem(7.0), _problem(9.0)])
    assert not any(tmp_path.iterdir())
