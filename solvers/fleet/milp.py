"""The fleet MILP: instance counts per (device, configuration, role) at least $/h.

Variables: integer instance counts ``n_o`` per option ``o``; the share ``y_{b,o}`` of
request bucket ``b`` routed to colocated option ``o`` (continuous in [0, 1], or binary
per slice as in Mélange); for disaggregated serving, the rate ``x_k`` served through
decode class ``k`` (a device type and TP: the prefill goodputs of class ``k`` were
evaluated with the KV link into it, so each class has its own prefill pools)::

    min  Σ_o (c_o + ε_o)·n_o   (ε_o = 1e-6·c_min·(devices_o + o/|O|): among equal-cost
                                fleets the one with fewer devices, then the earlier options,
                                so that ties are not split over interchangeable pools)
    s.t. Σ_o y_{b,o} + Σ_k x_k / D = 1                 demand_b    (PD only when one bucket)
         Σ_b D_b·y_{b,o} / g_{o,b} ≤ n_o              capacity_o  (Mélange's load model)
         Σ_{p∈P_k} g_p·n_p ≥ x_k,  Σ_{d∈D_k} g_d·n_d ≥ x_k        prefill / decode goodput
         Σ_{p∈P_k} e_p·n_p ≥ x_k,  Σ_{d∈D_k} i_d·n_d ≥ x_k        KV link egress / ingress
         min_t ≤ Σ_{o of type t} devices_o·n_o ≤ max_t  availability per device type

``D_b`` is bucket ``b``'s rate (× headroom), ``g_{o,b}`` the goodput of one instance of
``o`` on that bucket's requests, ``e``/``i`` the KV link capacities in requests/s. With one
bucket the capacity rows say the colocated pools' goodput covers their share. The load
model (a pool serving several buckets needs Σ λ_b/g_b instances) is Mélange's
(Griggs et al., arXiv 2404.14527, §5); here ``g`` comes from the queueing model at the
SLO instead of a profiled peak.

With one bucket the MILP fixes the counts and the cost; the rate is then split over the
serving paths in proportion to their goodput (:func:`_balance`: every path — a colocated
pool, a PD class — at the same fraction of its goodput), not at whichever vertex of the
equal-cost face the LP ended on.

Solved with HiGHS through PuLP (``solvers.pulp_solver``) under a time limit; the status is
checked and the relative MIP gap reported. An infeasible model returns
``status="infeasible"`` (the planner then names the binding constraint).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from perfmodel.errors import SolverError, SpecError
from solvers.fleet.prune import prune_dominated

_TIE_BREAK = 1e-6
#: relative MIP gap: proved optimal. At 1e-5 (a tenth of a cent per hour of a $100/h
#: fleet) HiGHS stopped at equal-cost fleets the tie-break ranks lower, and which one it
#: stopped at depended on its search path; proving the optimum costs no more time here.
_GAP_REL = 0.0
_LINK_CAP = 1e3
#: HiGHS options for these models, which presolve to a few dozen rows and columns: its
#: sub-MIP heuristics (RINS, RENS) and its restart after root fixing cost more than the
#: branch and bound they would shorten (the ten MILPs of a five-device plan: 1.65 s -> 0.55
#: s of HiGHS, same optima). Neither changes what is proved: the gap is still _GAP_REL.
_HIGHS_OPTIONS = {
    "mip_heuristic_run_rins": False,
    "mip_heuristic_run_rens": False,
    "mip_allow_restart": False,
}


@dataclass(frozen=True)
class FleetOption:
    """One thing the fleet can buy: an instance of a configuration in a role."""

    name: str  # unique, used in constraint names
    device_type: str  # caps and minimums apply per device type
    devices_per_instance: int
    cost_per_instance: float  # $/h (or devices when unpriced)
    role: str = "colocated"  # colocated | prefill | decode
    goodput_per_s: tuple[float, ...] = ()  # per bucket (colocated) or (g,) for PD roles
    link_capacity_per_s: float = math.inf
    pd_class: str = ""


@dataclass(frozen=True)
class FleetProblem:
    """Options, demand per bucket (requests/s, headroom included), caps, minimums."""

    options: tuple[FleetOption, ...]
    demand_per_s: tuple[float, ...]
    max_devices: Mapping[str, int] = field(default_factory=dict)
    min_devices: Mapping[str, int] = field(default_factory=dict)
    assignment: str = "fractional"  # fractional | binary (Mélange slices)
    slices: int = 1

    def __post_init__(self) -> None:
        if not self.demand_per_s or any(
            not (d >= 0 and math.isfinite(d)) for d in self.demand_per_s
        ):
            raise SpecError("fleet demand must be a non-empty list of rates >= 0")
        if sum(self.demand_per_s) <= 0:
            raise SpecError("fleet demand must be positive")
        if self.assignment not in ("fractional", "binary"):
            raise SpecError(f"assignment must be fractional or binary, got {self.assignment!r}")
        if self.slices < 1:
            raise SpecError(f"slices must be >= 1, got {self.slices}")
        names = [o.name for o in self.options]
        if len(set(names)) != len(names):
            raise SpecError("fleet option names must be unique")
        nb = len(self.demand_per_s)
        for o in self.options:
            if o.role == "colocated" and len(o.goodput_per_s) != nb:
                raise SpecError(f"option {o.name}: needs one goodput per bucket ({nb})")


@dataclass(frozen=True)
class Row:
    """One constraint at the solution."""

    name: str
    required: float
    provided: float
    slack: float
    binding: bool

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass(frozen=True)
class FleetSolution:
    status: str  # optimal | time_limit | infeasible
    counts: Mapping[str, int]
    cost: float
    gap: float | None
    share: Mapping[tuple[int, str], float]  # (bucket, colocated option) -> fraction routed
    pd_rate_per_s: Mapping[str, float]  # decode class -> rate served disaggregated
    rows: tuple[Row, ...]
    solver: str
    solve_s: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "counts": dict(self.counts),
            "cost": self.cost,
            "gap": self.gap,
            "share": {f"{b}:{o}": v for (b, o), v in self.share.items()},
            "pd_rate_per_s": dict(self.pd_rate_per_s),
            "constraints": [r.to_dict() for r in self.rows],
            "solver": self.solver,
            "solve_s": self.solve_s,
        }


def _ub(o: FleetOption, total: float, cap: int | None) -> int:
    g = [x for x in o.goodput_per_s if x > 0]
    if o.role != "colocated":
        g = [min(x, o.link_capacity_per_s) for x in g]
    u = math.ceil(total / min(g)) + 1 if g else 0
    if cap is not None:
        u = min(u, cap // o.devices_per_instance)
    return max(u, 0)


def solve_fleet(problem: FleetProblem, *, time_limit_s: float = 10.0) -> FleetSolution:
    """Solve :class:`FleetProblem` (see the module docstring).

    Options dominated by whole instances of another (:func:`prune_dominated`) are
    removed first; their count in the solution is 0.
    """
    import pulp

    from solvers.pulp_solver import pulp_solver

    if time_limit_s <= 0:
        raise SpecError(f"time limit must be > 0 s, got {time_limit_s}")
    t0 = time.perf_counter()
    all_types = {o.device_type for o in problem.options}
    free = frozenset(
        t for t in all_types if t not in problem.max_devices and not problem.min_devices.get(t)
    )
    P = replace(problem, options=prune_dominated(problem.options, free_types=free))
    D = P.demand_per_s
    total = sum(D)
    nb = len(D)
    prob = pulp.LpProblem("fleet", pulp.LpMinimize)
    n: dict[str, Any] = {}
    for i, o in enumerate(P.options):
        u = _ub(o, total, P.max_devices.get(o.device_type))
        n[o.name] = pulp.LpVariable(f"n_{i}", 0, u, cat="Integer")
    colo = [o for o in P.options if o.role == "colocated"]
    y: dict[tuple[int, int, str], Any] = {}
    cat = "Binary" if P.assignment == "binary" else "Continuous"
    for b in range(nb):
        for s in range(P.slices):
            for i, o in enumerate(colo):
                if o.goodput_per_s[b] > 0 and D[b] > 0:
                    y[(b, s, o.name)] = pulp.LpVariable(f"y_{b}_{s}_{i}", 0, 1, cat=cat)
    classes = sorted({o.pd_class for o in P.options if o.role != "colocated"}) if nb == 1 else []
    x = {k: pulp.LpVariable(f"x_{j}", 0, total) for j, k in enumerate(classes)}
    c_min = min((o.cost_per_instance for o in P.options if o.cost_per_instance > 0), default=1.0)
    n_opts = len(P.options)
    prob += pulp.lpSum(
        (o.cost_per_instance + _TIE_BREAK * c_min * (o.devices_per_instance + i / n_opts))
        * n[o.name]
        for i, o in enumerate(P.options)
    )
    for b in range(nb):
        if D[b] <= 0:
            continue
        for s in range(P.slices):
            terms = [v for (bb, ss, _), v in y.items() if bb == b and ss == s]
            pd_terms = [x[k] * (1.0 / D[b]) for k in classes] if s == 0 else []
            if P.slices > 1 and pd_terms:
                raise SpecError("disaggregated roles cannot be combined with sliced buckets")
            prob += pulp.lpSum(terms + pd_terms) == 1, f"demand_{b}_{s}"
    for i, o in enumerate(colo):
        load = [
            (D[b] / P.slices / o.goodput_per_s[b]) * v
            for (b, _, name), v in y.items()
            if name == o.name
        ]
        prob += pulp.lpSum(load) <= n[o.name], f"capacity_{i}"
    for j, k in enumerate(classes):
        pre = [o for o in P.options if o.pd_class == k and o.role == "prefill"]
        dec = [o for o in P.options if o.pd_class == k and o.role == "decode"]
        for role, os in (("prefill", pre), ("decode", dec)):
            good = pulp.lpSum(o.goodput_per_s[0] * n[o.name] for o in os)
            link = pulp.lpSum(_link(o, total) * n[o.name] for o in os)
            side = "egress" if role == "prefill" else "ingress"
            prob += good >= x[k], f"{role}_goodput_{j}"
            prob += link >= x[k], f"kv_link_{side}_{j}"
    types = sorted({o.device_type for o in P.options})
    for t in types:
        used = pulp.lpSum(
            o.devices_per_instance * n[o.name] for o in P.options if o.device_type == t
        )
        if t in P.max_devices:
            prob += used <= P.max_devices[t], f"max_devices_{t}"
        if P.min_devices.get(t, 0) > 0:
            prob += used >= P.min_devices[t], f"min_devices_{t}"
    for t, m in P.min_devices.items():
        if m > 0 and t not in types:
            raise SpecError(f"a minimum of {m} {t} devices was set but {t} has no usable option")
    # one HiGHS thread (HIGHS_THREADS)
    solver, name = pulp_solver(time_limit_s, _GAP_REL, highs_options=_HIGHS_OPTIONS)
    prob.solve(solver)
    status = pulp.LpStatus[prob.status]
    if prob.status == pulp.LpStatusInfeasible:
        return FleetSolution("infeasible", {}, math.inf, None, {}, {}, (), name,
                             time.perf_counter() - t0)  # fmt: skip
    if prob.sol_status not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        raise SolverError(f"fleet MILP ended with status {status!r} and no solution")
    optimal = prob.sol_status == pulp.LpSolutionOptimal
    gap = _gap(prob, name)
    counts = {o.name: round(float(n[o.name].value() or 0.0)) for o in P.options}
    _balance(P, counts, y, x)
    share: dict[tuple[int, str], float] = {}
    for (b, _, oname), v in y.items():
        f = float(v.value() or 0.0) / P.slices
        if f > 1e-9:
            share[(b, oname)] = share.get((b, oname), 0.0) + f
    pd = {k: float(x[k].value() or 0.0) for k in classes if float(x[k].value() or 0.0) > 1e-9}
    cost = sum(o.cost_per_instance * counts[o.name] for o in P.options)
    return FleetSolution(
        "optimal" if optimal else "time_limit",
        {k: v for k, v in counts.items() if v > 0},
        cost,
        0.0 if optimal and gap is None else gap,
        share,
        pd,
        _rows(prob, idle=[j for j, k in enumerate(classes) if k not in pd]),
        name,
        time.perf_counter() - t0,
    )


def _balance(P: FleetProblem, counts: Mapping[str, int], y: dict[Any, Any], x: Any) -> None:
    """One bucket: route the demand in proportion to each path's goodput at the chosen
    counts — a colocated pool's ``g·n``; a PD class's smallest of its prefill and decode
    goodputs and KV link capacities — so that every path runs at the same fraction of its
    goodput. The counts fix the cost; the LP's own split is any vertex of the face of
    equal cost (it moved by a few percent between solver settings), this one is the
    balanced point of that face. Sets the variables' values (the rows are read from them)."""
    if len(P.demand_per_s) != 1 or P.slices != 1 or P.assignment != "fractional":
        return
    D = P.demand_per_s[0]
    paths: list[tuple[Any, float, float]] = []  # (variable, capacity, value per unit share)
    for o in P.options:
        if o.role == "colocated" and (0, 0, o.name) in y:
            paths.append((y[(0, 0, o.name)], o.goodput_per_s[0] * counts[o.name], 1.0))
    for k, var in x.items():
        sides = []
        for role in ("prefill", "decode"):
            mine = [o for o in P.options if o.pd_class == k and o.role == role]
            sides.append(sum(o.goodput_per_s[0] * counts[o.name] for o in mine))
            sides.append(sum(_link(o, D) * counts[o.name] for o in mine))
        paths.append((var, min(sides), D))
    total = sum(c for _, c, _ in paths)
    if not total >= D:  # cannot happen at a feasible solution: keep the LP's split
        return
    for var, c, unit in paths:
        var.varValue = c / total * unit


def _link(o: FleetOption, total: float) -> float:
    """An option's KV link capacity in the model: an unlimited link (colocated KV) capped
    at a large multiple of the demand."""
    return min(o.link_capacity_per_s, _LINK_CAP * total)


def _gap(prob: Any, solver: str) -> float | None:
    if solver != "highs":
        return None
    try:
        info = prob.solverModel.getInfo()
        g = float(info.mip_gap)
    except (AttributeError, TypeError, ValueError):
        return None
    return g if math.isfinite(g) else None


def _rows(prob: Any, *, idle: Sequence[int] = ()) -> tuple[Row, ...]:
    """Every constraint at the solution: its slack relative to its right-hand side (the
    rows of PD classes ``idle`` — carrying no traffic — are left out: 0 >= 0 binds)."""
    idle_suffix = tuple(f"_{j}" for j in idle)
    pd_rows = ("prefill_goodput", "decode_goodput", "kv_link_")
    out = []
    # PuLP 3 deprecates the mapping view ``prob.constraints`` (4 makes it a method): its
    # dict, read without a warnings filter (not thread-safe, and solves run in threads)
    items = getattr(prob, "_constraints", None)
    if not isinstance(items, dict):  # pragma: no cover - a PuLP without the dict
        items = dict(prob.constraints.items())
    for name, c in items.items():
        if name.startswith(pd_rows) and name.endswith(idle_suffix):
            continue
        lhs = float(c.value() - c.constant) if c.value() is not None else 0.0
        rhs = float(-c.constant)
        slack = rhs - lhs if c.sense < 0 else lhs - rhs  # >= 0 when met (PuLP's sign)
        scale = abs(rhs) if abs(rhs) > 1e-12 else 1.0
        out.append(Row(name, rhs, lhs, slack / scale, abs(slack) <= 1e-6 * scale))
    return tuple(out)


def cheapest_single(
    problem: FleetProblem, device_type: str, *, time_limit_s: float = 10.0
) -> FleetSolution:
    """The problem restricted to one device type's options (its best single-type fleet)."""
    opts = tuple(o for o in problem.options if o.device_type == device_type)
    if not opts:
        raise SpecError(f"no option of device type {device_type!r}")
    sub = FleetProblem(
        opts,
        problem.demand_per_s,
        {k: v for k, v in problem.max_devices.items() if k == device_type},
        {k: v for k, v in problem.min_devices.items() if k == device_type},
        problem.assignment,
        problem.slices,
    )
    return solve_fleet(sub, time_limit_s=time_limit_s)


def option_names(options: Sequence[FleetOption]) -> list[str]:
    return [o.name for o in options]
