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

from hardware.comm import collective_time_s, link_for_group, scale_up_domain_size
from hardware.device import Device
from hardware.engine import Engine
from hardware.roofline import Roofline
from perfmodel.errors import SpecError
from perfmodel.model import ModelSpec
from perfmodel.plan import ParallelPlan, check_pp, stage_models
from perfmodel.step.batch import Batch
from perfmodel.step.ops import Op, attention_ops, elementwise_op, head_ops, layer_ops, mlp_ops

Arr = NDArray[np.float64]
HOST_OP = "host_overhead"  # the engine's per-iteration host time (scheduler, sampling)


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
        """'compute', 'memory', 'comm' or 'host' (engine overhead): what sets this op's time."""
        if self.name == HOST_OP:
            return np.full(np.shape(self.total_s), "host")
        return np.where(
            self.comm_s > 0, "comm", np.where(self.compute_s > self.memory_s, "compute", "memory")
        )


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


@dataclass(frozen=True)
class _Costing:
    """How an iteration is costed: the GEMM/streaming profile, the attention profile,
    K/V reads per decode step and the engine (host overhead), if any."""

    gemm: Roofline
    attention: Roofline
    decode_kv_reads: float = 1.0
    engine: Engine | None = None
    comm_extra_s: float = 0.0  # the engine's fixed cost per collective call
    experts: Roofline | None = None  # the routed experts' grouped GEMM (default: gemm)

    def profile(self, op: Op) -> Roofline:
        if op.name == "moe_experts" and self.experts is not None:
            return self.experts
        return self.attention if op.name.startswith("attention") else self.gemm


def _costing(
    model: ModelSpec,
    device: Device,
    plan: ParallelPlan,
    profile: Roofline | None,
    engine: Engine | None,
) -> _Costing:
    """Without an engine: ``profile`` (default roofline) for every op, shared K/V reads."""
    if engine is None:
        prof = profile or Roofline(device)
        return _Costing(prof, prof)
    eff = engine.kernel_efficiency(device.id, plan.act_dtype)
    gemm = profile or Roofline(device, eff_compute=eff.gemm_compute, eff_memory=eff.memory)
    # a KV format the device cannot compute in (FP8 KV on an A100) is dequantized in
    # software inside the attention kernel: its reads stream at a fraction of the rate
    soft = plan.kv_bytes < plan.act_bytes and not device.computes(plan.kv_dtype)
    attn_mem = eff.memory * (engine.kv_dequant_efficiency if soft else 1.0)
    attn = profile or Roofline(device, eff_compute=eff.attention_compute, eff_memory=attn_mem)
    # query heads per KV head on one device (KV heads replicate when tp > kv_heads)
    reads = (
        1.0
        if model.mla
        else engine.decode_kv_reads(
            model.heads / plan.tp, model.kv_heads / model.kv_shards(plan.tp)
        )
    )
    k = engine.moe_efficiency
    experts = profile or Roofline(
        device, eff_compute=eff.gemm_compute * k, eff_memory=eff.memory * k
    )
    return _Costing(gemm, attn, reads, engine, engine.collective_overhead_s, experts)


def _host_op(c: _Costing, device: Device, batch: Batch) -> OpTime | None:
    if c.engine is None:
        return None
    t = np.asarray(
        c.engine.host_overhead_s(device.id, batch.decode_seqs + batch.prefill_seqs)
        + np.zeros(np.shape(batch.tokens)),
        dtype=np.float64,
    )
    z = np.zeros_like(t)
    return OpTime(HOST_OP, 1, z, z, z, z, z, t)


def _time_op(
    op: Op, prof: Roofline, device: Device, plan: ParallelPlan, comm_extra_s: float = 0.0
) -> OpTime:
    """Seconds of ``op`` (all its executions); ``comm_extra_s``: the engine's fixed cost
    per collective call beyond the link model (launch, synchronization)."""
    n = op.count
    if op.kind == "comm":
        if op.name == "pp_p2p_nic":  # between stages on different nodes
            group, link = 2, link_for_group(device, scale_up_domain_size(device) + 1)
        elif op.collective == "p2p":  # between stages of one node (one sender, one receiver)
            node = scale_up_domain_size(device)
            group, link = 2, link_for_group(device, min(plan.tp * plan.pp, node))
        elif op.collective == "all_to_all":  # expert-parallel dispatch / combine
            group, link = plan.ep, link_for_group(device, plan.ep)
        else:  # inside one stage's tensor-parallel group
            group, link = plan.tp, link_for_group(device, plan.tp)
        t = collective_time_s(op.collective, op.bytes, group=group, link=link, dtype=plan.act_dtype)  # type: ignore[arg-type]
        t = t + comm_extra_s
        z = np.zeros_like(t)
        return OpTime(op.name, n, z, z, z, z, n * t, n * t)
    dtype = op.dtype if op.dtype and device.computes(op.dtype) else plan.act_dtype
    flops = op.flops
    if op.unpadded_flops is not None and not device.pads_gemm_rows:
        flops = op.unpadded_flops  # no fixed row tiles (FPGA dataflow engines)
    r = prof.times(flops, op.bytes, dtype=dtype, kernels=op.kernels)
    z = np.zeros_like(r.total_s)
    return OpTime(
        op.name, n, n * flops, n * op.bytes, n * r.compute_s, n * r.memory_s, z, n * r.total_s
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
    c = _costing(model, device, plan, profile, engine)
    host = _host_op(c, device, batch)
    if plan.pp > 1:
        return _pipeline_step(model, device, batch, plan, c, host)
    times = tuple(
        _time_op(op, c.profile(op), device, plan, c.comm_extra_s)
        for op in layer_ops(model, plan, batch, decode_kv_reads=c.decode_kv_reads)
    )
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
    c: _Costing,
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
        [
            _time_op(op, c.profile(op), device, plan, c.comm_extra_s)
            for op in stage_ops(model, plan, batch, s, decode_kv_reads=c.decode_kv_reads)
        ]
        for s in range(pp)
    ]
    stage_s = tuple(
        np.asarray(sum((o.total_s for o in ops), np.zeros(shape)), dtype=np.float64)
        for ops in stages
    )
    slowest = np.argmax(np.stack(stage_s), axis=0)  # the bottleneck stage, per batch element
    hops = [
        _time_op(op, c.gemm, device, plan, c.comm_extra_s)
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
