"""Expert placement: which experts (and replicas) each GPU holds, under per-GPU memory.

The metric is the **expected makespan**: the mean, over load samples ``T^s`` (recorded
batches or an expected load vector), of the optimal dispatch makespan of that sample
on the placement (continuous splits, tile padding as configured) — the same
fixed-charge model as ``solvers.dispatch``. The ILP chooses the placement ``z``:

    min (1/S)·Σ_s C_s + μ·Σ_{i,g} u_ig
    s.t. Σ_i z_ig ≤ slots_g                   memory (replica slots) per GPU
         Σ_g z_ig ≥ 1                          every expert placed
         u_ig ≥ z_ig − z0_ig                   replicas copied vs the current placement
         y^s_ig ≤ z_ig, and per sample s the dispatch MILP with y^s, x^s, m^s, C_s

``μ`` (``migration_cost_s``) is the makespan-equivalent cost of copying one expert
(amortized over the steps until the next rebalance). The EPLB placement is a feasible
point of this ILP, so the ILP's optimum is never worse than EPLB on the metric; when
the solver stops early the better of the two is returned and flagged.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from hardware.device import Device
from hardware.maxaffine import MaxAffine
from hardware.roofline import GEMM_M_TILE
from perfmodel.errors import InfeasibleError, SolverError, SpecError
from solvers.dispatch.solve import Placement, make_problem, solve_milp
from solvers.placement.eplb import rebalance_experts
from solvers.pulp_solver import highs_error, pulp_solver

I64 = NDArray[np.int64]

Arr = NDArray[np.float64]


def slots_from_memory(
    device: Device,
    expert_bytes: float,
    *,
    num_gpus: int,
    reserved_bytes: ArrayLike = 0.0,
) -> I64:
    """Replica slots per GPU: ``⌊(HBM − reserved) / expert bytes⌋``.

    Raises InfeasibleError naming the GPU whose reservation leaves no room.
    """
    if expert_bytes <= 0:
        raise SpecError(f"expert bytes must be > 0, got {expert_bytes}")
    res = np.broadcast_to(np.asarray(reserved_bytes, dtype=np.float64), (num_gpus,))
    free = device.hbm_bytes - res
    slots = np.floor(np.maximum(free, 0.0) / expert_bytes).astype(np.int64)
    bad = np.flatnonzero(slots < 1)
    if len(bad):
        g = int(bad[0])
        raise InfeasibleError(
            f"GPU {g}: {res[g]:.3g} B reserved of {device.hbm_bytes:.3g} B leaves no room for "
            f"one expert ({expert_bytes:.3g} B); reserve less memory on GPU {g}"
        )
    return slots


def check_capacity(num_experts: int, slots: ArrayLike) -> I64:
    """Slots per GPU as an array; InfeasibleError naming the binding GPU if the experts
    cannot all be placed once."""
    s = np.asarray(slots, dtype=np.int64).ravel()
    if np.any(s < 0):
        raise SpecError("replica slots per GPU must be >= 0")
    if s.sum() < num_experts:
        g = int(np.argmin(s))
        raise InfeasibleError(
            f"{num_experts} experts need {num_experts} replica slots but the {len(s)} GPUs "
            f"offer {int(s.sum())}; binding: GPU {g} has memory for only {int(s[g])} "
            "experts — add GPUs or free memory"
        )
    return s


@dataclass(frozen=True)
class PlacementResult:
    """A placement, its expected makespan and how it compares to EPLB's."""

    placement: Placement
    expected_makespan_s: float
    eplb_placement: Placement
    eplb_expected_makespan_s: float
    migrated_replicas: int
    status: str  # optimal | time_limit | eplb (ILP did not beat EPLB in time)
    solve_time_s: float
    message: str = ""

    @property
    def gain(self) -> float:
        """Relative reduction of the expected makespan vs EPLB."""
        e = self.eplb_expected_makespan_s
        return (e - self.expected_makespan_s) / e if e > 0 else 0.0


def expected_makespan_s(
    placement: Placement,
    samples: ArrayLike,
    profile: MaxAffine,
    *,
    tile_rows: int = GEMM_M_TILE,
    time_limit_s: float = 10.0,
) -> float:
    """Mean over samples of the optimal (continuous-split) dispatch makespan."""
    S = np.atleast_2d(np.asarray(samples, dtype=np.float64))
    vals = [
        solve_milp(
            make_problem(s, placement, profile, tile_rows=tile_rows),
            integer=False,
            time_limit_s=time_limit_s,
        ).makespan_s
        for s in S
    ]
    return float(np.mean(vals))


def eplb_placement(
    load: ArrayLike, *, num_gpus: int, slots_per_gpu: int, num_groups: int = 1, num_nodes: int = 1
) -> Placement:
    """EPLB's placement from a load vector (one layer)."""
    w = np.asarray(load, dtype=np.float64).ravel()
    r = rebalance_experts(w[None, :], num_gpus * slots_per_gpu, num_groups, num_nodes, num_gpus)
    return Placement.from_slots(
        r.phy2log[0],
        r.slot_gpu(),
        num_experts=len(w),
        num_gpus=num_gpus,
        gpus_per_node=num_gpus // num_nodes if num_nodes > 1 else 0,
    )


@dataclass(frozen=True)
class PlacementReport:
    """``perfmodel dispatch place``'s answer: the placement problem and its result."""

    model: str
    hardware: str
    gpus: int
    slots_per_gpu: int
    result: PlacementResult

    def to_dict(self) -> dict[str, Any]:
        r = self.result
        return {
            "model": self.model,
            "hardware": self.hardware,
            "gpus": self.gpus,
            "slots_per_gpu": self.slots_per_gpu,
            "status": r.status,
            "expected_makespan_s": r.expected_makespan_s,
            "eplb_expected_makespan_s": r.eplb_expected_makespan_s,
            "gain": r.gain,
            "replicas_per_gpu": r.placement.slots_used.tolist(),
            "placement": r.placement.replicas.tolist(),
            "solve_time_s": r.solve_time_s,
            "message": r.message,
        }


def place_ilp(
    samples: ArrayLike,
    profile: MaxAffine,
    *,
    num_gpus: int,
    slots_per_gpu: ArrayLike,
    tile_rows: int = GEMM_M_TILE,
    current: Placement | None = None,
    migration_cost_s: float = 0.0,
    num_groups: int = 1,
    num_nodes: int = 1,
    time_limit_s: float = 30.0,
) -> PlacementResult:
    """ILP placement minimizing the expected makespan (see the module docstring)."""
    import pulp

    t0 = time.perf_counter()
    S = np.atleast_2d(np.asarray(samples, dtype=np.float64))
    if not np.all(np.isfinite(S)) or np.any(S < 0):
        raise SpecError("load samples must be finite and >= 0")
    n_s, E = S.shape
    G = num_gpus
    slots = check_capacity(E, np.broadcast_to(np.asarray(slots_per_gpu), (G,)))
    if migration_cost_s < 0:
        raise SpecError("migration cost must be >= 0 s")
    if current is not None:
        if current.replicas.shape != (E, G):
            raise SpecError(f"current placement is {current.replicas.shape}, expected ({E}, {G})")
        current.check_slots(slots)
    # EPLB needs equal slots per GPU; it gets the smallest common count.
    s_eplb = int(slots.min())
    eplb_pl = (
        eplb_placement(
            S.mean(axis=0),
            num_gpus=G,
            slots_per_gpu=s_eplb,
            num_groups=num_groups,
            num_nodes=num_nodes,
        )
        if s_eplb * G >= E
        else None
    )
    ref = make_problem(
        S.mean(axis=0), Placement(np.ones((E, G), np.int64)), profile, tile_rows=tile_rows
    )
    sc = 1.0 / ref.ref_time_s()
    al, sg, sn = ref.alpha_s, ref.slope_g, ref.slope_n
    prob = pulp.LpProblem("expert_placement", pulp.LpMinimize)
    z = {(i, g): pulp.LpVariable(f"z_{i}_{g}", cat="Binary") for i in range(E) for g in range(G)}
    for g in range(G):
        prob += pulp.lpSum(z[i, g] for i in range(E)) <= int(slots[g]), f"slots_{g}"
    for i in range(E):
        prob += pulp.lpSum(z[i, g] for g in range(G)) >= 1, f"placed_{i}"
    terms = (sc * al, sc * sg, sc * sn)
    cs = [_sample_makespan(prob, z, S[s], s, tile_rows, terms) for s in range(n_s)]
    mig: list[Any] = []
    if current is not None and migration_cost_s > 0:
        for (i, g), v in z.items():
            if current.replicas[i, g] == 0:
                mig.append(v)
    prob += pulp.lpSum(cs) * (1.0 / n_s) + sc * migration_cost_s * pulp.lpSum(mig)
    solver, name = pulp_solver(time_limit_s, 1e-6)
    prob.solve(solver)
    if name == "highs" and highs_error(prob) is not None:  # retry without presolve
        left = max(time_limit_s - (time.perf_counter() - t0), 0.1 * time_limit_s)
        solver, _ = pulp_solver(left, 1e-6, presolve=False)
        prob.solve(solver)
    have = prob.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
    if prob.status in (pulp.LpStatusInfeasible, pulp.LpStatusUnbounded):
        raise SolverError(f"placement ILP reported {pulp.LpStatus[prob.status]}")
    proven = prob.sol_status == pulp.LpSolutionOptimal

    def moved(pl: Placement) -> int:
        if current is None:
            return 0
        return int(np.count_nonzero((pl.replicas > 0) & (current.replicas == 0)))

    def cost(pl: Placement) -> tuple[float, float]:
        em = expected_makespan_s(pl, S, profile, tile_rows=tile_rows)
        return em, em + migration_cost_s * moved(pl)

    e_em, e_obj = cost(eplb_pl) if eplb_pl is not None else (np.inf, np.inf)
    if have:
        rep = np.array([[round(z[i, g].varValue or 0.0) for g in range(G)] for i in range(E)])
        pl = Placement(rep.astype(np.int64))
        em, obj = cost(pl)
    if not have or (eplb_pl is not None and obj > e_obj * (1 + 1e-9)):
        if eplb_pl is None:
            raise SolverError(
                f"placement ILP found no solution in {time_limit_s:g} s; raise the time limit"
            )
        return PlacementResult(
            eplb_pl,
            e_em,
            eplb_pl,
            e_em,
            moved(eplb_pl),
            "eplb",
            time.perf_counter() - t0,
            f"ILP did not beat EPLB within {time_limit_s:g} s; EPLB placement kept",
        )
    status = "optimal" if proven else "time_limit"
    msg = "" if proven else f"time limit {time_limit_s:g} s reached; best placement found"
    return PlacementResult(
        pl,
        em,
        eplb_pl if eplb_pl is not None else pl,
        e_em,
        moved(pl),
        status,
        time.perf_counter() - t0,
        msg,
    )


def _sample_makespan(
    prob: Any, z: dict[tuple[int, int], Any], loads: Arr, s: int, tile_rows: int,
    terms: tuple[Arr, Arr, Arr],
) -> Any:  # fmt: skip
    """Sample ``s``'s dispatch (split, charge, tile padding) and its makespan variable ``C_s``.

    ``terms`` are the profile's scaled intercepts and slopes in G and N.
    """
    import pulp

    al, sg, sn = terms
    G = len({g for _, g in z})
    C = pulp.LpVariable(f"C_{s}")
    n_terms: dict[int, list[Any]] = {g: [] for g in range(G)}
    g_terms: dict[int, list[Any]] = {g: [] for g in range(G)}
    for i in np.flatnonzero(loads > 0).tolist():
        Ti = float(loads[i])
        xs = []
        for g in range(G):
            x = pulp.LpVariable(f"x_{s}_{i}_{g}", lowBound=0, upBound=Ti)
            y = pulp.LpVariable(f"y_{s}_{i}_{g}", cat="Binary")
            prob += y <= z[i, g], f"held_{s}_{i}_{g}"
            prob += x <= Ti * y, f"charge_{s}_{i}_{g}"
            if tile_rows > 1:
                m = pulp.LpVariable(f"m_{s}_{i}_{g}", lowBound=0, cat="Integer")
                prob += tile_rows * m >= x, f"pad_{s}_{i}_{g}"
                prob += m <= int(np.ceil(Ti / tile_rows)) * y, f"tmax_{s}_{i}_{g}"
                n_terms[g].append(tile_rows * m)
            else:
                n_terms[g].append(x)
            g_terms[g].append(y)
            xs.append(x)
        prob += pulp.lpSum(xs) == Ti, f"serve_{s}_{i}"
    for g in range(G):
        for k in range(len(al)):
            prob += (
                al[k] + sg[k] * pulp.lpSum(g_terms[g]) + sn[k] * pulp.lpSum(n_terms[g]) <= C,
                f"time_{s}_{g}_{k}",
            )
    return C
