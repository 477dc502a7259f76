"""Complexity facts checked by running the solvers (``solvers.hardness``).

``kind = "np_hard_reduction"``: random equal-cardinality PARTITION instances are turned
into dispatch problems on two fully replicated GPUs; the exact MILP's optimum must equal
``W`` exactly when brute force finds an equal partition. ``kind = "polynomial_limits"``:
random instances with ``β = 0`` (solved by max-flow + binary search) and with ``b = 0``
(solved as an LP) must match the MILP. The value is the fraction of ``instances``
random instances on which the fact holds (1 = every one).
"""

from __future__ import annotations

import numpy as np

from hardware.maxaffine import MaxAffine
from perfmodel.errors import SpecError
from reports.claims.setup import Side
from reports.claims.verdict import Outcome

REL_TOL = 1e-6


def _reduction(rng: np.random.Generator) -> tuple[bool, bool]:
    from solvers.dispatch.hardness import has_equal_partition, partition_instance
    from solvers.dispatch.solve import solve_milp

    n = int(rng.choice([4, 6, 8]))
    w = rng.integers(1, 15, size=n)
    if w.sum() % 2:
        w[0] += 1
    p, W = partition_instance(w)
    r = solve_milp(p, time_limit_s=10)
    yes = has_equal_partition(w)
    return bool((abs(r.makespan_s - W) < REL_TOL * max(W, 1.0)) == yes), yes


def _limits(rng: np.random.Generator) -> tuple[bool, bool]:
    from solvers.dispatch.hardness import solve_activation_limit, solve_token_limit
    from solvers.dispatch.solve import Placement, make_problem, solve_milp

    E, G = int(rng.integers(6, 14)), int(rng.integers(2, 5))
    rep = (rng.random((E, G)) < 0.4).astype(np.int64)
    rep[np.arange(E), rng.integers(0, G, E)] = 1
    pl = Placement(rep)
    flow_prof = MaxAffine(("G", "N"), np.array([3.0, 1.0]), np.array([[2.0, 0.0], [0.5, 0.0]]))
    p = make_problem(rng.integers(0, 60, E), pl, flow_prof, tile_rows=1)
    ok_flow = abs(solve_activation_limit(p).makespan_s - solve_milp(p).makespan_s) <= REL_TOL * (
        1 + solve_milp(p).makespan_s
    )
    lp_prof = MaxAffine(("G", "N"), np.array([1.0, 0.4]), np.array([[0.0, 0.01], [0.0, 0.02]]))
    q = make_problem(rng.integers(0, 80, E), pl, lp_prof, tile_rows=1)
    m = solve_milp(q, integer=False).makespan_s
    ok_lp = abs(solve_token_limit(q).makespan_s - m) <= REL_TOL * (1 + m)
    return bool(ok_flow and ok_lp), True


def complexity(params: Side) -> Outcome:
    kind = str(params.get("kind", "np_hard_reduction"))
    if kind not in ("np_hard_reduction", "polynomial_limits"):
        raise SpecError("complexity kind must be np_hard_reduction or polynomial_limits")
    n = params.int("instances", 12)
    rng = np.random.default_rng(params.int("seed", 1))
    fn = _reduction if kind == "np_hard_reduction" else _limits
    results = [fn(rng) for _ in range(n)]
    held = sum(r[0] for r in results)
    steps = [("random instances", str(n)), ("on which the fact holds", str(held))]
    if kind == "np_hard_reduction":
        steps.insert(1, ("yes-instances of PARTITION among them", str(sum(r[1] for r in results))))
        steps.append(
            ("reading", "optimal makespan = W ⇔ equal partition exists (MILP vs brute force)")
        )
    else:
        steps.append(("reading", "β=0: max-flow + binary search = MILP; b=0: LP = MILP"))
    return Outcome(value=held / n, inputs=params.describe(), steps=steps)
