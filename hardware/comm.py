"""Collective-communication cost: the one place a time is computed from bytes on a link.

Bandwidths are per direction. A collective over ``p`` devices on a message of ``bytes``
per device cuts it into ``p`` chunks of ``bytes / p``; every device sends

* all-reduce = reduce-scatter + all-gather: ``2(p-1)`` chunks;
* all-gather / reduce-scatter: ``p-1`` chunks (``bytes`` = the full gathered size, the
  NCCL / nccl-tests convention);
* all-to-all: ``p-1`` chunks (``bytes`` = what one device sends in total).

Egress bandwidth ``bw`` of one device during the collective:

* ``switched`` (NVSwitch, a NIC through a switch): the device's full per-direction
  bandwidth; ring algorithm, ``2(p-1)`` steps for all-reduce and ``p-1`` for
  all-gather / reduce-scatter; all-to-all sends to every peer at once (one step).
* ``mesh`` (MI300X xGMI, Ascend HCCS, TPU ICI): a direct algorithm over ``min(p-1,
  peers)`` links in parallel, each at the per-peer bandwidth (capped at the device
  aggregate); one step per phase. A ring on a mesh would get a single link.
* ``none``: no scale-up link; collectives go over the fallback ``link_for_group``
  returns (the NIC, or host PCIe).

**Protocol regimes.** NCCL runs every collective with one of three protocols and
picks, by its own cost model, the one it expects to be fastest: LL (8-byte stores
with an inline flag: lowest latency, lowest bandwidth), LL128 (128-byte lines) and
Simple (bulk copies with fences: highest latency, highest bandwidth). Its model
(``src/graph/tuning.cc``) charges a protocol a fixed base latency (``baseLat``, in us,
the same on every link) plus a latency per algorithm step that depends on the link
type (``hwLat``: NVLink, PCIe, network), and a per-protocol share of the bandwidth. We
model the library the same way, as taking the fastest of three affine regimes::

    t_k = B_k + m · s · L + (n + λ) · (bytes / p) / (e_k · bw)        t = min_k t_k

with ``B_k`` the base latency of protocol ``k`` (seconds, independent of the link),
``L`` the link's ``latency_s``, ``m`` the latency of one step in link latencies, ``s``
the algorithm steps and ``n`` the chunks sent (above), ``e_k`` the protocol's share of
the link bandwidth, and ``λ`` a part of one chunk per collective that does not overlap
with the wire (fitted, not derived: plausibly the ring's fill and drain). ``λ`` is what
the data ask for: small groups reach a lower bus bandwidth (2-GPU all-gather at
512 MiB ~25 % below 8-GPU on A100 and H100) and all-reduce costs 1.55-1.6x an
all-gather of the same buffer on 2 GPUs, not 2x. A slower link (a NIC, PCIe, xGMI at
5-10 us) thus pays more per step but the same fixed cost per collective.

Eight constants (:data:`NCCL_PROTOCOLS`, :data:`STEP_LATENCIES`, :data:`EXTRA_CHUNKS`),
one set for every device, fitted with ``scipy.optimize`` on relative error to NCCL
measurements on 2 and 8 GPUs of A100-SXM4 and H100-SXM (``shared/data/silicon/
*__nccl.csv``, all four ops, fp16 and int8; the 4-GPU rows held out; fit and error
tables: ``benchmarks/bench_comm.py``), with the H100's NVLink ``latency_s`` = 1 us
(0.76 us per step). The A100 system's fixed costs do not fit that form with its link
latency alone: its floor is ~8 us + 0.95 us per ring step where the H100's is ~4.4 +
0.8 (the data sets come from different NCCL / TensorRT-LLM versions: software as much
as hardware). A link therefore carries ``collective_base_latency_scale`` (the system's
fixed costs relative to the reference, default 1): fitted jointly, the A100 gets
``latency_s`` = 1.045 us per hop and a scale of 1.946 (``a100-*.toml``); other devices
keep 1 until measured. The fitted regimes are the *effective*
ones:

* "LL": the latency floor up to ~16 KB (tiny messages on few channels: 3.4 % of the
  link);
* "LL128": ~16 KB-2 MB, where NCCL also runs few channels (35 %);
* "Simple": the bandwidth regime (73 % of per-direction NVLink).

**NVLink SHARP (NVLS).** On a link with ``in_switch_reduction`` (NVSwitch 3 / 4: H100,
H200, B200 HGX) NCCL reduces all-reduce in the switch: each device sends its buffer once
into the switch and receives the reduced result once, so a fourth regime
``t = f · B + m · L + bytes / (e · bw)`` (one step, no ring fill) joins the minimum for
an all-reduce of a dtype the switch reduces (fp16, bf16, fp32; not int8 / fp8; ``dtype``
None = a 16-bit float). Its two constants (:data:`NVLS`: 71.2 us, 58.6 % of the link)
are fitted on the H100 fp16 all-reduce rows (2 and 8 GPUs, the others fixed). The data
show NVLS on 8 GPUs only: on 2 and 4 the fp16 rows take the time of the int8 ones of the
same bytes, on 8 fp16 takes 0.79x; NCCL's tuner picks it by group size, so the regime
applies from :data:`NVLS_MIN_GROUP` = 8 (which also makes 8 GPUs faster than 7 for a
large fp16 all-reduce, as measured: 8 H100 beat 4 at 512 MiB). The large base latency
is the effective one (NVLS wins from 32 MiB); small NVLS messages are not measured.
Fp16 on 8 H100 at >= 64 MB: 1.22-1.41x the measured time before, 0.998-1.006x now;
H100 all-reduce MdAPE over all rows 4.5 -> 4.0 % (the held-out 4-GPU rows, 4.5 %, do
not use NVLS).

Median absolute error on the held-out 4-GPU rows, H100: all-reduce 4.5 %, all-gather
3.2 %, reduce-scatter 4.1 %, all-to-all 14.2 %; A100: 3.4 / 5.7 / 7.4 / 9.4 %. The
single-regime model before (``0.70·bw``, ``p-1`` hops of 1 us per phase, plus 5 us) had
11.4 % (H100) and 28.9 % (A100) on held-out all-reduce. What the data show and this
model does not:

* H100 all-reduce at >= 64 MB (the rows without SHARP): model 0-16 % high, median 9 %
  (H100 reaches a slightly higher share of NVLink than the A100 it shares the
  constants with);
* all-to-all (grouped send/recv) below 4 MB on H100: measured 1.27x the model at the
  median, 1.76x at the 90th percentile (a few rows spike to 3x);
* near NCCL's own protocol switch (16 KB-4 MB) the library may pick a slower protocol
  than the fastest: measured up to ~2x the model;
* the tree algorithm (multi-node). Links other than NVLink (a NIC, PCIe, xGMI / HCCS
  meshes) use the same constants with their own ``latency_s`` and bandwidth: per-step
  latency scales with the link as in NCCL's ``hwLat``, the rest is unmeasured.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from hardware.device import Device, Link
from hardware.roofline import DEFAULT_OVERHEAD_S
from perfmodel.dtypes import get_dtype
from perfmodel.errors import SpecError

Collective = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p"]
_PHASES = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1, "all_to_all": 1, "p2p": 1}

#: p2p (DMA copy) share of the link bandwidth and its launch overhead.
COMM_EFFICIENCY = 0.70
COLLECTIVE_OVERHEAD_S = DEFAULT_OVERHEAD_S


@dataclass(frozen=True)
class Protocol:
    """One protocol regime of a collective library.

    ``base_latency_s``: fixed latency of one collective in seconds, whatever the link;
    ``efficiency``: share of the per-direction link bandwidth it reaches.
    """

    name: str
    base_latency_s: float
    efficiency: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.base_latency_s) and self.base_latency_s >= 0):
            raise SpecError(f"protocol {self.name!r}: base_latency_s must be >= 0")
        if not 0.0 < self.efficiency <= 1.0:
            raise SpecError(f"protocol {self.name!r}: efficiency must be in (0, 1]")


# Fitted by benchmarks/bench_comm.py (A100 + H100, 2 and 8 GPUs, all four ops, fp16 and
# int8 rows; stage 1, with a factor on the A100's base latencies, see above). NCCL's own
# model for comparison (src/graph/tuning.cc, ring): baseLat LL 6.6, LL128 14, Simple
# 8.4 us (2.19+) plus hwLat per step on NVLink 0.6 / 1.9 / 3.4 us, PCIe 1.0 / 2.5 / 5.7
# (network 2.7 / 4.0 / 9.6 in older releases); bus bandwidth of LL 1/4 (all-reduce) to
# 1/3 and of LL128 0.92 of Simple, which it caps at 235 GB/s on Ampere and 370 GB/s on
# Hopper (0.78 / 0.82 of per-direction NVLink). Ours has one step latency for all three
# protocols, so Simple's larger per-step cost sits in its base latency.
NCCL_PROTOCOLS: tuple[Protocol, ...] = (
    Protocol("LL", base_latency_s=4.82e-6, efficiency=0.0341),
    Protocol("LL128", base_latency_s=6.19e-6, efficiency=0.347),
    Protocol("Simple", base_latency_s=17.6e-6, efficiency=0.727),
)
#: latency of one algorithm step (a flag round over one hop), in link latencies
STEP_LATENCIES = 0.764
#: chunks (of bytes / p) per collective that do not overlap with the wire
EXTRA_CHUNKS = 0.353

# NVLink SHARP (NVLS) all-reduce, on a link with ``in_switch_reduction``: each device
# sends its buffer once into the switch and receives the reduced result once, one step
# (NCCL's NVLS latency is one intra-node hop, src/graph/tuning.cc), so
# ``t = f · B + m · L + bytes / (e · bw)``. Fitted by benchmarks/bench_comm.py on the
# 8-GPU fp16 all-reduce rows of H100-SXM, the other constants fixed.
NVLS = Protocol("NVLS", base_latency_s=71.2e-6, efficiency=0.586)
#: dtypes the switch reduces (NVLS multimem reductions: no int8 / fp8)
NVLS_DTYPES = frozenset({"fp16", "bf16", "fp32"})
#: smallest group NCCL ran NVLS for in the data: the 2- and 4-GPU fp16 rows take the
#: time of the int8 ones (no in-switch reduction), the 8-GPU ones up to 1.27x less
NVLS_MIN_GROUP = 8


def egress_bw_bytes_per_s(link: Link, group: int) -> float:
    """Per-direction bandwidth one device gets out of ``link`` in a group of ``group``."""
    if link.topology == "mesh":
        n_links = max(1, min(group - 1, link.peers or group - 1))
        return min(
            n_links * link.peer_bw_per_direction_bytes_per_s,
            link.bw_per_direction_bytes_per_s or np.inf,
        )
    return link.bw_per_direction_bytes_per_s


def algorithm_steps(kind: Collective, group: int, topology: str) -> int:
    """Latency steps of one collective: ring on a switch, direct on a mesh (see above)."""
    phases = _PHASES[kind]
    if kind in ("p2p", "all_to_all") or topology == "mesh":
        return phases
    return phases * (group - 1)


def regime_times_s(
    chunk_bytes: ArrayLike,
    chunks: ArrayLike,
    steps: ArrayLike,
    latency_s: ArrayLike,
    bw_bytes_per_s: ArrayLike,
    *,
    protocols: Sequence[Protocol] = NCCL_PROTOCOLS,
    step_latencies: float = STEP_LATENCIES,
    extra_chunks: float = EXTRA_CHUNKS,
    base_scale: float = 1.0,
) -> NDArray[np.float64]:
    """Seconds of each protocol regime, ``B_k + m·s·L + (n + λ)·chunk / (e_k·bw)``.

    All array arguments broadcast together; the result has one leading axis over
    ``protocols``. :func:`collective_time_s` takes the minimum over that axis.
    """
    data = (np.asarray(chunks, dtype=np.float64) + extra_chunks) * np.asarray(
        chunk_bytes, dtype=np.float64
    )
    bw = np.asarray(bw_bytes_per_s, dtype=np.float64)
    step_s = (
        np.asarray(latency_s, dtype=np.float64)
        * step_latencies
        * np.asarray(steps, dtype=np.float64)
    )
    out = [
        base_scale * pr.base_latency_s + step_s + data / (pr.efficiency * bw) for pr in protocols
    ]
    return np.stack(np.broadcast_arrays(*out))


def _check(kind: str, group: int, link: Link) -> float:
    if kind not in _PHASES:
        raise SpecError(f"unknown collective {kind!r}; valid: {', '.join(_PHASES)}")
    bw = egress_bw_bytes_per_s(link, group)
    if bw <= 0:
        raise SpecError(
            f"a {group}-device {kind} needs a link, but {link.name or 'the link'} has no "
            "bandwidth; use tp=1 or a device with a scale-up link"
        )
    return bw


def uses_in_switch_reduction(kind: str, group: int, link: Link, dtype: str | None) -> bool:
    """Whether the NVLS regime is a candidate: an all-reduce of ``group`` >=
    :data:`NVLS_MIN_GROUP` devices on a link with in-switch reduction, in a dtype the switch
    reduces (``None``: assume a 16-bit float, the common tensor-parallel case)."""
    name = "bf16" if dtype is None else get_dtype(dtype).name
    return (
        kind == "all_reduce"
        and link.in_switch_reduction
        and group >= NVLS_MIN_GROUP
        and name in NVLS_DTYPES
    )


def _regimes(
    kind: Collective,
    b: NDArray[np.float64],
    group: int,
    link: Link,
    bw: float,
    dtype: str | None,
) -> tuple[NDArray[np.float64], tuple[Protocol, ...]]:
    chunks = _PHASES[kind] * (group - 1)
    steps = algorithm_steps(kind, group, link.topology)
    scale = link.collective_base_latency_scale
    ring = regime_times_s(b / group, chunks, steps, link.latency_s, bw, base_scale=scale)
    if not uses_in_switch_reduction(kind, group, link, dtype):
        return ring, NCCL_PROTOCOLS
    # the whole buffer once each way (chunk = bytes, one "chunk", no ring fill), one step
    nvls = regime_times_s(
        b, 1.0, 1, link.latency_s, bw, protocols=(NVLS,), extra_chunks=0.0, base_scale=scale
    )
    return np.concatenate([ring, nvls]), (*NCCL_PROTOCOLS, NVLS)


def collective_time_s(
    kind: Collective,
    bytes_: ArrayLike,
    *,
    group: int,
    link: Link,
    dtype: str | None = None,
) -> NDArray[np.float64]:
    """Seconds for one collective of ``bytes_`` per device over ``group`` devices;
    ``dtype`` (of the elements) matters only for in-switch reduction (NVLS)."""
    b = np.asarray(bytes_, dtype=np.float64)
    if kind in _PHASES and group <= 1:
        return np.zeros_like(b)
    bw = _check(kind, group, link)
    if kind == "p2p":
        t = COLLECTIVE_OVERHEAD_S + b / (COMM_EFFICIENCY * bw) + link.latency_s
    else:
        t = _regimes(kind, b, group, link, bw, dtype)[0].min(axis=0)
    return np.where(b > 0, t, 0.0)


def collective_protocol(
    kind: Collective,
    bytes_: ArrayLike,
    *,
    group: int,
    link: Link,
    dtype: str | None = None,
) -> NDArray[np.str_]:
    """Name of the regime :func:`collective_time_s` takes for each message ("" for none)."""
    b = np.asarray(bytes_, dtype=np.float64)
    if kind in _PHASES and group <= 1:
        return np.full(b.shape, "")
    bw = _check(kind, group, link)
    if kind == "p2p":
        return np.where(b > 0, "copy", "")
    times, protocols = _regimes(kind, b, group, link, bw, dtype)
    names = np.array([pr.name for pr in protocols])
    return np.where(b > 0, names[times.argmin(axis=0)], "")


def scale_up_domain_size(device: Device) -> int:
    """Devices of one scale-up domain (a node): ``peers + 1``, or 1 without a scale-up link
    (PCIe-only cards: every inter-device send then goes over the fallback link)."""
    su = device.scale_up
    return su.peers + 1 if su.topology != "none" and su.bw_per_direction_bytes_per_s > 0 else 1


def link_for_group(device: Device, group: int, *, node_size: int | None = None) -> Link:
    """The link a group of ``group`` devices (TP, EP, a KV transfer) talks over.

    * within one multi-die package (MI250X: 2 dies) -> the die-to-die link;
    * within the scale-up domain (``node_size`` devices, default the scale-up link's
      peers + 1) -> the scale-up link (NVLink, xGMI, HCCS, ICI);
    * otherwise (no scale-up link, or a larger group) -> the scale-out NIC, or host PCIe
      when the device has no NIC.
    """
    if group <= device.dies_per_package and device.die_link_bw_per_direction_bytes_per_s:
        return Link(
            "die-to-die",
            device.die_link_bw_per_direction_bytes_per_s,
            device.scale_up.latency_s,
            topology="switched",
            peers=device.dies_per_package - 1,
        )
    su = device.scale_up
    in_node = group <= (su.peers + 1 if node_size is None else node_size)
    if su.topology != "none" and su.bw_per_direction_bytes_per_s > 0 and in_node:
        return su
    return device.scale_out if device.scale_out is not None else device.host_link
