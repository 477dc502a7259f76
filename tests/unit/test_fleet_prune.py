"""Dominance pruning of fleet options (``solvers.fleet.milp.prune_dominated``)."""

from __future__ import annotations

import numpy as np
import pytest

from solvers.fleet.milp import FleetOption
from solvers.fleet.prune import dominates, prune_dominated


def _all_pairs(options: tuple[FleetOption, ...], free: frozenset[str]) -> tuple[FleetOption, ...]:
    """The rule compared over every pair (what the grouped version must equal)."""
    idx = {id(o): i for i, o in enumerate(options)}
    return tuple(
        b
        for b in options
        if not any(
            dominates(a, b, free) and not (dominates(b, a, free) and idx[id(b)] < idx[id(a)])
            for a in options
        )
    )


def test_a_cheaper_stronger_instance_of_the_same_role_drops_the_other() -> None:
    a = FleetOption("a", "h100", 1, 2.0, "colocated", (2.0,))
    b = FleetOption("b", "h100", 2, 4.0, "colocated", (3.5,))  # two a's: 4.0 req/s, $4
    p = FleetOption("p", "h100", 2, 4.0, "prefill", (3.5,), 9.0, "h100/TP2")  # another role
    assert prune_dominated((a, b, p)) == (a, p)
    # equal options: the earlier one stays
    a2 = FleetOption("a2", "h100", 1, 2.0, "colocated", (2.0,))
    assert prune_dominated((a, a2)) == (a,)


@pytest.mark.parametrize("seed", range(8))
def test_grouped_pruning_is_the_all_pairs_rule(seed: int) -> None:
    rng = np.random.default_rng(seed)
    opts = []
    for i in range(int(rng.integers(5, 60))):
        role = str(rng.choice(["colocated", "prefill", "decode"]))
        cls = "" if role == "colocated" else f"c{int(rng.integers(0, 4))}"
        dev = int(rng.choice([1, 2, 4, 8]))
        price = float(rng.choice([1.0, 2.5]))
        opts.append(
            FleetOption(
                f"o{i}", str(rng.choice(["h100", "mi300x", "l40s"])), dev, price * dev, role,
                (float(rng.choice([0.5, 1.0, 2.0, 3.0])) * dev,),
                float(rng.choice([np.inf, 4.0, 8.0])) if role != "colocated" else np.inf, cls,
            )
        )  # fmt: skip
    options = tuple(opts)
    for free in (frozenset(), frozenset({"h100", "l40s"})):
        kept = prune_dominated(options, free_types=free)
        assert kept == _all_pairs(options, free)
        assert len(kept) < len(options)  # the cases prune something
