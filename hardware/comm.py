"""Collective-communication cost: the one place a time is computed from bytes on a link.

Bandwidths are per direction. A collective over ``p`` devices moving a message of
``bytes`` per device:

* all-reduce = reduce-scatter + all-gather; each half sends ``(p-1)/p · bytes`` out of
  every device.
* all-gather / reduce-scatter: ``(p-1)/p · bytes`` (``bytes`` = the full gathered size).
* all-to-all: ``(p-1)/p · bytes`` (``bytes`` = what one device sends in total).

Egress bandwidth of one device during the collective:

* ``switched`` (NVSwitch): the device's full per-direction bandwidth, ring algorithm,
  ``p-1`` latency hops per phase.
* ``mesh`` (MI300X xGMI, Ascend HCCS, TPU ICI): a direct algorithm over ``min(p-1,
  peers)`` links in parallel, each at the per-peer bandwidth (capped at the device
  aggregate); one latency hop per phase. A ring on a mesh would get a single link.
* ``none``: no scale-up link; collectives go over ``fallback`` (host PCIe or the NIC).

Every collective also pays one kernel launch (``COLLECTIVE_OVERHEAD_S``) and reaches
``COMM_EFFICIENCY`` of the link bandwidth: NCCL all-reduce on 8 A100/H100 reaches
0.6-0.75 of per-direction NVLink bandwidth at 8-512 MB messages and takes 15-16 us at
the smallest sizes (``shared/data/silicon/*__nccl.csv``).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from hardware.device import Device, Link
from hardware.roofline import DEFAULT_OVERHEAD_S
from perfmodel.errors import SpecError

Collective = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p"]
COMM_EFFICIENCY = 0.70
COLLECTIVE_OVERHEAD_S = DEFAULT_OVERHEAD_S
_PHASES = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1, "all_to_all": 1, "p2p": 1}


def egress_bw_bytes_per_s(link: Link, group: int) -> float:
    """Per-direction bandwidth one device gets out of ``link`` in a group of ``group``."""
    if link.topology == "mesh":
        n_links = max(1, min(group - 1, link.peers or group - 1))
        return min(
            n_links * link.peer_bw_per_direction_bytes_per_s,
            link.bw_per_direction_bytes_per_s or np.inf,
        )
    return link.bw_per_direction_bytes_per_s


def collective_time_s(
    kind: Collective,
    bytes_: ArrayLike,
    *,
    group: int,
    link: Link,
) -> NDArray[np.float64]:
    """Seconds for one collective of ``bytes_`` per device over ``group`` devices."""
    if kind not in _PHASES:
        raise SpecError(f"unknown collective {kind!r}; valid: {', '.join(_PHASES)}")
    b = np.asarray(bytes_, dtype=np.float64)
    if group <= 1:
        return np.zeros_like(b)
    bw = COMM_EFFICIENCY * egress_bw_bytes_per_s(link, group)
    if bw <= 0:
        raise SpecError(
            f"a {group}-device {kind} needs a link, but {link.name or 'the link'} has no "
            "bandwidth; use tp=1 or a device with a scale-up link"
        )
    phases = _PHASES[kind]
    if kind == "p2p":
        frac = 1.0
        hops = 1
    else:
        frac = (group - 1) / group
        hops = 1 if link.topology == "mesh" else group - 1
    t = COLLECTIVE_OVERHEAD_S + phases * (frac * b / bw + hops * link.latency_s)
    return np.where(b > 0, t, 0.0)


def link_for_group(device: Device, group: int) -> Link:
    """The link a tensor-parallel group of ``group`` devices talks over.

    * within one multi-die package (MI250X: 2 dies) -> the die-to-die link;
    * within the scale-up domain -> the scale-up link (NVLink, xGMI, HCCS, ICI);
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
    if su.topology != "none" and su.bw_per_direction_bytes_per_s > 0 and group - 1 <= su.peers:
        return su
    return device.scale_out if device.scale_out is not None else device.host_link
