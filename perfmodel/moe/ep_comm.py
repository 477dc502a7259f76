"""Expert-parallel all-to-all: dispatch and combine bytes per GPU and their time.

Bytes each GPU sends per MoE layer = tokens × experts per token × hidden × element
bytes, once for dispatch and once for combine (DeepSeek ISCA'25 §2.3.2, test vector T8
in ``shared/reference/formal_models.md``); the time of each comes from
``hardware.comm.collective_time_s('all_to_all', ...)``. Receive-side imbalance is not
modeled: the time does not depend on how the dispatcher splits the tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hardware.comm import collective_time_s, link_for_group
from hardware.device import Device, Link
from perfmodel.errors import SpecError


@dataclass(frozen=True)
class EpComm:
    """All-to-all dispatch + combine of one MoE layer, per GPU."""

    dispatch_bytes: float
    combine_bytes: float
    dispatch_s: float
    combine_s: float
    link: str
    group: int

    @property
    def total_s(self) -> float:
        return self.dispatch_s + self.combine_s


def ep_link(device: Device, num_gpus: int, gpus_per_node: int) -> tuple[Link, str]:
    """The EP group's link (:func:`hardware.comm.link_for_group` with ``gpus_per_node``)."""
    link = link_for_group(device, num_gpus, node_size=gpus_per_node)
    if link is device.scale_up:
        return link, "scale-up"
    if num_gpus <= min(gpus_per_node, device.dies_per_package) and link.name == "die-to-die":
        return link, "die-to-die"
    if num_gpus <= gpus_per_node:
        raise SpecError(f"{device.id} has no scale-up link for EP inside a node")
    if device.scale_out is None:
        raise SpecError(
            f"{device.id} has no scale-out link; EP across nodes needs one (use --gpus "
            f"<= {gpus_per_node} or a device with [scale_out])"
        )
    return device.scale_out, "scale-out"


def ep_comm(
    *,
    tokens_per_gpu: float,
    experts_per_token: int,
    hidden: int,
    group: int,
    link: Link,
    link_name: str = "",
    dispatch_elem_bytes: float = 2.0,
    combine_elem_bytes: float = 2.0,
) -> EpComm:
    """Bytes each GPU sends: tokens × experts per token × hidden × element bytes, for
    dispatch and again for combine (DeepSeek ISCA'25 §2.3.2, test vector T8); the time
    of each is ``hardware.comm.collective_time_s('all_to_all', ...)``."""
    base = tokens_per_gpu * experts_per_token * hidden
    db, cb = base * dispatch_elem_bytes, base * combine_elem_bytes
    ts = collective_time_s("all_to_all", np.array([db, cb]), group=group, link=link)
    return EpComm(db, cb, float(ts[0]), float(ts[1]), link_name or link.name, group)
