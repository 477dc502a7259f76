"""Dominance pruning of fleet options: an option that whole instances of another replace
at no more cost and no less capacity is dropped before the fleet MILP
(:func:`solvers.fleet.milp.solve_fleet`); the optimum is unchanged, the model smaller."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from solvers.fleet.milp import FleetOption


def dominates(a: FleetOption, b: FleetOption, free: frozenset[str]) -> bool:
    """``k`` instances of ``a`` replace one of ``b`` at no more cost and no less capacity.

    Same role and PD class; the same device type, or two types ``free`` of caps and
    minimums (then the type enters no constraint). With caps, ``k·devices_a ≤ devices_b``
    keeps the replacement within them.
    """
    if a is b or (a.role, a.pd_class) != (b.role, b.pd_class):
        return False
    same = a.device_type == b.device_type
    if not same and not (a.device_type in free and b.device_type in free):
        return False
    k = b.devices_per_instance // a.devices_per_instance if same else 1
    if not same:  # whole instances of a replacing one b: the fewest that cover its goodput
        ratios = [gb / ga for ga, gb in zip(a.goodput_per_s, b.goodput_per_s, strict=True)
                  if ga > 0]  # fmt: skip
        if len(ratios) != len(a.goodput_per_s):
            return False
        k = max(1, math.ceil(max(ratios) - 1e-12))
    if k < 1 or k * a.cost_per_instance > b.cost_per_instance:
        return False
    if k * a.link_capacity_per_s < b.link_capacity_per_s:
        return False
    return all(k * ga >= gb for ga, gb in zip(a.goodput_per_s, b.goodput_per_s, strict=True))


def prune_dominated(
    options: Sequence[FleetOption], *, free_types: frozenset[str] = frozenset()
) -> tuple[FleetOption, ...]:
    """Drop options that whole instances of another option replace exactly
    (:func:`dominates`): the optimum is unchanged, the MILP smaller."""
    keep: list[FleetOption] = []
    idx = {id(o): i for i, o in enumerate(options)}
    # only options of the same role and PD class can dominate one another
    peers: dict[tuple[str, str], list[FleetOption]] = {}
    for o in options:
        peers.setdefault((o.role, o.pd_class), []).append(o)
    for b in options:
        if any(
            dominates(a, b, free_types)
            and not (dominates(b, a, free_types) and idx[id(b)] < idx[id(a)])
            for a in peers[(b.role, b.pd_class)]
        ):
            continue
        keep.append(b)
    return tuple(keep)
