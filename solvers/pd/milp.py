"""PD planner, step 2: the MILP over instance counts, and :func:`plan_pd`.

**MILP** (PuLP, HiGHS): pick exactly one decode class ``c`` (binary ``z_c``) and
integer instance counts ``n_{k,c}`` (prefill) and ``m_j`` (decode)::

    min  Σ cost_k·n_{k,c} + Σ cost_j·m_j               (GPUs, or $/h with prices)
    s.t. Σ g_{k,c}·n_{k,c} ≥ λ                          prefill TTFT goodput
         Σ g_j·m_j ≥ λ                                  decode TPOT goodput
         Σ e_{k,c}·n_{k,c} ≥ λ                          KV egress of the prefill links
         Σ i_j·m_j ≥ λ                                  KV ingress of the decode links
         Σ gpus·(n + m) ≤ G_max                         optional GPU limit
         n_{k,c} ≤ U·z_c,  m_j ≤ U·z_{c(j)},  Σ z_c = 1

with ``g`` the per-instance goodput at the SLO percentile, ``e = 1/E[X]`` and
``i = 1/E[X_recv]`` the link capacities in requests/s. A tiny tie-break prefers the
plan with the most spare goodput among equal-cost ones. The comparison with the
colocated baseline (``gain``, ``fluid_gain``) is explained in ``solvers.pd_colocated``.

The SLO criterion is DistServe's: the ``slo.percentile`` quantile of TTFT and that of
TPOT both within their targets.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any

from hardware.device import Device
from perfmodel.errors import InfeasibleError, SolverError, SpecError
from perfmodel.model import ModelSpec
from perfmodel.pd.config import PhaseGoodput
from perfmodel.pd.deployment import Deployment, Pool
from perfmodel.workload.arrivals import check_rate
from perfmodel.workload.presets import Workload
from perfmodel.workload.slo import SLO
from solvers.pd.colocated import colocated_baseline
from solvers.pd.enumerate import (
    EngineSpec,
    PhaseOptions,
    PhaseProfiles,
    check_feasible,
    evaluate_options,
    one_blas_thread,
)
from solvers.pd.fluid import fluid_optimum
from solvers.pd.results import Allocation, Constraint, PDPlan

_TIE_BREAK = 1e-4


# a link with no stated capacity is taken as this many times the arrival rate (never binds)
_UNCAPPED_LINK_FACTOR = 1e6


def _price(dev: Device, prices: dict[str, float] | None) -> float:
    if prices is None:
        return 1.0
    if dev.id in prices:
        return prices[dev.id]
    if dev.price_per_hour_usd is not None:
        return dev.price_per_hour_usd
    raise SpecError(f"no price per hour for {dev.id}; give one or plan by GPU count")


def _solve(
    opts: PhaseOptions,
    rate: float,
    *,
    max_gpus: int | None,
    prices: dict[str, float] | None,
    time_limit_s: float,
) -> tuple[dict[tuple[Any, ...], int], str, str]:
    import pulp

    from solvers.pulp_solver import pulp_solver as _pulp_solver

    prob = pulp.LpProblem("pd_plan", pulp.LpMinimize)
    classes = sorted(set(opts.prefill) & set(opts.decode))
    z = {c: pulp.LpVariable(f"z_{c[0]}_tp{c[1]}", cat="Binary") for c in classes}
    n: dict[tuple[Any, ...], Any] = {}
    m: dict[tuple[Any, ...], Any] = {}
    cost, gp, eg, gd, ing, gpus = [], [], [], [], [], []

    def instances(var: str, phase: str, i: int, c: Any, g: Any) -> Any:
        """Integer count of instances of option ``g`` (0 unless class ``c`` is chosen)."""
        u = math.ceil(rate / min(g.rate_per_s, g.link_capacity_per_s)) + 1
        v = pulp.LpVariable(f"{var}_{i}_{c[0]}_tp{c[1]}", 0, u, cat="Integer")
        prob.addConstraint(v <= u * z[c], f"select_{phase}_{i}_{c[0]}_tp{c[1]}")
        cost.append(_price(g.config.device, prices) * g.config.gpus * v)
        gpus.append(g.config.gpus * v)
        return v

    for c in classes:
        for k, g in enumerate(opts.prefill[c]):
            if g.feasible:
                v = n[("p", c, k)] = instances("n", "p", k, c, g)
                gp.append(g.rate_per_s * v)
                eg.append(g.link_capacity_per_s * v)
        for j, g in enumerate(opts.decode[c]):
            if g.feasible:
                v = m[("d", c, j)] = instances("m", "d", j, c, g)
                gd.append(g.rate_per_s * v)
                ing.append(min(g.link_capacity_per_s, _UNCAPPED_LINK_FACTOR * rate) * v)
    if not n or not m:
        raise InfeasibleError("no prefill/decode pair of configurations meets both SLOs")
    scale = 1.0 / rate
    prob += pulp.lpSum(cost) - _TIE_BREAK * scale * (pulp.lpSum(gp) + pulp.lpSum(gd))
    prob += pulp.lpSum(z.values()) == 1, "one_decode_class"
    prob += scale * pulp.lpSum(gp) >= 1.0, "prefill_goodput"
    prob += scale * pulp.lpSum(gd) >= 1.0, "decode_goodput"
    prob += scale * pulp.lpSum(eg) >= 1.0, "kv_link_egress"
    prob += scale * pulp.lpSum(ing) >= 1.0, "kv_link_ingress"
    if max_gpus is not None:
        prob += pulp.lpSum(gpus) <= max_gpus, "gpu_limit"
    solver, name = _pulp_solver(time_limit_s, 1e-6)
    prob.solve(solver)
    status = pulp.LpStatus[prob.status]
    if prob.status == pulp.LpStatusInfeasible:
        return {}, name, "infeasible"
    if prob.sol_status not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        raise SolverError(f"PD MILP ended with status {status!r} and no solution")
    optimal = prob.sol_status == pulp.LpSolutionOptimal
    sol = {key: round(float(v.value() or 0.0)) for key, v in {**n, **m}.items()}
    return sol, name, "optimal" if optimal else "time_limit"


@one_blas_thread()
def plan_pd(
    model: ModelSpec,
    workload: Workload,
    slo: SLO,
    rate_per_s: float,
    *,
    prefill_devices: Sequence[Device],
    decode_devices: Sequence[Device] | None = None,
    dtype: str = "bf16",
    kv_dtype: str = "bf16",
    decode_batch_caps: Sequence[int | None] = (None,),
    placement: str = "auto",
    max_gpus: int | None = None,
    prices: dict[str, float] | None = None,
    baseline: bool = True,
    time_limit_s: float = 10.0,
    profiles: PhaseProfiles | None = None,
    kv_capacity_tokens: Mapping[tuple[str, int], int] | None = None,
    ep: int = 1,
    dp: int = 1,
    engine: EngineSpec = None,
) -> PDPlan:
    """Least-cost disaggregated plan for ``rate_per_s`` (see the module docstring).

    ``ep``/``dp``: expert parallelism and attention data parallelism of every prefill
    and decode instance (``perfmodel.plan.ParallelPlan``); TPs with ``ep ∤ tp·dp`` are
    skipped. The colocated baseline stays without them.

    ``profiles``: calibrated phase cost profiles by ``(phase, device id, TP)``, used
    instead of the roofline for those configurations (the colocated baseline stays on
    the roofline: the queueing layer takes no calibrated profile); ``kv_capacity_tokens``:
    measured decode KV capacities by ``(device id, TP)``. ``engine``: the serving engine
    of every instance and of the baseline, or a spec resolved per device (``"auto"``).
    """
    check_rate(rate_per_s)
    if max_gpus is not None and max_gpus < 1:
        raise SpecError(f"--max-gpus must be a positive integer, got {max_gpus}")
    if time_limit_s <= 0:
        raise SpecError(f"time limit must be > 0 s, got {time_limit_s}")
    t0 = time.perf_counter()
    decode_devices = list(decode_devices or prefill_devices)
    lengths = workload.lengths
    opts = evaluate_options(
        model,
        lengths,
        slo,
        prefill_devices=prefill_devices,
        decode_devices=decode_devices,
        dtype=dtype,
        kv_dtype=kv_dtype,
        decode_batch_caps=decode_batch_caps,
        placement=placement,
        profiles=profiles,
        kv_capacity_tokens=kv_capacity_tokens,
        ep=ep,
        dp=dp,
        engine=engine,
    )
    check_feasible(opts, slo)
    kw = {"prices": prices, "time_limit_s": time_limit_s}
    sol, solver, status = _solve(opts, rate_per_s, max_gpus=max_gpus, **kw)  # type: ignore[arg-type]
    if status == "infeasible":
        unl, _, st2 = _solve(opts, rate_per_s, max_gpus=None, **kw)  # type: ignore[arg-type]
        need = (
            sum(v * _cfg(opts, key).config.gpus for key, v in unl.items())
            if st2 != "infeasible"
            else None
        )
        raise InfeasibleError(
            f"--max-gpus {max_gpus} is too few for {rate_per_s:g} req/s (binding constraint: "
            f"gpu_limit); the cheapest plan needs {need} GPUs -- raise the limit or the SLOs"
        )
    return _result(
        model,
        workload,
        slo,
        rate_per_s,
        opts,
        sol,
        solver=solver,
        status=status,
        max_gpus=max_gpus,
        prices=prices,
        baseline=baseline,
        devices=prefill_devices,
        dtype=dtype,
        kv_dtype=kv_dtype,
        t0=t0,
        engine=engine,
    )


def _cfg(opts: PhaseOptions, key: tuple[Any, ...]) -> PhaseGoodput:
    phase, cls, i = key
    return (opts.prefill if phase == "p" else opts.decode)[cls][i]


def _result(
    model: ModelSpec,
    workload: Workload,
    slo: SLO,
    rate: float,
    opts: PhaseOptions,
    sol: dict[tuple[Any, ...], int],
    *,
    solver: str,
    status: str,
    max_gpus: int | None,
    prices: dict[str, float] | None,
    baseline: bool,
    devices: Sequence[Device],
    dtype: str,
    kv_dtype: str,
    t0: float,
    engine: EngineSpec = None,
) -> PDPlan:
    pre: list[Allocation] = []
    dec: list[Allocation] = []
    cls = None
    for key, v in sorted(sol.items(), key=lambda kv: str(kv[0])):
        if v <= 0:
            continue
        g = _cfg(opts, key)
        cls = key[1]
        a = Allocation(
            "prefill" if key[0] == "p" else "decode",
            g.config,
            v,
            g.rate_per_s,
            g.limiter,
            _price(g.config.device, prices) * g.config.gpus,
        )
        (pre if key[0] == "p" else dec).append(a)
    assert cls is not None
    goods = {key: _cfg(opts, key) for key, v in sol.items() if v > 0}
    cap_p = sum(g.rate_per_s * sol[k] for k, g in goods.items() if k[0] == "p")
    cap_d = sum(g.rate_per_s * sol[k] for k, g in goods.items() if k[0] == "d")
    cap_e = sum(g.link_capacity_per_s * sol[k] for k, g in goods.items() if k[0] == "p")
    cap_i = sum(g.link_capacity_per_s * sol[k] for k, g in goods.items() if k[0] == "d")
    gpus = sum(a.gpus for a in pre + dec)
    rows = [
        Constraint("prefill_goodput", rate, cap_p, cap_p / rate - 1),
        Constraint("decode_goodput", rate, cap_d, cap_d / rate - 1),
        Constraint("kv_link_egress", rate, cap_e, cap_e / rate - 1),
        Constraint("kv_link_ingress", rate, cap_i, cap_i / rate - 1),
    ]
    if max_gpus is not None:
        rows.append(Constraint("gpu_limit", max_gpus, gpus, (max_gpus - gpus) / max_gpus))
    tight = min(rows, key=lambda r: r.slack)
    binding = tight.name
    if binding == "prefill_goodput" and all(a.limiter == "kv-link" for a in pre):
        binding = "kv_link_egress"
    rows = [Constraint(r.name, r.required, r.provided, r.slack, r.name == tight.name) for r in rows]
    capacity = min(cap_p, cap_d, cap_e, cap_i)
    colo = None
    gain = colo_gpus = fluid_gain = None
    fluid = fluid_optimum(opts).per_gpu_rate_per_s
    if baseline:
        colo = colocated_baseline(
            model, workload, slo, devices=devices, dtype=dtype, kv_dtype=kv_dtype, engine=engine
        )
        if colo.feasible:
            colo_gpus = math.ceil(rate / colo.goodput_per_instance_per_s - 1e-9) * colo.tp
            gain = colo_gpus / gpus
            fluid_gain = fluid / colo.per_gpu_rate_per_s
    dep = Deployment(
        model=model,
        prefill=tuple(Pool(a.config, a.instances, a.goodput_per_instance_per_s) for a in pre),
        decode=tuple(Pool(a.config, a.instances, a.goodput_per_instance_per_s) for a in dec),
        placement="scale-out" if opts.links[cls].startswith("scale-out") else "auto",
    )
    cost = sum(a.cost_per_instance * a.instances for a in pre + dec)
    return PDPlan(
        model=model.id,
        workload=workload.name,
        rate_per_s=rate,
        slo=slo,
        link=opts.links[cls],
        prefill=tuple(pre),
        decode=tuple(dec),
        gpus=gpus,
        cost=cost,
        cost_unit="USD/h" if prices is not None else "GPU",
        capacity_rate_per_s=capacity,
        goodput_per_gpu=capacity / gpus,
        constraints=tuple(rows),
        binding=binding,
        colocated=colo,
        gain=gain,
        colocated_gpus=colo_gpus,
        fluid_per_gpu=fluid,
        fluid_gain=fluid_gain,
        solver=solver,
        status=status,
        solve_s=time.perf_counter() - t0,
        deployment=dep,
    )
