"""Which of the least-cost fleets the planner recommends.

The fleet MILP proves the least cost, and its tie-break (fewer devices, then earlier
options) ranks fleets of equal cost — but only as finely as HiGHS resolves a term a
millionth of an instance's price: which equal-cost fleet it returns can follow its
search path (turning off one of its heuristics flipped the issue-16 plan's fleet between
two of the same cost and device count). Where a single device type is as cheap as the mix, the
planner says so and recommends it: one device type is simpler to buy and to run, and the
mix would have been the solver's accident (H100 and H200 at one price, say).
"""

from __future__ import annotations

from collections.abc import Mapping, Set

from solvers.fleet.candidates import Candidate
from solvers.fleet.milp import FleetSolution

#: a fleet MILP's solution and its options by name
Solved = tuple[FleetSolution, dict[str, Candidate]]
#: fleets whose costs differ by less than this (relative) cost the same
TIE_REL = 1e-9


def simplest(
    fleet: Solved, singles: Mapping[str, Solved], floors: Set[str] = frozenset()
) -> Solved:
    """``fleet`` (the mix), or the single-type fleet of ``singles`` (by device type) that
    costs no more; among those, the fewer devices, then the type's name. ``floors``: the
    types with a minimum count — a single-type fleet of another type would miss it and
    is not taken."""
    best: tuple[tuple[float, int, str], Solved] | None = None
    for t, solved in singles.items():
        s, by = solved
        if s.status == "infeasible" or floors - {t}:
            continue
        key = (s.cost, sum(by[k].devices * n for k, n in s.counts.items()), t)
        if best is None or key < best[0]:
            best = (key, solved)
    if best is not None and best[0][0] <= fleet[0].cost * (1 + TIE_REL):
        return best[1]
    return fleet
