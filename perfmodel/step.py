"""Step time: one engine iteration of a batch on a tensor-parallel group, with breakdown.

Every latency comes from the cost layer: compute ops from the roofline
(``hardware.roofline``), collectives from ``hardware.comm``. Communication is not
overlapped with compute (conservative; engines overlap little of the TP all-reduce).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from hardware.comm import collective_time_s, link_for_group
from hardware.device import Device
from hardware.roofline import Roofline
from perfmodel.batch import Batch
from perfmodel.model import ModelSpec
from perfmodel.ops import Op, layer_ops
from perfmodel.parallel import ParallelPlan

Arr = NDArray[np.float64]


@dataclass(frozen=True)
class OpTime:
    """Time of one operator summed over the iteration (all its layers), seconds."""

    name: str
    count: int
    flops: Arr
    bytes: Arr
    compute_s: Arr
    memory_s: Arr
    comm_s: Arr
    total_s: Arr

    @property
    def bound(self) -> NDArray[np.str_]:
        """'compute', 'memory' or 'comm': what sets this op's time."""
        return np.where(
            self.comm_s > 0, "comm", np.where(self.compute_s > self.memory_s, "compute", "memory")
        )


@dataclass(frozen=True)
class StepTime:
    """One iteration: total seconds and the per-op breakdown (arrays broadcast together)."""

    total_s: Arr
    ops: tuple[OpTime, ...]

    def by_bound(self) -> dict[str, Arr]:
        """Seconds spent in ops bound by compute, memory and communication."""
        out = {k: np.zeros_like(self.total_s) for k in ("compute", "memory", "comm")}
        for op in self.ops:
            b = op.bound
            for k in out:
                out[k] = out[k] + np.where(b == k, op.total_s, 0.0)
        return out

    def op(self, name: str) -> OpTime:
        for o in self.ops:
            if o.name == name:
                return o
        raise KeyError(name)

    @property
    def flops(self) -> Arr:
        return sum((o.flops for o in self.ops), np.zeros_like(self.total_s))

    @property
    def bytes(self) -> Arr:
        return sum(
            (o.bytes for o in self.ops if o.comm_s.max(initial=0) == 0), np.zeros_like(self.total_s)
        )


def _time_op(op: Op, prof: Roofline, device: Device, plan: ParallelPlan) -> OpTime:
    n = op.count
    if op.kind == "comm":
        link = link_for_group(device, plan.tp)
        t = collective_time_s(op.collective, op.bytes, group=plan.tp, link=link)  # type: ignore[arg-type]
        z = np.zeros_like(t)
        return OpTime(op.name, n, z, z, z, z, n * t, n * t)
    r = prof.times(op.flops, op.bytes, dtype=plan.act_dtype, kernels=op.kernels)
    z = np.zeros_like(r.total_s)
    return OpTime(
        op.name, n, n * op.flops, n * op.bytes, n * r.compute_s, n * r.memory_s, z, n * r.total_s
    )


def step_time(
    model: ModelSpec,
    device: Device,
    batch: Batch,
    *,
    plan: ParallelPlan | None = None,
    profile: Roofline | None = None,
) -> StepTime:
    """Seconds for one iteration of ``batch`` on ``plan.tp`` devices, with breakdown."""
    plan = plan or ParallelPlan()
    model.check_tp(plan.tp)
    prof = profile or Roofline(device)
    times = tuple(_time_op(op, prof, device, plan) for op in layer_ops(model, plan, batch))
    total = sum((o.total_s for o in times), np.zeros(np.shape(batch.tokens)))
    return StepTime(np.asarray(total, dtype=np.float64), times)


def roofline_floor_s(
    model: ModelSpec, device: Device, batch: Batch, plan: ParallelPlan | None = None
) -> Arr:
    """The pure roofline bound: every op at 100 % of peak, no overheads, free links."""
    plan = plan or ParallelPlan()
    ideal = Roofline(device, eff_compute=1.0, eff_memory=1.0, overhead_s=0.0)
    total = np.zeros(np.shape(batch.tokens))
    for op in layer_ops(model, plan, batch):
        if op.kind == "compute":
            total = total + op.count * ideal.time_s(op.flops, op.bytes, dtype=plan.act_dtype)
    return total
