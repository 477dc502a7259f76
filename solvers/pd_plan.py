"""PD planner: prefill/decode instance counts and parallelism at least cost under both SLOs.

1. **Enumerate** per-phase configurations: device type × TP (× decode batch cap). Each
   prefill configuration is evaluated against every decode *class* (device, TP), since
   the KV transfer in its TTFT depends on the receiver (``perfmodel.pd_models``).
2. **MILP** (PuLP, HiGHS): pick exactly one decode class ``c`` (binary ``z_c``) and
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
   plan with the most spare goodput among equal-cost ones.
3. **Colocated baseline**: the best goodput per GPU of the same device(s) serving both
   phases with chunked prefill (``perfmodel.queueing``), under the same SLO criterion.
   Compared like with like: ``gain`` at the plan's rate (whole instances on both
   sides: colocated GPUs needed for λ / plan GPUs) and ``fluid_gain`` at scale
   (fractional instances on both sides: :func:`fluid_optimum` per GPU / colocated per
   GPU), so integer rounding at small λ cannot decide the verdict at scale.

The SLO criterion is DistServe's: the ``slo.percentile`` quantile of TTFT and that of
TPOT both within their targets.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hardware.device import Device
from hardware.maxaffine import MaxAffine
from perfmodel.errors import InfeasibleError, SolverError, SpecError
from perfmodel.memory import describe_shortfall, memory_fit
from perfmodel.model import ModelSpec
from perfmodel.parallel import ParallelPlan
from perfmodel.pd_models import (
    DecodeProfile,
    PhaseConfig,
    PhaseGoodput,
    decode_goodput,
    decode_profile,
    kv_link,
    prefill_goodput,
    prefill_profile,
)
from perfmodel.queueing import latency, service_rate, slo_attainment
from perfmodel.simulate_pd import Deployment, Pool
from perfmodel.workload import SLO, LengthDistribution, Workload, check_rate

TP_CANDIDATES = (1, 2, 4, 8)
COLOCATED_BUDGET_TOKENS = 2048  # chunked-prefill token budget of the baseline (Sarathi-Serve)
_TIE_BREAK = 1e-4


# ---- results ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Allocation:
    """Instances of one configuration in a plan."""

    phase: str
    config: PhaseConfig
    instances: int
    goodput_per_instance_per_s: float
    limiter: str
    cost_per_instance: float

    @property
    def gpus(self) -> int:
        return self.instances * self.config.gpus

    def to_dict(self) -> dict[str, Any]:
        c = self.config
        return {
            "phase": self.phase,
            "device": c.device.id,
            "tp": c.plan.tp,
            "batch_cap": c.batch_cap,
            "instances": self.instances,
            "gpus": self.gpus,
            "goodput_per_instance_per_s": self.goodput_per_instance_per_s,
            "limiter": self.limiter,
        }


@dataclass(frozen=True)
class Constraint:
    """One MILP constraint at the solution: what it needs, what the plan provides."""

    name: str
    required: float
    provided: float
    slack: float  # (provided − required)/required for ≥ rows; (limit − used)/limit for ≤
    binding: bool = False


@dataclass(frozen=True)
class Colocated:
    """Best colocated (chunked-prefill) configuration of the same devices."""

    feasible: bool
    device: str
    tp: int
    max_batched_tokens: int
    goodput_per_instance_per_s: float
    per_gpu_rate_per_s: float
    note: str


@dataclass(frozen=True)
class PDPlan:
    """A disaggregated plan, its slack, and how it compares with colocated serving."""

    model: str
    workload: str
    rate_per_s: float
    slo: SLO
    link: str
    prefill: tuple[Allocation, ...]
    decode: tuple[Allocation, ...]
    gpus: int
    cost: float
    cost_unit: str  # "GPU" | "USD/h"
    capacity_rate_per_s: float  # goodput of the allocation: min over the ≥ constraints
    goodput_per_gpu: float  # capacity / GPUs
    constraints: tuple[Constraint, ...]
    binding: str
    colocated: Colocated | None
    gain: float | None  # at λ: GPUs colocated serving needs / GPUs of this plan (both whole)
    colocated_gpus: int | None  # GPUs colocated serving needs for λ (whole instances)
    fluid_per_gpu: float  # rate-free optimum: goodput per GPU with fractional instances
    fluid_gain: float | None  # at scale: fluid_per_gpu / colocated goodput per GPU
    solver: str
    status: str
    solve_s: float
    deployment: Deployment = field(repr=False)

    @property
    def prefill_instances(self) -> int:
        return sum(a.instances for a in self.prefill)

    @property
    def decode_instances(self) -> int:
        return sum(a.instances for a in self.decode)

    @property
    def ratio(self) -> float:
        """Prefill : decode instances."""
        return self.prefill_instances / self.decode_instances

    @property
    def gpu_ratio(self) -> float:
        """Prefill : decode GPUs."""
        return sum(a.gpus for a in self.prefill) / sum(a.gpus for a in self.decode)

    @property
    def verdict(self) -> str:
        if self.colocated is None:
            return "colocated baseline not evaluated"
        if not self.colocated.feasible:
            return "disaggregation wins: colocated serving cannot meet these SLOs at any rate"
        assert self.gain is not None and self.fluid_gain is not None
        word = "wins" if self.gain > 1 else ("ties" if self.gain == 1 else "loses")
        scale = "wins" if self.fluid_gain > 1 else "loses"
        return (
            f"disaggregation {word} at {self.rate_per_s:g} req/s: {self.gpus} vs "
            f"{self.colocated_gpus} GPUs colocated ({self.gain:.2f}x); at scale (fractional "
            f"instances) it {scale}: {self.fluid_per_gpu:.3g} vs "
            f"{self.colocated.per_gpu_rate_per_s:.3g} req/s per GPU ({self.fluid_gain:.2f}x)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "workload": self.workload,
            "rate_per_s": self.rate_per_s,
            "slo": {
                "ttft_ms": self.slo.ttft_s * 1e3,
                "tpot_ms": self.slo.tpot_s * 1e3,
                "percentile": self.slo.percentile,
            },
            "kv_link": self.link,
            "prefill": [a.to_dict() for a in self.prefill],
            "decode": [a.to_dict() for a in self.decode],
            "ratio_prefill_to_decode_instances": self.ratio,
            "ratio_prefill_to_decode_gpus": self.gpu_ratio,
            "gpus": self.gpus,
            "cost": self.cost,
            "cost_unit": self.cost_unit,
            "capacity_rate_per_s": self.capacity_rate_per_s,
            "goodput_per_gpu": self.goodput_per_gpu,
            "binding": self.binding,
            "constraints": [vars(c) for c in self.constraints],
            "colocated": vars(self.colocated) if self.colocated else None,
            "gain": self.gain,
            "colocated_gpus": self.colocated_gpus,
            "fluid_per_gpu": self.fluid_per_gpu,
            "fluid_gain": self.fluid_gain,
            "verdict": self.verdict,
            "solver": self.solver,
            "status": self.status,
            "solve_s": self.solve_s,
        }


# ---- enumeration -----------------------------------------------------------------------------


@dataclass(frozen=True)
class PhaseOptions:
    """Evaluated configurations: prefill per decode class, decode per class."""

    prefill: dict[tuple[str, int], list[PhaseGoodput]]
    decode: dict[tuple[str, int], list[PhaseGoodput]]
    links: dict[tuple[str, int], str]
    profiles: dict[tuple[str, int], list[DecodeProfile]]


def _plan(tp: int, dtype: str, kv_dtype: str) -> ParallelPlan:
    return ParallelPlan(tp=tp, weight_dtype=dtype, act_dtype=dtype, kv_dtype=kv_dtype)


def _valid_tps(model: ModelSpec, tps: Sequence[int] = TP_CANDIDATES) -> list[int]:
    out = []
    for tp in tps:
        try:
            model.check_tp(tp)
        except SpecError:
            continue
        out.append(tp)
    return out


#: Calibrated phase profiles, keyed ``(phase, device id, TP)``.
PhaseProfiles = Mapping[tuple[str, str, int], MaxAffine]


def _phase_tps(
    model: ModelSpec, phase: str, dev: Device, tps: Sequence[int], profiles: PhaseProfiles | None
) -> list[tuple[int, MaxAffine | None]]:
    """TP degrees to enumerate for a phase on a device, with their calibrated profiles.

    A phase with a calibrated profile for some TP on this device is enumerated only at
    the TPs that have one (a measured profile is not mixed with roofline configurations
    of the same phase and device); otherwise every valid TP, costed by the roofline.
    """
    valid = _valid_tps(model, tps)
    mine = {k[2]: v for k, v in (profiles or {}).items() if k[:2] == (phase, dev.id)}
    if not mine:
        return [(tp, None) for tp in valid]
    return [(tp, mine[tp]) for tp in valid if tp in mine]


def evaluate_options(
    model: ModelSpec,
    lengths: LengthDistribution,
    slo: SLO,
    *,
    prefill_devices: Sequence[Device],
    decode_devices: Sequence[Device],
    dtype: str = "bf16",
    kv_dtype: str = "bf16",
    decode_batch_caps: Sequence[int | None] = (None,),
    placement: str = "auto",
    tp_candidates: Sequence[int] = TP_CANDIDATES,
    profiles: PhaseProfiles | None = None,
    kv_capacity_tokens: Mapping[tuple[str, int], int] | None = None,
) -> PhaseOptions:
    """Per-instance goodputs of every configuration that fits (see the module docstring).

    ``profiles``: calibrated phase cost profiles by ``(phase, device id, TP)`` (see
    :func:`_phase_tps`); configurations without one are costed by the roofline.
    ``kv_capacity_tokens``: measured decode KV capacities by ``(device id, TP)``
    (default: ``memory_fit``).
    Raises InfeasibleError when the model fits no configuration of a phase.
    """
    max_in = int(lengths.input_tokens.max())
    pre_cfgs: list[PhaseConfig] = []
    short: list[str] = []
    for dev in prefill_devices:
        for tp, prof in _phase_tps(model, "prefill", dev, tp_candidates, profiles):
            plan = _plan(tp, dtype, kv_dtype)
            fit = memory_fit(
                model, dev, plan, batch=2, context_len=max_in, max_batched_tokens=max_in
            )
            if fit.fits:
                pre_cfgs.append(PhaseConfig("prefill", dev, plan, profile=prof))
            else:
                short.append(describe_shortfall(fit, model, dev, tp))
    if not pre_cfgs:
        raise InfeasibleError(
            f"{model.id} fits no prefill configuration (TP {', '.join(map(str, tp_candidates))}): "
            + "; ".join(short[-1:])
        )
    dec: dict[tuple[str, int], list[PhaseGoodput]] = {}
    profs: dict[tuple[str, int], list[DecodeProfile]] = {}
    links: dict[tuple[str, int], str] = {}
    reasons: list[str] = []
    probe_p = pre_cfgs[0]
    for dev in decode_devices:
        for tp, cost in _phase_tps(model, "decode", dev, tp_candidates, profiles):
            for cap in decode_batch_caps:
                kv = (kv_capacity_tokens or {}).get((dev.id, tp))
                cfg = PhaseConfig("decode", dev, _plan(tp, dtype, kv_dtype), cap, cost, kv)
                try:
                    link = kv_link(
                        probe_p, cfg, "scale-out" if placement == "scale-out" else "auto"
                    )
                    dprof = decode_profile(model, cfg, lengths, link=link)
                except InfeasibleError as e:
                    reasons.append(str(e))
                    continue
                dec.setdefault((dev.id, tp), []).append(decode_goodput(dprof, slo))
                profs.setdefault((dev.id, tp), []).append(dprof)
    if not dec:
        raise InfeasibleError(
            f"{model.id} fits no decode configuration: " + (reasons[-1] if reasons else "")
        )
    pre: dict[tuple[str, int], list[PhaseGoodput]] = {}
    for cls, goods in dec.items():
        dcfg = goods[0].config
        for pc in pre_cfgs:
            try:
                pprof = prefill_profile(model, pc, lengths, decode=dcfg, placement=placement)
            except SpecError:
                continue  # this pair cannot use the requested placement
            pre.setdefault(cls, []).append(prefill_goodput(pprof, slo, model=model))
            links.setdefault(cls, pprof.link.name)
    return PhaseOptions(pre, dec, links, profs)


def _check_feasible(opts: PhaseOptions, slo: SLO) -> None:
    """Clear errors when no configuration of a phase can meet its SLO even unloaded."""
    q = f"p{slo.percentile * 100:g}"
    pre = [g for gs in opts.prefill.values() for g in gs]
    if not any(g.feasible for g in pre):
        best = min(pre, key=lambda g: g.floor_s)
        if best.limiter == "kv-link":
            raise InfeasibleError(
                f"the KV link is too slow (binding constraint: kv-link): {best.note}; the "
                f"TTFT SLO {slo.ttft_s * 1e3:.0f} ms cannot be met -- use a faster link "
                "(--kv-link scale-up) or raise --ttft-slo-ms"
            )
        raise InfeasibleError(
            f"TTFT SLO {slo.ttft_s * 1e3:.0f} ms is below the unloaded {q} TTFT floor of "
            f"{best.floor_s * 1e3:.1f} ms (best: {best.config.label}, {best.note}); raise "
            f"--ttft-slo-ms to at least {math.ceil(best.floor_s * 1e3)}"
        )
    dec = [g for gs in opts.decode.values() for g in gs]
    if not any(g.feasible for g in dec):
        best = min(dec, key=lambda g: g.floor_s)
        raise InfeasibleError(
            f"TPOT SLO {slo.tpot_s * 1e3:.1f} ms is below the unloaded {q} TPOT floor of "
            f"{best.floor_s * 1e3:.2f} ms (best: {best.config.label}); raise --tpot-slo-ms "
            f"to at least {math.ceil(best.floor_s * 1e4) / 10:.1f}"
        )


# ---- colocated baseline ----------------------------------------------------------------------


def colocated_baseline(
    model: ModelSpec,
    workload: Workload,
    slo: SLO,
    *,
    devices: Sequence[Device],
    dtype: str = "bf16",
    kv_dtype: str = "bf16",
    max_batched_tokens: int = COLOCATED_BUDGET_TOKENS,
    rel_tol: float = 0.02,
) -> Colocated:
    """Best per-GPU goodput of chunked-prefill instances under the percentile criterion.

    Configurations are visited in decreasing order of the upper bound ``μ/tp`` (goodput
    never exceeds the service rate ``μ``), stopping when the bound falls below the best
    goodput found (branch and bound: exact, and few goodput searches).
    """
    cands = []
    for dev in devices:
        for tp in _valid_tps(model):
            try:
                sv = service_rate(
                    model,
                    dev,
                    _plan(tp, dtype, kv_dtype),
                    workload,
                    max_batched_tokens=max_batched_tokens,
                )
            except (InfeasibleError, SpecError):
                continue
            if sv.largest_request_fits:
                cands.append(sv)
    cands.sort(key=lambda sv: -sv.rate_per_s / sv.devices)
    best: Colocated | None = None
    floors = []
    for sv in cands:
        if best is not None and sv.rate_per_s / sv.devices <= best.per_gpu_rate_per_s:
            break

        def ok(r: float, sv: Any = sv) -> bool:
            return slo_attainment(latency(sv, r), slo).meets_percentiles

        lo_rate = sv.rate_per_s * 1e-3
        if not ok(lo_rate):
            a = slo_attainment(latency(sv, lo_rate), slo)
            floors.append(
                f"TP{sv.devices}: p{slo.percentile * 100:g} TTFT {a.ttft_quantile_s * 1e3:.0f} ms, "
                f"TPOT {a.tpot_quantile_s * 1e3:.1f} ms unloaded"
            )
            continue
        lo, hi = lo_rate, sv.rate_per_s
        while hi - lo > rel_tol * hi:
            mid = 0.5 * (lo + hi)
            if ok(mid):
                lo = mid
            else:
                hi = mid
        per = lo / sv.devices
        if best is None or per > best.per_gpu_rate_per_s:
            best = Colocated(
                True,
                sv.device.id,
                sv.devices,
                max_batched_tokens,
                lo,
                per,
                f"{lo:.3g} req/s per TP{sv.devices} instance ({lo / sv.rate_per_s:.0%} of μ, "
                f"{sv.binding}-bound)",
            )
    if best is None:
        return Colocated(
            False,
            devices[0].id,
            0,
            max_batched_tokens,
            0.0,
            0.0,
            "no colocated configuration meets the SLO: " + "; ".join(floors or ["none fits"]),
        )
    return best


# ---- the MILP ----------------------------------------------------------------------------------


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
    for c in classes:
        for k, g in enumerate(opts.prefill[c]):
            if not g.feasible:
                continue
            u = math.ceil(rate / min(g.rate_per_s, g.link_capacity_per_s)) + 1
            v = pulp.LpVariable(f"n_{k}_{c[0]}_tp{c[1]}", 0, u, cat="Integer")
            n[("p", c, k)] = v
            prob += v <= u * z[c], f"select_p_{k}_{c[0]}_tp{c[1]}"
            price = _price(g.config.device, prices) * g.config.gpus
            cost.append(price * v)
            gp.append(g.rate_per_s * v)
            eg.append(g.link_capacity_per_s * v)
            gpus.append(g.config.gpus * v)
        for j, g in enumerate(opts.decode[c]):
            if not g.feasible:
                continue
            u = math.ceil(rate / min(g.rate_per_s, g.link_capacity_per_s)) + 1
            v = pulp.LpVariable(f"m_{j}_{c[0]}_tp{c[1]}", 0, u, cat="Integer")
            m[("d", c, j)] = v
            prob += v <= u * z[c], f"select_d_{j}_{c[0]}_tp{c[1]}"
            price = _price(g.config.device, prices) * g.config.gpus
            cost.append(price * v)
            gd.append(g.rate_per_s * v)
            ing.append(min(g.link_capacity_per_s, 1e6 * rate) * v)
            gpus.append(g.config.gpus * v)
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
) -> PDPlan:
    """Least-cost disaggregated plan for ``rate_per_s`` (see the module docstring).

    ``profiles``: calibrated phase cost profiles by ``(phase, device id, TP)``, used
    instead of the roofline for those configurations (the colocated baseline stays on
    the roofline: the queueing layer takes no calibrated profile); ``kv_capacity_tokens``:
    measured decode KV capacities by ``(device id, TP)``.
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
    )
    _check_feasible(opts, slo)
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
            model, workload, slo, devices=devices, dtype=dtype, kv_dtype=kv_dtype
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


# ---- rate-free optimum and DistServe's unit search -----------------------------------------------


@dataclass(frozen=True)
class FluidOptimum:
    """Best goodput per GPU as λ → ∞ (instance counts fractional): DistServe's ratio."""

    prefill: PhaseGoodput
    decode: PhaseGoodput
    per_gpu_rate_per_s: float  # 1 / (tp_p/g_p + tp_d/g_d)
    instance_ratio: float  # prefill : decode instances = g_d / g_p
    gpu_ratio: float  # prefill : decode GPUs


def fluid_optimum(opts: PhaseOptions) -> FluidOptimum:
    """The pair maximizing goodput per GPU with fractional instance counts."""
    best: FluidOptimum | None = None
    for c in set(opts.prefill) & set(opts.decode):
        for p in opts.prefill[c]:
            for d in opts.decode[c]:
                if not (p.feasible and d.feasible):
                    continue
                gp = min(p.rate_per_s, p.link_capacity_per_s)
                gd = min(d.rate_per_s, d.link_capacity_per_s)
                a, b = p.config.gpus / gp, d.config.gpus / gd
                f = FluidOptimum(p, d, 1.0 / (a + b), gd / gp, a / b)
                if best is None or f.per_gpu_rate_per_s > best.per_gpu_rate_per_s:
                    best = f
    if best is None:
        raise InfeasibleError("no prefill/decode pair of configurations meets both SLOs")
    return best


@dataclass(frozen=True)
class UnitChoice:
    """DistServe's search inside one node: one prefill + one decode instance, replicated."""

    tp_prefill: int
    tp_decode: int
    per_gpu_rate_per_s: float
    prefill_goodput_per_s: float
    decode_goodput_per_s: float
    table: tuple[tuple[int, int, float], ...]  # every (tp_p, tp_d, per-GPU rate) tried


def distserve_unit_search(opts: PhaseOptions, *, gpus_per_node: int) -> UnitChoice:
    """``max min(g_p, g_d)/(tp_p + tp_d)`` over ``tp_p + tp_d ≤ gpus_per_node`` (PP = 1).

    DistServe's low-node-affinity placement (Alg. 2 with one pipeline stage): a prefill
    and a decode instance share a node and the unit is replicated.
    """
    rows = []
    best = None
    for c in opts.decode:
        for d in opts.decode[c]:
            for p in opts.prefill.get(c, []):
                tp_p, tp_d = p.config.gpus, d.config.gpus
                if tp_p + tp_d > gpus_per_node:
                    continue
                r = min(p.rate_per_s, d.rate_per_s) / (tp_p + tp_d)
                rows.append((tp_p, tp_d, r))
                if best is None or r > best[2]:
                    best = (tp_p, tp_d, r, p.rate_per_s, d.rate_per_s)
    if best is None:
        raise InfeasibleError(f"no prefill + decode pair fits in {gpus_per_node} GPUs")
    return UnitChoice(best[0], best[1], best[2], best[3], best[4], tuple(sorted(rows)))
