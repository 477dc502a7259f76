"""Fleet MILP: Mélange's published example, caps, minimums, PD linking (hand-derived)."""

from __future__ import annotations

import itertools
import math

import pytest

from solvers.fleet.milp import FleetOption, FleetProblem, cheapest_single, solve_fleet


def _melange(gpus: dict[str, tuple[float, list[list[float]]]], dist, rate, **kw) -> FleetProblem:
    demand = tuple(rate * p for row in dist for p in row)
    opts = tuple(
        FleetOption(name, name, 1, cost, goodput_per_s=tuple(t for row in tp for t in row))
        for name, (cost, tp) in gpus.items()
    )
    return FleetProblem(opts, demand, assignment="binary", **kw)


def test_melange_example_json_optimum():
    # Mélange (Griggs et al., arXiv 2404.14527) melange/config/example.json as recorded in
    # shared/reference/formal_models.md T10: A10G $1.01 tputs [[2,1],[5,2]], A100-80GB
    # $3.67 [[20,20],[40,20]], distribution [[.2,.1],[.5,.2]], 30 req/s, slice factor 1.
    # Published optimum: {A10G: 3, A100-80GB: 1, cost 6.70}.
    p = _melange(
        {"A10G": (1.01, [[2, 1], [5, 2]]), "A100-80GB": (3.67, [[20, 20], [40, 20]])},
        [[0.2, 0.1], [0.5, 0.2]],
        30.0,
    )
    s = solve_fleet(p)
    assert s.status == "optimal"
    assert dict(s.counts) == {"A10G": 3, "A100-80GB": 1}
    assert s.cost == pytest.approx(6.70, abs=1e-9)
    assert s.gap == pytest.approx(0.0, abs=1e-6)


def _brute(gpus, dist, rate):
    """Every binary bucket -> GPU assignment, counts = ceil(load): Mélange's optimum."""
    names = list(gpus)
    rates = [rate * p for row in dist for p in row]
    best = math.inf
    for assign in itertools.product(range(len(names)), repeat=len(rates)):
        load = [0.0] * len(names)
        for b, j in enumerate(assign):
            tp = [t for row in gpus[names[j]][1] for t in row]
            load[j] += rates[b] / tp[b]
        cost = sum(math.ceil(x - 1e-9) * gpus[n][0] for x, n in zip(load, names, strict=True))
        best = min(best, cost)
    return best


def test_melange_script_example_matches_brute_force():
    # melange-release scripts/main.py example: A10G $1.01 [[5,1],[10,5]], A100 $3.67
    # [[20,2],[50,20]], distribution [[0.25,0.5],[0.25,0.25]], 16 req/s, slice factor 1.
    gpus = {"A10G": (1.01, [[5, 1], [10, 5]]), "A100": (3.67, [[20, 2], [50, 20]])}
    dist = [[0.25, 0.5], [0.25, 0.25]]
    s = solve_fleet(_melange(gpus, dist, 16.0))
    assert s.cost == pytest.approx(_brute(gpus, dist, 16.0), abs=1e-9)


def _colo(name, dev, cost, g, devices=1):
    return FleetOption(name, dev, devices, cost, goodput_per_s=(g,))


def test_single_bucket_integer_mix_by_hand():
    # 10 req/s; A: $4/h for 4 req/s, B: $1.5/h for 1 req/s. All-A: 3 x 4 = $12;
    # all-B: 10 x 1.5 = $15; mix 2A + 2B = $11 (8 + 2 = 10 req/s): the optimum.
    p = FleetProblem((_colo("a", "A", 4.0, 4.0), _colo("b", "B", 1.5, 1.0)), (10.0,))
    s = solve_fleet(p)
    assert dict(s.counts) == {"a": 2, "b": 2}
    assert s.cost == pytest.approx(11.0)
    assert cheapest_single(p, "A").cost == pytest.approx(12.0)
    assert cheapest_single(p, "B").cost == pytest.approx(15.0)


def test_caps_and_minimums_respected():
    opts = (_colo("a", "A", 4.0, 4.0, devices=2), _colo("b", "B", 1.5, 1.0))
    s = solve_fleet(FleetProblem(opts, (10.0,), max_devices={"A": 2}))
    assert s.counts.get("a", 0) * 2 <= 2
    # one A instance (4 req/s) + 6 B = 4 + 9 = $13
    assert s.cost == pytest.approx(13.0)
    s = solve_fleet(FleetProblem(opts, (10.0,), min_devices={"B": 3}))
    assert s.counts.get("b", 0) >= 3
    # 3 B (3 req/s, $4.5) + 2 A (8 req/s, $8) = $12.5; 1 A + 6 B = $13; 10 B = $15
    assert s.cost == pytest.approx(12.5)
    s = solve_fleet(FleetProblem(opts, (10.0,), max_devices={"A": 0, "B": 5}))
    assert s.status == "infeasible"


def test_pd_linking_matches_prefill_and_decode_capacity():
    # PD class k: prefill 5 req/s at $2, decode 12 req/s at $3, link 100 req/s.
    # 20 req/s: 4 prefill + 2 decode = 8 + 6 = $14; colocated C 3 req/s at $2.5: 7 x 2.5
    # = $17.5. Optimum: PD ($14), prefill and decode each >= 20 req/s.
    opts = (
        FleetOption("p", "X", 1, 2.0, "prefill", (5.0,), 100.0, "k"),
        FleetOption("d", "Y", 1, 3.0, "decode", (12.0,), 100.0, "k"),
        _colo("c", "Z", 2.5, 3.0),
    )
    s = solve_fleet(FleetProblem(opts, (20.0,)))
    assert dict(s.counts) == {"p": 4, "d": 2}
    assert s.cost == pytest.approx(14.0)
    assert s.pd_rate_per_s["k"] == pytest.approx(20.0)
    # a slow link (3 req/s per prefill instance) forces 7 prefill instances: 14 + 6 = 20
    # > 17.5 colocated, so colocated wins
    slow = (FleetOption("p", "X", 1, 2.0, "prefill", (5.0,), 3.0, "k"), *opts[1:])
    s = solve_fleet(FleetProblem(slow, (20.0,)))
    assert s.cost == pytest.approx(17.5)


def test_rate_split_in_proportion_to_goodput():
    """Caps force one colocated instance (5 req/s) and one PD pair (prefill 5, decode 6
    req/s: the class serves 5) for 9 req/s. Any split with colocated in [3, 5] costs the
    same; the plan's is the balanced one: 9·5/10 = 4.5 each, both at 90 % of goodput, and
    every constraint row is met at it (the rows are read after the split)."""
    opts = (
        _colo("c", "A", 5.0, 5.0),
        FleetOption("p", "B", 1, 2.0, "prefill", (5.0,), 100.0, "k"),
        FleetOption("d", "B", 1, 2.0, "decode", (6.0,), 100.0, "k"),
    )
    s = solve_fleet(FleetProblem(opts, (9.0,), max_devices={"A": 1, "B": 2}))
    assert dict(s.counts) == {"c": 1, "p": 1, "d": 1}
    assert s.share[(0, "c")] == pytest.approx(0.5, rel=1e-12)
    assert s.pd_rate_per_s["k"] == pytest.approx(4.5, rel=1e-12)
    rows = {r.name: r for r in s.rows}
    assert all(r.slack >= -1e-12 for r in s.rows)
    assert rows["capacity_0"].slack == pytest.approx(0.1, rel=1e-9)  # n = 1 >= 9·0.5/5
    assert rows["prefill_goodput_0"].provided == pytest.approx(5.0 - 4.5)  # goodput − x_k
    assert not rows["capacity_0"].binding and rows["demand_0_0"].binding


def test_binary_assignment_keeps_whole_buckets():
    """Mélange's binary routing is structural: the balanced split is not applied to it
    (one bucket, a minimum forcing a second pool: the bucket still goes to one pool)."""
    opts = (_colo("a", "A", 4.0, 4.0), _colo("b", "B", 4.0, 4.0))
    s = solve_fleet(FleetProblem(opts, (6.0,), min_devices={"B": 1}, assignment="binary", slices=1))
    assert sorted(s.share.values()) == [1.0]
