"""When an SLO is out of reach on a configuration: say so, and find the cheapest change.

An SLO is *practical* on a configuration when its goodput per instance is at least
``MIN_GOODPUT_SHARE`` of the service rate μ. Below that the SLO is met only as the load
vanishes (the TPOT or TTFT quantile at zero load sits just under the target), and sizing
by goodput asks for hundreds or thousands of nearly idle instances: the honest answer is
"infeasible on this configuration" and the smallest change that makes it practical.

Candidate changes, one at a time from the given configuration: 8-bit weights and math
(``fp8``, where the device has the math), twice and four times the tensor parallelism
(within the scale-up domain), and every catalog device at the same TP. The cheapest is the
one needing the fewest devices for the arrival rate (the catalog has no prices).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from hardware.device import Device, catalog_ids, load_device
from perfmodel.errors import PerfModelError
from perfmodel.model import ModelSpec
from perfmodel.plan import ParallelPlan
from perfmodel.serving.goodput import Goodput, goodput, instances_needed
from perfmodel.serving.service import service_rate
from perfmodel.step.instance import Instance
from perfmodel.workload.presets import Workload
from perfmodel.workload.slo import SLO

#: Goodput below this share of μ is "met only at vanishing load": not a practical SLO.
MIN_GOODPUT_SHARE = 0.05


def practical(gp: Goodput, mu_per_s: float) -> bool:
    """The SLO is met at a load worth provisioning for (see the module docstring)."""
    return gp.feasible and gp.rate_per_s >= MIN_GOODPUT_SHARE * mu_per_s


@dataclass(frozen=True)
class Change:
    """A configuration that meets the SLO practically, and what it costs at the rate."""

    what: str  # e.g. "TP16", "fp8 weights and math", "device h200-sxm"
    device: str
    tp: int
    pp: int
    weight_dtype: str
    goodput_per_instance_per_s: float
    instances: int
    devices: int

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def _candidates(
    model: ModelSpec, device: Device, plan: ParallelPlan
) -> list[tuple[str, Device, ParallelPlan]]:
    out: list[tuple[str, Device, ParallelPlan]] = []
    if plan.weight_dtype != "fp8":  # a device without fp8 math is skipped when evaluated
        out.append(
            ("fp8 weights and math", device, replace(plan, weight_dtype="fp8", act_dtype="fp8"))
        )
    domain = max(1, device.scale_up.peers + 1)
    for k in (2, 4):
        tp = plan.tp * k
        if tp <= domain and model.heads % tp == 0:
            out.append((f"TP{tp}", device, replace(plan, tp=tp)))
    for dev_id in catalog_ids():
        if dev_id != device.id:
            out.append((f"device {dev_id}", load_device(dev_id), plan))
    return out


def cheapest_change(
    model: ModelSpec,
    device: Device,
    plan: ParallelPlan,
    workload: Workload,
    slo: SLO,
    rate_per_s: float,
    *,
    max_batched_tokens: int,
    target_utilization: float = 0.8,
) -> Change | None:
    """The candidate change (module docstring) with the fewest devices, or None."""
    best: Change | None = None
    for what, dev, p in _candidates(model, device, plan):
        try:
            model.check_tp(p.tp)
            sr = service_rate(
                Instance(model, dev, p), workload, max_batched_tokens=max_batched_tokens
            )
            gp = goodput(sr, slo)
        except PerfModelError:
            continue  # does not fit, lacks the dtype, ...
        if not practical(gp, sr.rate_per_s):
            continue
        size = instances_needed(
            sr,
            rate_per_s,
            target_utilization=target_utilization,
            goodput_per_instance_per_s=gp.rate_per_s,
        )
        c = Change(
            what=what,
            device=dev.id,
            tp=p.tp,
            pp=p.pp,
            weight_dtype=p.weight_dtype,
            goodput_per_instance_per_s=gp.rate_per_s,
            instances=size.instances,
            devices=size.devices,
        )
        if best is None or c.devices < best.devices:
            best = c
    return best


def goodput_share(gp: Goodput, mu_per_s: float) -> float:
    return gp.rate_per_s / mu_per_s if gp.feasible and mu_per_s > 0 else 0.0


def explain_infeasible(gp: Goodput, mu_per_s: float, change: Change | None) -> str:
    """One sentence: why the configuration is out, and the cheapest change (if any)."""
    if gp.feasible:
        why = (
            f"the SLO is met only near zero load (goodput {gp.rate_per_s:.3g} req/s per "
            f"instance, {goodput_share(gp, mu_per_s):.1%} of μ)"
        )
    else:
        why = gp.explanation
    head = f"infeasible on this configuration: {why}"
    if change is None:
        return head + "; no single change of dtype, TP or device makes it practical"
    return (
        f"{head}; cheapest feasible change: {change.what} ({change.instances} instances, "
        f"{change.devices} devices, goodput {change.goodput_per_instance_per_s:.3g} req/s each)"
    )


__all__ = [
    "MIN_GOODPUT_SHARE",
    "Change",
    "cheapest_change",
    "explain_infeasible",
    "goodput_share",
    "practical",
]
