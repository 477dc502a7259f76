"""DeepSeek EPLB (expert-parallel load balancer), reproduced exactly in numpy.

Source: ``deepseek-ai/EPLB`` ``eplb.py`` (``rebalance_experts``; summary in
``shared/reference/formal_models.md`` §5.3). Input: per-layer load statistics
``weight[layers, experts]``; output the physical-to-logical map (``phy2log``), its
inverse (``log2phy``, padded with −1) and the replica count of each expert.

* ``replicate_experts``: one replica each, then repeatedly one more replica for
  ``argmax_i weight_i / count_i`` (first index on ties, like ``torch.max``).
* ``balanced_packing``: items sorted by weight (descending); each goes to the lightest
  pack that still has fewer than ``n/m`` items (lowest pack index on ties).
* hierarchical policy (``num_groups % num_nodes == 0``): pack expert groups onto
  nodes, replicate within each node, pack the replicas onto the node's GPUs.
* global policy (otherwise): the same with one group and one node.

Arithmetic is float32 as in the original (``weight.float()``), so ties break the same
way. Physical slot ``j`` lives on GPU ``j // (num_replicas / num_gpus)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from perfmodel.errors import SpecError

I64 = NDArray[np.int64]
Policy = Literal["auto", "hierarchical", "global"]


@dataclass(frozen=True)
class EplbResult:
    """EPLB's three outputs, per layer."""

    phy2log: I64  # (layers, num_replicas): logical expert of each physical slot
    log2phy: I64  # (layers, experts, max replicas): slots of each expert, −1 padded
    logcnt: I64  # (layers, experts): replicas of each expert
    num_gpus: int
    policy: str

    @property
    def slots_per_gpu(self) -> int:
        return self.phy2log.shape[1] // self.num_gpus

    def slot_gpu(self) -> I64:
        """GPU of each physical slot."""
        return np.arange(self.phy2log.shape[1], dtype=np.int64) // self.slots_per_gpu


def balanced_packing(weight: NDArray[np.float32], num_packs: int) -> tuple[I64, I64]:
    """Pack ``n`` items into ``num_packs`` packs of exactly ``n/num_packs`` items each.

    Returns (pack_index, rank_in_pack), both shaped like ``weight`` (layers, n).
    """
    num_layers, n = weight.shape
    if n % num_packs:
        raise SpecError(f"{n} items cannot be split evenly into {num_packs} packs")
    per_pack = n // num_packs
    if per_pack == 1:
        idx = np.broadcast_to(np.arange(n, dtype=np.int64), weight.shape).copy()
        return idx, np.zeros(weight.shape, dtype=np.int64)
    order = np.argsort(-weight, axis=-1, kind="stable")
    pack_index = np.full(weight.shape, -1, dtype=np.int64)
    rank_in_pack = np.full(weight.shape, -1, dtype=np.int64)
    for i in range(num_layers):
        pack_weights = [np.float32(0.0)] * num_packs
        pack_items = [0] * num_packs
        for item in order[i]:
            pack = min(
                (p for p in range(num_packs) if pack_items[p] < per_pack),
                key=pack_weights.__getitem__,
            )
            pack_index[i, item] = pack
            rank_in_pack[i, item] = pack_items[pack]
            pack_weights[pack] = np.float32(pack_weights[pack] + weight[i, item])
            pack_items[pack] += 1
    return pack_index, rank_in_pack


def replicate_experts(weight: NDArray[np.float32], num_phy: int) -> tuple[I64, I64, I64]:
    """Give ``num_phy − num_log`` extra replicas greedily to the max load per replica.

    Returns (phy2log, rank, logcnt).
    """
    n, num_log = weight.shape
    if num_phy < num_log:
        raise SpecError(f"{num_phy} physical slots cannot hold {num_log} experts")
    phy2log = np.tile(np.arange(num_phy, dtype=np.int64), (n, 1))
    rank = np.zeros((n, num_phy), dtype=np.int64)
    logcnt = np.ones((n, num_log), dtype=np.int64)
    rows = np.arange(n)
    for i in range(num_log, num_phy):
        red = np.argmax(weight / logcnt.astype(np.float32), axis=-1)
        phy2log[:, i] = red
        rank[:, i] = logcnt[rows, red]
        logcnt[rows, red] += 1
    return phy2log, rank, logcnt


def _inverse(perm: I64) -> I64:
    inv = np.empty_like(perm)
    np.put_along_axis(inv, perm, np.broadcast_to(np.arange(perm.shape[1]), perm.shape), axis=1)
    return inv


def rebalance_experts_hierarchical(
    weight: NDArray[np.float32], num_physical: int, num_groups: int, num_nodes: int, num_gpus: int
) -> tuple[I64, I64, I64]:
    """EPLB's hierarchical policy; returns (phy2log, phyrank, logcnt)."""
    num_layers, num_log = weight.shape
    checks = (
        (num_log % num_groups == 0, f"{num_log} experts do not split into {num_groups} groups"),
        (num_groups % num_nodes == 0, f"{num_groups} groups do not split over {num_nodes} nodes"),
        (num_gpus % num_nodes == 0, f"{num_gpus} GPUs do not split over {num_nodes} nodes"),
        (
            num_physical % num_gpus == 0,
            f"{num_physical} replicas do not split over {num_gpus} GPUs",
        ),
    )
    for ok, msg in checks:
        if not ok:
            raise SpecError(f"EPLB: {msg}")
    group_size = num_log // num_groups
    groups_per_node = num_groups // num_nodes
    phy_per_gpu = num_physical // num_gpus

    # Step 1: pack groups to nodes.
    tokens_per_group = weight.reshape(num_layers, num_groups, group_size).sum(-1, dtype=np.float32)
    g_pack, g_rank = balanced_packing(tokens_per_group, num_nodes)
    log2mlog = (
        ((g_pack * groups_per_node + g_rank) * group_size)[:, :, None]
        + np.arange(group_size, dtype=np.int64)
    ).reshape(num_layers, -1)
    mlog2log = _inverse(log2mlog)

    # Step 2: replicate within nodes; rows are (layer, node).
    tokens_per_mlog = np.take_along_axis(weight, mlog2log, axis=-1).reshape(
        -1, num_log // num_nodes
    )
    phy2mlog, phyrank, mlogcnt = replicate_experts(tokens_per_mlog, num_physical // num_nodes)

    # Step 3: pack physical experts to GPUs within each node.
    tokens_per_phy = np.take_along_axis(
        tokens_per_mlog / mlogcnt.astype(np.float32), phy2mlog, axis=-1
    ).astype(np.float32)
    pack_index, rank_in_pack = balanced_packing(tokens_per_phy, num_gpus // num_nodes)
    phy2pphy = pack_index * phy_per_gpu + rank_in_pack
    pphy2phy = _inverse(phy2pphy)

    pphy2mlog = np.take_along_axis(phy2mlog, pphy2phy, axis=-1)
    offsets = np.arange(0, num_log, num_log // num_nodes, dtype=np.int64).reshape(1, -1, 1)
    pphy2mlog = (pphy2mlog.reshape(num_layers, num_nodes, -1) + offsets).reshape(num_layers, -1)
    pphy2log = np.take_along_axis(mlog2log, pphy2mlog, axis=-1)
    pphyrank = np.take_along_axis(phyrank, pphy2phy, axis=-1).reshape(num_layers, -1)
    logcnt = np.take_along_axis(mlogcnt.reshape(num_layers, -1), log2mlog, axis=-1)
    return pphy2log, pphyrank, logcnt


def rebalance_experts(
    weight: ArrayLike,
    num_replicas: int,
    num_groups: int,
    num_nodes: int,
    num_gpus: int,
    *,
    policy: Policy = "auto",
) -> EplbResult:
    """EPLB's entry point. ``policy='auto'`` is the original's choice: hierarchical when
    ``num_groups % num_nodes == 0``, else global."""
    w = np.asarray(weight, dtype=np.float32)
    if w.ndim == 1:
        w = w[None, :]
    if w.ndim != 2 or w.shape[1] == 0:
        raise SpecError(f"EPLB weight must be (layers, experts), got shape {w.shape}")
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise SpecError("EPLB weight (expert load) must be finite and >= 0")
    for name, v in (
        ("num_replicas", num_replicas),
        ("num_groups", num_groups),
        ("num_nodes", num_nodes),
        ("num_gpus", num_gpus),
    ):
        if not (isinstance(v, int | np.integer) and v >= 1):
            raise SpecError(f"EPLB {name} must be a positive integer, got {v!r}")
    if policy not in ("auto", "hierarchical", "global"):
        raise SpecError(f"EPLB policy must be auto, hierarchical or global, got {policy!r}")
    hier = num_groups % num_nodes == 0 if policy == "auto" else policy == "hierarchical"
    if hier:
        phy2log, phyrank, logcnt = rebalance_experts_hierarchical(
            w, num_replicas, num_groups, num_nodes, num_gpus
        )
    else:
        phy2log, phyrank, logcnt = rebalance_experts_hierarchical(w, num_replicas, 1, 1, num_gpus)
    layers, num_log = w.shape
    maxcnt = int(logcnt.max())
    log2phy = np.full((layers, num_log * maxcnt), -1, dtype=np.int64)
    np.put_along_axis(
        log2phy,
        phy2log * maxcnt + phyrank,
        np.broadcast_to(np.arange(num_replicas, dtype=np.int64), (layers, num_replicas)),
        axis=1,
    )
    return EplbResult(
        phy2log,
        log2phy.reshape(layers, num_log, maxcnt),
        logcnt,
        num_gpus,
        "hierarchical" if hier else "global",
    )
