"""How one step is costed: each operator's time, on the roofline or over a link.

:func:`time_ops` times the operators :mod:`perfmodel.step.ops` lists — compute ops on
the device's roofline (:class:`hardware.roofline.Roofline`, with the engine's kernel
efficiencies), collectives on the link model (:mod:`hardware.comm`) — and
:func:`host_op` adds the engine's host time. :mod:`perfmodel.step.time` sums them into
the step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from hardware.comm import collective_time_s, link_for_group, scale_up_domain_size
from hardware.device import Device, Link
from hardware.engine import Engine
from hardware.roofline import Roofline
from perfmodel.model import ModelSpec
from perfmodel.plan import ParallelPlan
from perfmodel.step.batch import Batch
from perfmodel.step.ops import Op

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
class Costing:
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


#: what a costing is built from: (model, device, plan, profile, engine)
_Inputs = tuple[ModelSpec, Device, ParallelPlan, Roofline | None, Engine | None]


def _costing(inputs: _Inputs) -> Costing:
    """Without an engine: ``profile`` (default roofline) for every op, shared K/V reads."""
    model, device, plan, profile, engine = inputs
    if engine is None:
        prof = profile or Roofline(device)
        return Costing(prof, prof)
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
    return Costing(gemm, attn, reads, engine, engine.collective_overhead_s, experts)


#: costings by the identities of (model, device, plan, profile, engine), the objects kept
#: with them (a search costs thousands of steps of one instance)
_COSTINGS: dict[tuple[int, ...], tuple[_Inputs, Costing]] = {}
_COSTINGS_KEPT = 64


def costing_of(
    model: ModelSpec,
    device: Device,
    plan: ParallelPlan,
    profile: Roofline | None,
    engine: Engine | None,
) -> Costing:
    """How a step of these inputs is costed (:func:`_costing`), built once per set of
    (immutable) inputs."""
    objs: _Inputs = (model, device, plan, profile, engine)
    key = tuple(map(id, objs))
    hit = _COSTINGS.get(key)
    if hit is not None and all(a is b for a, b in zip(hit[0], objs, strict=True)):
        return hit[1]
    c = _costing(objs)
    if len(_COSTINGS) >= _COSTINGS_KEPT:
        _COSTINGS.clear()  # one atomic step (threads of a sweep may cost steps at once)
    _COSTINGS[key] = (objs, c)
    return c


def host_op(c: Costing, device: Device, batch: Batch) -> OpTime | None:
    if c.engine is None:
        return None
    t = np.asarray(
        c.engine.host_overhead_s(device.id, batch.decode_seqs + batch.prefill_seqs)
        + np.zeros(np.shape(batch.tokens)),
        dtype=np.float64,
    )
    z = np.zeros_like(t)
    return OpTime(HOST_OP, 1, z, z, z, z, z, t)


def time_op(
    op: Op, prof: Roofline, device: Device, plan: ParallelPlan, comm_extra_s: float = 0.0
) -> OpTime:
    """Seconds of ``op`` (all its executions); ``comm_extra_s``: the engine's fixed cost
    per collective call beyond the link model (launch, synchronization)."""
    if op.kind == "comm":
        return _comm_time(op, _collective_s(op, _route(op, device, plan), plan, comm_extra_s))
    return _time_group([op], prof, device, _math_dtype(op, device, plan))[0]


def _route(op: Op, device: Device, plan: ParallelPlan) -> tuple[int, Link]:
    """The group and link the collective ``op`` runs over."""
    if op.name == "pp_p2p_nic":  # between stages on different nodes
        return 2, link_for_group(device, scale_up_domain_size(device) + 1)
    if op.collective == "p2p":  # between stages of one node (one sender, one receiver)
        return 2, link_for_group(device, min(plan.tp * plan.pp, scale_up_domain_size(device)))
    if op.collective == "all_to_all":  # expert-parallel dispatch / combine
        return plan.ep, link_for_group(device, plan.ep)
    return plan.tp, link_for_group(device, plan.tp)  # inside one stage's TP group


def _collective_s(op: Op, route: tuple[int, Link], plan: ParallelPlan, comm_extra_s: float) -> Arr:
    """Seconds of one execution of the collective ``op`` over ``route`` (:func:`_route`)."""
    group, link = route
    t = collective_time_s(op.collective, op.bytes, group=group, link=link, dtype=plan.act_dtype)  # type: ignore[arg-type]
    return t + comm_extra_s


def _comm_time(op: Op, t: Arr) -> OpTime:
    """A collective's time over its ``count`` executions of ``t`` seconds each."""
    n = op.count
    z = np.zeros_like(t)
    return OpTime(op.name, n, z, z, z, z, n * t, n * t)


def _same_bytes(a: Arr, b: Arr) -> bool:
    return np.shape(a) == np.shape(b) and bool(np.all(a == b))


def _math_dtype(op: Op, device: Device, plan: ParallelPlan) -> str:
    """The op's own math format where the device computes in it, else the plan's."""
    return op.dtype if op.dtype and device.computes(op.dtype) else plan.act_dtype


def _executed_flops(op: Op, device: Device) -> Arr:
    """FLOPs the kernel executes: unpadded on a device without fixed row tiles (FPGA
    dataflow engines), else with the GEMM row-tile padding."""
    if op.unpadded_flops is not None and not device.pads_gemm_rows:
        return op.unpadded_flops
    return op.flops


def time_ops(ops: Sequence[Op], c: Costing, device: Device, plan: ParallelPlan) -> list[OpTime]:
    """Seconds of every op of a step, in order (:func:`time_op` for a collective).

    The compute ops that share a profile and a math format are timed in one call of
    :meth:`Roofline.times` on their stacked FLOPs and bytes (a step's dozen GEMMs in one,
    not a dozen: the elementwise arithmetic is the same, the per-call cost is paid once).
    A collective of the kind and bytes of one before it (the attention and MLP all-reduces
    of a step) takes that one's seconds per execution, times its own count.
    """
    out: list[OpTime | None] = [None] * len(ops)
    groups: dict[tuple[int, str], list[int]] = {}
    # collectives timed so far: (kind, route, bytes) -> seconds per execution
    timed: list[tuple[tuple[str, tuple[int, Link]], Arr, Arr]] = []
    for i, op in enumerate(ops):
        if op.kind == "comm":
            # a step's attention and MLP all-reduces move the same bytes: timed once
            key = (op.collective, _route(op, device, plan))
            per = next((t for k, b, t in timed if k == key and _same_bytes(b, op.bytes)), None)
            if per is None:
                per = _collective_s(op, key[1], plan, c.comm_extra_s)
                timed.append((key, op.bytes, per))
            out[i] = _comm_time(op, per)
        else:
            groups.setdefault((id(c.profile(op)), _math_dtype(op, device, plan)), []).append(i)
    for (_, dtype), idx in groups.items():
        group = [ops[i] for i in idx]
        for i, ot in zip(idx, _time_group(group, c.profile(group[0]), device, dtype), strict=True):
            out[i] = ot
    return [ot for ot in out if ot is not None]


def _time_group(ops: list[Op], prof: Roofline, device: Device, dtype: str) -> list[OpTime]:
    """Compute ops of one profile and math format, timed together (all executions): the
    one place a compute op's time is formed (:func:`time_op` times one op as a group)."""
    flops = [_executed_flops(o, device) for o in ops]
    shapes = {np.shape(x) for x in flops} | {np.shape(o.bytes) for o in ops}
    shape = shapes.pop() if len(shapes) == 1 else np.broadcast_shapes(*shapes)
    col = (len(ops),) + (1,) * len(shape)
    # np.array of equal-shape arrays stacks them as np.stack does, without its set-up
    f = np.array([_to(x, shape) for x in flops], dtype=np.float64)
    b = np.array([_to(o.bytes, shape) for o in ops], dtype=np.float64)
    n = np.array([o.count for o in ops], dtype=np.float64).reshape(col)
    kernels = np.array([o.kernels for o in ops], dtype=np.float64).reshape(col)
    r = prof.times(f, b, dtype=dtype, kernels=kernels)
    z = np.zeros(shape)
    nf, nb, nc, nm, nt = (n * x for x in (f, b, r.compute_s, r.memory_s, r.total_s))
    return [
        OpTime(o.name, o.count, nf[j], nb[j], nc[j], nm[j], z, nt[j]) for j, o in enumerate(ops)
    ]


def _to(x: Arr, shape: tuple[int, ...]) -> Arr:
    return x if np.shape(x) == shape else np.broadcast_to(x, shape)
