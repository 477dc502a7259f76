"""The search space of the fleet planner: every feasible instance configuration per device.

For each device type: tensor-parallel degrees within its scale-up domain that the model
allows, the dtype the device computes in (bf16, else fp16: quantized weights change the
model's output and are the operator's choice, not the planner's), memory fit and KV
capacity (``perfmodel.memory``), then the goodput under the SLO from the queueing layer:

* *colocated* instances (chunked prefill): ``perfmodel.queueing.service_rate`` and
  ``goodput`` (the largest Poisson rate whose SLO attainment meets the goal);
* *prefill/decode* roles (``--allow-pd``, :mod:`solvers.fleet.pd_roles`): ``evaluate_options``,
  whose prefill goodputs depend on the decode class receiving the KV cache (the link).

The preset workloads are discretized on a 64 × 64 grid refined in the tails for
planning (:mod:`solvers.fleet.planning`; the presets use 512 × 512).
Goodput is searched to 1 % (the capacity command uses 0.1 %).
Every evaluation is cached on disk (:mod:`solvers.fleet.cache`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hardware.device import Device
from hardware.engine import Engine, engine_for
from perfmodel.errors import InfeasibleError, SpecError
from perfmodel.model import ModelSpec
from perfmodel.plan import ParallelPlan
from perfmodel.workload.presets import Workload
from perfmodel.workload.slo import SLO
from solvers.fleet.cache import Job, digest, run_jobs
from solvers.fleet.milp import FleetOption
from solvers.fleet.planning import planning_workload as planning_workload  # re-export
from solvers.fleet.prune import dominates

TP_CANDIDATES = (1, 2, 4, 8)
GOODPUT_REL_TOL = 0.01
DEFAULT_MAX_BATCHED_TOKENS = 8192
ROLES = ("colocated", "prefill", "decode")


@dataclass(frozen=True)
class Candidate:
    """One instance configuration of one device type in one role, with its goodput."""

    device: Device = field(repr=False)
    tp: int
    pp: int
    dtype: str
    role: str  # colocated | prefill | decode
    goodput_per_instance_per_s: float  # largest rate meeting the SLO goal (0: never)
    capacity_per_instance_per_s: float  # stability limit μ of one instance
    limiter: str  # what bounds the goodput (compute, memory, ttft, tpot, kv-link, ...)
    kv_capacity_tokens: int
    max_batched_tokens: int
    link_capacity_per_s: float = math.inf  # KV egress (prefill) / ingress (decode)
    decode_class: str = ""  # PD: the decode class (device/TP) the KV goes to or comes from
    link: str = ""
    note: str = ""
    phase_config: Any = field(default=None, repr=False, compare=False)
    #: request-size buckets (``--buckets``): goodput and service rate on each bucket alone
    bucket_goodput_per_s: tuple[float, ...] = ()
    bucket_capacity_per_s: tuple[float, ...] = ()

    @property
    def devices(self) -> int:
        return self.tp * self.pp

    @property
    def feasible(self) -> bool:
        return self.goodput_per_instance_per_s > 0

    @property
    def label(self) -> str:
        pp = f"xPP{self.pp}" if self.pp > 1 else ""
        return f"{self.device.id} TP{self.tp}{pp} {self.dtype} {self.role}"

    @property
    def key(self) -> str:
        return (
            f"{self.device.id}/tp{self.tp}/pp{self.pp}/{self.dtype}/{self.role}/{self.decode_class}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device.id,
            "tp": self.tp,
            "pp": self.pp,
            "dtype": self.dtype,
            "role": self.role,
            "goodput_per_instance_per_s": self.goodput_per_instance_per_s,
            "capacity_per_instance_per_s": self.capacity_per_instance_per_s,
            "limiter": self.limiter,
            "kv_capacity_tokens": self.kv_capacity_tokens,
            "max_batched_tokens": self.max_batched_tokens,
            "link_capacity_per_s": (
                None if math.isinf(self.link_capacity_per_s) else self.link_capacity_per_s
            ),
            "decode_class": self.decode_class or None,
            "link": self.link or None,
            "note": self.note,
        }


def compute_dtype(device: Device) -> str | None:
    """bf16 where the device has it, else fp16; None when it has neither."""
    for dt in ("bf16", "fp16"):
        try:
            device.peak(dt)
        except SpecError:
            continue
        return dt
    return None


#: Devices of one PCIe-only server (no scale-up link): TP runs over the host link there
#: (``hardware.comm.link_for_group``); 8 cards is the usual L40S / H100 PCIe server.
PCIE_HOST_DEVICES = 8


def tp_degrees(model: ModelSpec, device: Device, tps: Sequence[int] = TP_CANDIDATES) -> list[int]:
    """TP degrees the model allows within one node (scale-up domain, or a PCIe host)."""
    from hardware.comm import scale_up_domain_size

    domain = scale_up_domain_size(device)
    if domain == 1:
        domain = PCIE_HOST_DEVICES
    return [tp for tp in model.valid_tps(tps) if tp <= domain]


def _key_device(d: Device) -> Device:
    return replace(d, path="")


class Unsearched(str):
    """Why a configuration has no candidate because it is dominated (:func:`dominated_by`):
    a rejection reason that says its goodput was not searched to the end."""

    __slots__ = ()


def _unit_option(tp: int, goodput_per_s: float) -> FleetOption:
    """A colocated instance at TP ``tp`` of one device type, priced per device."""
    return FleetOption(f"tp{tp}", "one device type", tp, float(tp), goodput_per_s=(goodput_per_s,))


def dominance(tp: int, smaller: Sequence[Candidate | str]) -> tuple[float, Candidate] | None:
    """The largest goodput a configuration at TP ``tp`` can have and still be dominated
    (the fleet MILP's own rule, :func:`solvers.fleet.prune.dominates`: ``k`` instances
    of a smaller TP ``t`` of the same device, ``k = tp/t``, at no more cost), and the
    candidate that dominates it; None if none does. ``k`` must be a power of two: then
    ``k·(price·t)`` equals ``price·tp`` to the bit whatever the price, so the verdict
    holds in every priced MILP. The MILP drops a dominated option whatever its goodput
    (and what it would have dominated, the smaller one dominates too)."""
    best: tuple[float, Candidate] | None = None
    for a in smaller:
        if isinstance(a, str) or not a.feasible or tp % a.tp:
            continue
        k = tp // a.tp
        top = k * a.goodput_per_instance_per_s
        if k & (k - 1) or (best is not None and top <= best[0]):
            continue
        if dominates(_unit_option(a.tp, a.goodput_per_instance_per_s), _unit_option(tp, top),
                      frozenset()):  # fmt: skip
            best = (top, a)
    return best


def dominated_by(tp: int, bound_per_s: float, smaller: Sequence[Candidate | str]) -> str | None:
    """Why a colocated configuration at TP ``tp`` whose goodput is below ``bound_per_s``
    (its service rate, or a rate that misses the SLO) need not be searched (further), or
    None (:func:`dominance`)."""
    d = dominance(tp, smaller)
    if d is None or d[0] < bound_per_s:
        return None
    serve, a = d
    return Unsearched(
        f"dominated by TP{a.tp}: {tp // a.tp} of its instances serve {serve:.3g} req/s at the "
        f"same price, and this configuration's goodput is below {bound_per_s:.3g} req/s "
        "(goodput not searched to the end)"
    )


def _evaluate_one(
    model: ModelSpec,
    device: Device,
    plan: ParallelPlan,
    workload: Workload,
    slo: SLO,
    B: int,
    engine: Engine | None = None,
    *smaller: Candidate | str,
) -> Candidate | str:
    """The candidate, or why there is none; ``smaller``: the same device's candidates at
    smaller TP degrees (:func:`dominated_by`)."""
    from perfmodel.serving import service as q
    from perfmodel.serving.goodput import GoodputAtMost, goodput
    from perfmodel.step.instance import Instance

    try:
        sr = q.service_rate(
            Instance(model, device, plan, engine=engine), workload, max_batched_tokens=B
        )
    except (InfeasibleError, SpecError) as e:
        return f"{device.id} TP{plan.tp}: {e}"
    why = dominated_by(plan.tp, sr.rate_per_s, smaller)
    if why is None:
        d = dominance(plan.tp, smaller)
        try:
            gp = goodput(sr, slo, rel_tol=GOODPUT_REL_TOL, ceiling=None if d is None else d[0])
        except GoodputAtMost as e:
            why = dominated_by(plan.tp, e.bound_per_s, smaller)
    if why is not None:
        return Unsearched(f"{device.id} TP{plan.tp}: {why}")
    return Candidate(
        device=device,
        tp=plan.tp,
        pp=plan.pp,
        dtype=plan.weight_dtype,
        role="colocated",
        goodput_per_instance_per_s=gp.rate_per_s if gp.feasible else 0.0,
        capacity_per_instance_per_s=sr.rate_per_s,
        limiter=sr.binding if gp.feasible else "slo",
        kv_capacity_tokens=sr.kv_capacity_tokens,
        max_batched_tokens=B,
        note=gp.explanation,
    )


def colocated_jobs(
    model: ModelSpec,
    workload: Workload,
    slo: SLO,
    devices: Sequence[Device],
    *,
    max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS,
    tps: Sequence[int] = TP_CANDIDATES,
    engine: str | None = None,
    skip_dominated: bool = True,
) -> tuple[list[tuple[Device, Job]], list[str]]:
    """One cacheable evaluation per (device, TP), and the devices rejected outright.

    ``engine``: the serving engine, resolved per device (``"auto"``: each device's
    default; ``None``: the engine-less roofline). ``skip_dominated``: a TP degree's job
    takes the results of the same device's smaller degrees and is not searched when they
    dominate it (:func:`dominated_by`; the jobs of one device then run one after another,
    those of different devices side by side). Off for bucketed plans, whose options are
    compared per bucket."""
    jobs: list[tuple[Device, Job]] = []
    rejected: list[str] = []
    lw = workload.lengths
    for dev in devices:
        dt = compute_dtype(dev)
        if dt is None:
            rejected.append(f"{dev.id}: no bf16 or fp16 math")
            continue
        eng = engine_for(engine, dev)
        degrees = sorted(tp_degrees(model, dev, tps))
        if not degrees:
            rejected.append(f"{dev.id}: no TP degree of {tps} fits its scale-up domain")
        keys: list[str] = []
        for tp in degrees:
            plan = ParallelPlan(tp=tp, weight_dtype=dt, act_dtype=dt, kv_dtype=dt)
            key = digest(
                "colocated", model, _key_device(dev), plan, lw.input_tokens, lw.output_tokens,
                lw.weights, workload.arrival_cv, slo, max_batched_tokens, GOODPUT_REL_TOL, eng,
                tuple(degrees) if skip_dominated else None,
            )  # fmt: skip
            fn = functools.partial(
                _evaluate_one, model, dev, plan, workload, slo, max_batched_tokens, eng
            )
            after = tuple(keys) if skip_dominated else ()
            jobs.append((dev, Job("colocated", key, fn, after)))
            keys.append(key)
    return jobs, rejected


def colocated_results(
    jobs: Sequence[tuple[Device, Job]], values: Sequence[Candidate | str]
) -> tuple[list[Candidate], list[str]]:
    out: list[Candidate] = []
    rejected: list[str] = []
    for (dev, _), r in zip(jobs, values, strict=True):
        if isinstance(r, str):
            rejected.append(r)
        else:
            out.append(replace(r, device=dev))
    return out, rejected


@dataclass(frozen=True)
class Bucket:
    """Requests whose input length is in ``[lo_tokens, hi_tokens]``: a share of the traffic."""

    label: str
    lo_tokens: int
    hi_tokens: int
    weight: float
    workload: Workload = field(repr=False)


def size_buckets(workload: Workload, n: int) -> tuple[Bucket, ...]:
    """``n`` buckets of (about) equal probability by input length (Mélange's request-size
    buckets, one-dimensional): each bucket's workload is the conditional length law."""
    import numpy as np

    from perfmodel.workload.lengths import LengthDistribution

    if n < 1:
        raise SpecError(f"--buckets must be >= 1, got {n}")
    lw = workload.lengths
    order = np.argsort(lw.input_tokens, kind="stable")
    cdf = np.cumsum(lw.weights[order]) - 0.5 * lw.weights[order]
    which = np.minimum((cdf * n).astype(int), n - 1)
    out = []
    for b in range(n):
        idx = order[which == b]
        if idx.size == 0:
            continue
        w = lw.weights[idx]
        s = lw.input_tokens[idx]
        label = f"input {int(s.min())}-{int(s.max())} tokens"
        lengths = LengthDistribution(f"{lw.name}[{label}]", s, lw.output_tokens[idx], w / w.sum())
        out.append(
            Bucket(
                label,
                int(s.min()),
                int(s.max()),
                float(w.sum()),
                Workload(f"{workload.name}[{label}]", lengths, workload.arrival_cv),
            )
        )
    return tuple(out)


def with_buckets(
    cands: Sequence[Candidate],
    model: ModelSpec,
    buckets: Sequence[Bucket],
    slo: SLO,
    devices: Sequence[Device],
    *,
    max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS,
    use_cache: bool = True,
    engine: str | None = None,
) -> list[Candidate]:
    """The colocated candidates with their goodput and service rate on every bucket."""
    per_jobs = [
        colocated_jobs(
            model,
            b.workload,
            slo,
            devices,
            max_batched_tokens=max_batched_tokens,
            engine=engine,
            skip_dominated=False,
        )[0]
        for b in buckets
    ]
    values = run_jobs([j for js in per_jobs for _, j in js], enabled=use_cache)
    per: list[dict[str, Candidate]] = []
    at = 0
    for js in per_jobs:
        cs, _ = colocated_results(js, values[at : at + len(js)])
        at += len(js)
        per.append({c.key: c for c in cs})
    out = []
    for c in cands:
        if c.role != "colocated":
            out.append(c)
            continue
        got = [m.get(c.key) for m in per]
        g = tuple(x.goodput_per_instance_per_s if x else 0.0 for x in got)
        mu = tuple(x.capacity_per_instance_per_s if x else 0.0 for x in got)
        out.append(replace(c, bucket_goodput_per_s=g, bucket_capacity_per_s=mu))
    return out
