"""The capacity answer for one instance type: service rate, stability, latency, goodput, size.

:func:`capacity` chains the queueing layer's steps (service rate → stability and latency
at the arrival rate → goodput under the SLO → instances needed) into one result object
whose :meth:`CapacityReport.to_dict` is the JSON of ``perfmodel capacity``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from perfmodel.serving.goodput import Goodput, Sizing, goodput, instances_needed, slo_attainment
from perfmodel.serving.latency import LatencyEstimate
from perfmodel.serving.remedy import Change, cheapest_change, explain_infeasible, practical
from perfmodel.serving.service import EngineLimits, ServiceRate, Stability, latency, stability
from perfmodel.step.instance import Instance
from perfmodel.units import MS_PER_S
from perfmodel.workload.presets import Workload
from perfmodel.workload.slo import SLO

#: Share of μ the arrival rate defaults to when neither a rate nor a trace gives one.
DEFAULT_LOAD = 0.7
LATENCY_KEYS = (
    "ttft_mean", "ttft_p50", "ttft_p90", "ttft_p99",
    "tpot_mean", "tpot_p50", "tpot_p90", "tpot_p99", "e2e_mean",
)  # fmt: skip


@dataclass(frozen=True)
class CapacityReport:
    """Everything ``capacity`` answers for one instance at one arrival rate."""

    instance: Instance
    workload: Workload
    slo: SLO
    rate_per_s: float
    service: ServiceRate
    stability: Stability
    latency: LatencyEstimate
    goodput: Goodput
    sizing: Sizing
    #: the SLO is met at a load worth provisioning for (``serving.remedy.practical``)
    slo_feasible: bool = True
    #: when it is not: the cheapest change of dtype, TP or device that makes it so
    change: Change | None = None

    @property
    def limited_by(self) -> str:
        if not self.slo_feasible:
            return "SLO infeasible on this configuration"
        return self.sizing.limited_by

    @property
    def slo_verdict(self) -> str:
        if self.slo_feasible:
            return "feasible"
        return explain_infeasible(self.goodput, self.service.rate_per_s, self.change)

    def to_dict(self) -> dict[str, Any]:
        sr, st, lat, gp, size = (
            self.service,
            self.stability,
            self.latency,
            self.goodput,
            self.sizing,
        )
        plan = self.instance.plan
        ok = self.slo_feasible
        return {
            "slo_feasible": ok,
            "slo_verdict": self.slo_verdict,
            "change": self.change.to_dict() if self.change else None,
            "model": self.instance.model.id,
            "hardware": self.instance.device.id,
            "engine": self.instance.engine.id if self.instance.engine else None,
            "tp": plan.tp,
            "pp": plan.pp,
            "devices_per_instance": plan.devices,
            "ep": plan.ep,
            "dp": plan.dp,
            "dtypes": {
                "weights": plan.weights.describe(),
                "act": plan.act_dtype,
                "kv": plan.kv_dtype,
            },
            "workload": self.workload.name,
            "rate_per_s": self.rate_per_s,
            "service_rate_per_s": sr.rate_per_s,
            "compute_rate_per_s": sr.compute_rate_per_s,
            "memory_rate_per_s": sr.memory_rate_per_s,
            "binding": sr.binding,
            "delta": sr.delta,
            "guaranteed_rate_per_s": sr.guaranteed_rate_per_s,
            "kv_capacity_tokens": sr.kv_capacity_tokens,
            "engine_kv_capacity_tokens": sr.engine_kv_capacity_tokens,
            "effective_kv_tokens": sr.effective_kv_tokens,
            "max_batched_tokens": sr.max_batched_tokens,
            "chunk_size": sr.chunk_size,
            "stable": st.stable,
            "utilization": st.utilization,
            "margin": st.margin,
            "verdict": st.explanation,
            "latency": {f"{k}_ms": getattr(lat, f"{k}_s") * MS_PER_S for k in LATENCY_KEYS},
            "goodput": {
                "feasible": gp.feasible,
                "rate_per_s": gp.rate_per_s,
                "per_device_rate_per_s": gp.per_device_rate_per_s,
                "explanation": gp.explanation,
            },
            "sizing": {
                "instances": size.instances if ok else None,
                "devices": size.devices if ok else None,
                "necessary_instances": size.necessary_instances,
                "guaranteed_instances": size.guaranteed_instances,
                "utilization": size.utilization if ok else None,
                "limited_by": self.limited_by,
            },
            "engine_accuracy": self.instance.engine_accuracy,
        }


def capacity(
    inst: Instance,
    workload: Workload,
    slo: SLO,
    *,
    rate_per_s: float | None = None,
    target_utilization: float = 0.8,
    limits: EngineLimits = EngineLimits(),
    find_change: bool = True,
) -> CapacityReport:
    """Service rate, stability and latency at ``rate_per_s``, goodput, and sizing.

    ``rate_per_s`` defaults to the trace's rate, else :data:`DEFAULT_LOAD` of ``μ``. When
    the SLO is met only near zero load the report says "infeasible on this configuration"
    (no instance count) and, with ``find_change``, carries the cheapest change that makes
    it practical (``perfmodel.serving.remedy``).
    """
    sr = limits.service_rate(inst, workload)
    if rate_per_s is None:
        trace = workload.trace
        rate_per_s = trace.rate_per_s if trace is not None else DEFAULT_LOAD * sr.rate_per_s
    lat = latency(sr, rate_per_s)
    # the operating point is one end of the goodput's bracket (an estimate saved or more)
    gp = goodput(sr, slo, known=slo_attainment(lat, slo) if lat.stable else None)
    size = instances_needed(
        sr,
        rate_per_s,
        target_utilization=target_utilization,
        goodput_per_instance_per_s=gp.rate_per_s if gp.feasible else None,
    )
    ok = practical(gp, sr.rate_per_s)
    change = None
    if not ok and find_change:
        change = cheapest_change(
            inst.model,
            inst.device,
            inst.plan,
            workload,
            slo,
            rate_per_s,
            max_batched_tokens=sr.max_batched_tokens,
            target_utilization=target_utilization,
        )
    return CapacityReport(
        slo_feasible=ok,
        change=change,
        instance=inst,
        workload=workload,
        slo=slo,
        rate_per_s=rate_per_s,
        service=sr,
        stability=stability(sr, rate_per_s),
        latency=lat,
        goodput=gp,
        sizing=size,
    )
