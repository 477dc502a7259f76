"""Step time: one engine iteration of a batch on a tensor-parallel group, with breakdown.

Every latency comes from the cost layer: compute ops from the roofline
(``hardware.roofline``), collectives from ``hardware.comm``. Communication is not
overlapped with compute (conservative; engines overlap little of the TP all-reduce).

**Pipeline parallelism** (``plan.pp = P > 1``). The engine runs ``P`` virtual engines,
each with its own micro-batch in flight (vLLM), and ``step_time(batch)`` is the
iteration time of one of them when all carry ``batch``: the pipeline is a closed loop
of ``P`` micro-batches through ``P`` stages, so in steady state every stage serves each
micro-batch once per iteration and a micro-batch crosses ``P − 1`` stage boundaries::

    T_iter = P · max_s t_s(batch) + (P − 1) · t_hop(batch)

with ``t_s`` the time of stage ``s`` on its layer slice (``perfmodel.pipeline``; the
embedding on stage 0, the LM head on the last) and ``t_hop`` one boundary crossing.
This is exact for balanced stages and over-estimates by at most ``(P − 1)·t_hop``
otherwise (the exact cycle of this loop is ``max(P·max_s t_s, Σ_s t_s + (P − 1)·t_hop)``;
the hop is then partly hidden behind the slowest stage). A hop follows vLLM's
``send_tensor_dict(..., all_gather_group=tp_group)``: the stage output (hidden states
and residual, ``2·tokens·hidden`` activations) leaves as ``1/tp`` slices, one per TP
rank, over the link between the two stages (``pp_p2p`` inside a node: the scale-up
link; ``pp_p2p_nic`` between nodes: the scale-out NIC; a stage's TP group must not
straddle two nodes), and is all-gathered inside the next stage's TP group
(``pp_allgather``). The breakdown lists what one device of
the slowest stage executes during one iteration (its ops for ``P`` micro-batches,
``count`` and times ``× P``) plus the two hop ops, so the ops still sum to the total.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from hardware.comm import scale_up_domain_size
from hardware.device import Device
from hardware.engine import Engine
from hardware.roofline import Roofline
from perfmodel.errors import SpecError
from perfmodel.model import ModelSpec
from perfmodel.plan import ParallelPlan, check_pp, stage_models
from perfmodel.step.batch import Batch
from perfmodel.step.costing import HOST_OP as HOST_OP  # re-export
from perfmodel.step.costing import (
    Costing,
    OpTime,
    costing_of,
    host_op,
    time_op,
    time_ops,
)
from perfmodel.step.ops import Op, attention_ops, elementwise_op, head_ops, layer_ops, mlp_ops

Arr = NDArray[np.float64]


@dataclass(frozen=True)
class StepTime:
    """One iteration: total seconds and the per-op breakdown (arrays broadcast together)."""

    total_s: Arr
    ops: tuple[OpTime, ...]
    stage_s: tuple[Arr, ...] = ()  # pp > 1: time of each pipeline stage for one micro-batch

    def by_bound(self) -> dict[str, Arr]:
        """Seconds spent in ops bound by compute, memory and communication (and host
        overhead when an engine is modeled)."""
        keys = ("compute", "memory", "comm") + (
            ("host",) if any(o.name == HOST_OP for o in self.ops) else ()
        )
        out = {k: np.zeros_like(self.total_s) for k in keys}
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


def step_time(
    model: ModelSpec,
    device: Device,
    batch: Batch,
    *,
    plan: ParallelPlan | None = None,
    profile: Roofline | None = None,
    engine: Engine | None = None,
) -> StepTime:
    """Seconds for one iteration of ``batch`` on ``plan.tp`` devices, with breakdown.

    With ``plan.pp > 1``: the iteration of one virtual engine when every one of the
    ``pp`` carries ``batch`` (see the module docstring).

    ``engine`` (``hardware.engine``): its kernel efficiencies per (device family, math
    dtype) replace the default roofline's (attention has its own compute efficiency),
    decode attention reads K/V ``engine.decode_kv_reads`` times, and its host overhead
    per iteration is one more op (``host_overhead``, bound ``host``). ``None`` is the
    engine-less model (the default roofline, shared K/V reads, no host time).
    """
    plan = plan or ParallelPlan()
    model.check_tp(plan.tp)
    c = costing_of(model, device, plan, profile, engine)
    host = host_op(c, device, batch)
    if plan.pp > 1:
        return _pipeline_step(model, device, batch, plan, c, host)
    ops = layer_ops(model, plan, batch, decode_kv_reads=c.decode_kv_reads)
    times = tuple(time_ops(ops, c, device, plan))
    if host is not None:
        times = (*times, host)
    total = sum((o.total_s for o in times), np.zeros(np.shape(batch.tokens)))
    return StepTime(np.asarray(total, dtype=np.float64), times)


def stage_ops(
    model: ModelSpec,
    plan: ParallelPlan,
    batch: Batch,
    stage: int,
    *,
    decode_kv_reads: float = 1.0,
) -> list[Op]:
    """Every operator stage ``stage`` of ``plan.pp`` runs for one micro-batch, on one device."""
    check_pp(model, plan.pp)
    stages = stage_models(model, plan.pp)
    if not 0 <= stage < len(stages):
        raise IndexError(f"stage {stage} of {len(stages)}")
    sub = stages[stage]
    head = head_ops(model, plan, batch)
    return [
        *(head[:1] if stage == 0 else []),
        *attention_ops(sub, plan, batch, decode_kv_reads=decode_kv_reads),
        *mlp_ops(sub, plan, batch),
        elementwise_op(sub, plan, batch),
        *(head[1:] if stage == len(stages) - 1 else []),
    ]


def crossing_boundaries(plan: ParallelPlan, node: int) -> int:
    """Stage boundaries whose send leaves a node: stage ``s`` holds devices
    ``[s·tp, (s+1)·tp)``, nodes hold ``node`` consecutive devices, and rank ``r`` of stage
    ``b`` sends to rank ``r`` of stage ``b + 1``."""
    tp = plan.tp
    return sum(
        any((b * tp + r) // node != ((b + 1) * tp + r) // node for r in range(tp))
        for b in range(plan.pp - 1)
    )


def pipeline_hop_ops(
    model: ModelSpec, plan: ParallelPlan, batch: Batch, device: Device
) -> list[Op]:
    """The ``pp − 1`` stage-boundary crossings of one micro-batch (bytes per device).

    ``pp_p2p`` are the boundaries inside a node (the scale-up link), ``pp_p2p_nic`` those
    between nodes (the NIC; :func:`crossing_boundaries`): TP4 x PP4 on two 8-GPU nodes
    has two of the first and one of the second.
    """
    act = 2 * batch.tokens * model.hidden * plan.act_bytes  # hidden states + residual
    z = np.zeros_like(act)
    n = plan.pp - 1
    inter = crossing_boundaries(plan, scale_up_domain_size(device))
    ops = []
    if n - inter > 0:
        ops.append(Op("pp_p2p", "comm", z, act / plan.tp, n - inter, collective="p2p"))
    if inter > 0:
        ops.append(Op("pp_p2p_nic", "comm", z, act / plan.tp, inter, collective="p2p"))
    if plan.tp > 1:
        ops.append(Op("pp_allgather", "comm", z, act, n, collective="all_gather"))
    return ops


def _pipeline_step(
    model: ModelSpec,
    device: Device,
    batch: Batch,
    plan: ParallelPlan,
    c: Costing,
    host: OpTime | None,
) -> StepTime:
    pp = plan.pp
    node = scale_up_domain_size(device)
    if plan.tp * pp > node and plan.tp <= node and node % plan.tp:
        raise SpecError(
            f"TP{plan.tp} x PP{pp} on {device.id} ({node} devices per node): some stage's "
            f"tensor-parallel group would straddle two nodes; use a TP that divides {node}"
        )
    shape = np.shape(batch.tokens)
    stages = [
        time_ops(
            stage_ops(model, plan, batch, s, decode_kv_reads=c.decode_kv_reads), c, device, plan
        )
        for s in range(pp)
    ]
    stage_s = tuple(
        np.asarray(sum((o.total_s for o in ops), np.zeros(shape)), dtype=np.float64)
        for ops in stages
    )
    slowest = np.argmax(np.stack(stage_s), axis=0)  # the bottleneck stage, per batch element
    hops = [
        time_op(op, c.gemm, device, plan, c.comm_extra_s)
        for op in pipeline_hop_ops(model, plan, batch, device)
    ]
    if host is not None:  # one scheduler step per virtual-engine iteration
        hops.append(host)
    # the op counts are those of the stage that is slowest most often
    label = int(np.bincount(np.ravel(slowest), minlength=pp).argmax())
    names: list[str] = []
    for ops in stages:
        names += [o.name for o in ops if o.name not in names]
    zero = np.zeros(shape)
    scaled: list[OpTime] = []
    for name in names:
        per_stage = [next((o for o in ops if o.name == name), None) for ops in stages]
        if not any(per_stage[k] is not None for k in np.unique(slowest)):
            continue

        def pick(field: str, per_stage: list[OpTime | None] = per_stage) -> Arr:
            arrs = [
                zero if o is None else np.broadcast_to(getattr(o, field), shape) for o in per_stage
            ]
            picked = np.take_along_axis(np.stack(arrs), slowest[None, ...], axis=0)[0]
            return np.asarray(pp * picked, dtype=np.float64)

        labelled = per_stage[label]
        count = pp * (labelled.count if labelled is not None else 0)
        fields = ("flops", "bytes", "compute_s", "memory_s", "comm_s", "total_s")
        scaled.append(OpTime(name, count, *(pick(f) for f in fields)))
    slow = np.max(np.stack(stage_s), axis=0)
    total = pp * slow + sum((h.total_s for h in hops), np.zeros(shape))
    return StepTime(np.asarray(total, dtype=np.float64), (*scaled, *hops), stage_s)


def roofline_floor_s(
    model: ModelSpec, device: Device, batch: Batch, plan: ParallelPlan | None = None
) -> Arr:
    """The pure roofline bound: every op at 100 % of peak, no overheads, free links.

    With ``plan.pp > 1``: ``pp`` times the slowest stage's bound (free links).
    """
    plan = plan or ParallelPlan()
    ideal = Roofline(device, eff_compute=1.0, eff_memory=1.0, overhead_s=0.0)

    def floor(ops: list[Op]) -> Arr:
        total = np.zeros(np.shape(batch.tokens))
        for op in ops:
            if op.kind == "compute":
                total = total + op.count * ideal.time_s(op.flops, op.bytes, dtype=plan.act_dtype)
        return total

    if plan.pp == 1:
        return floor(layer_ops(model, plan, batch))
    stages = [floor(stage_ops(model, plan, batch, s)) for s in range(plan.pp)]
    return np.asarray(plan.pp * np.max(np.stack(stages), axis=0), dtype=np.float64)
