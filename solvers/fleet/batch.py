"""Many fleet MILPs at once: solved side by side in threads, remembered on disk.

A plan solves about ten MILPs (the fleet, each device type alone, colocated only,
disaggregated only, the fleet at ±25 % rate), each exact on its own model
(:func:`solvers.fleet.milp.solve_fleet`: HiGHS with its time limit and gap). Here:

* they run up to two at a time in threads: HiGHS releases the GIL while it solves, on
  one solver thread each, so each solve is the one it is alone;
* a solution that HiGHS proved (``optimal`` or ``infeasible``) is stored in the plan
  cache (:mod:`solvers.fleet.cache`) under a digest of its model — every option, demand,
  cap and minimum, the time limit — and of the MILP code and the solver versions, so that
  asking the same question again reads it instead of solving it again. A solve stopped
  by its time limit is not stored (its answer depends on the machine's speed). A stored
  solution keeps the solve time it took.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from functools import cache
from pathlib import Path

from solvers.fleet.cache import Job, _load, _store, cache_dir, digest
from solvers.fleet.milp import FleetProblem, FleetSolution, solve_fleet

#: solves at a time (threads)
SOLVE_WORKERS = 2
_KIND = "fleet-milp"
_PROVEN = ("optimal", "infeasible")


@cache
def _solver_version() -> str:
    """The MILP code (this package's model, its pruning and the solver set-up) and the
    solver versions."""
    import importlib.metadata as md

    h = hashlib.sha256()
    root = Path(__file__).resolve().parents[1]
    for f in (root / "fleet/milp.py", root / "fleet/prune.py", root / "pulp_solver.py"):
        h.update(f.read_bytes())
    for dist in ("pulp", "highspy"):
        try:
            h.update(f"{dist}={md.version(dist)}".encode())
        except md.PackageNotFoundError:  # pragma: no cover - CBC fallback
            h.update(f"{dist}=none".encode())
    return h.hexdigest()[:16]


def problem_key(problem: FleetProblem, time_limit_s: float) -> str:
    return digest("fleet-milp", _solver_version(), problem, time_limit_s)


def _solve_all(
    problems: Sequence[FleetProblem], time_limit_s: float, workers: int
) -> list[FleetSolution]:
    if len(problems) < 2 or workers < 2:
        return [solve_fleet(p, time_limit_s=time_limit_s) for p in problems]
    from concurrent.futures import ThreadPoolExecutor

    from solvers.pulp_solver import mute_highs_banner

    mute_highs_banner()  # once, before the threads (it redirects fd 1 for a moment)
    # the largest models first (longest-processing-time order: the last solve to start is
    # a small one, so both threads finish close together)
    order = sorted(range(len(problems)), key=lambda i: -len(problems[i].options))
    with ThreadPoolExecutor(min(workers, len(problems))) as ex:
        futures = {i: ex.submit(solve_fleet, problems[i], time_limit_s=time_limit_s) for i in order}
        return [futures[i].result() for i in range(len(problems))]


def solve_fleets(
    problems: Sequence[FleetProblem],
    *,
    time_limit_s: float = 10.0,
    use_cache: bool = True,
    workers: int | None = None,
) -> list[FleetSolution]:
    """:func:`solve_fleet` of every problem (see the module docstring); ``workers``
    default: the CPUs this process may use, at most :data:`SOLVE_WORKERS`."""
    if workers is None:
        workers = min(len(os.sched_getaffinity(0)), SOLVE_WORKERS)
    d = cache_dir() if use_cache else None
    jobs = [Job(_KIND, problem_key(p, time_limit_s), lambda: None) for p in problems]
    out: list[FleetSolution | None] = [None] * len(problems)
    for i, job in enumerate(jobs):
        hit, value = _load(d, job)
        if hit and isinstance(value, FleetSolution):
            out[i] = value
    missing = [i for i, v in enumerate(out) if v is None]
    for i, sol in zip(
        missing, _solve_all([problems[i] for i in missing], time_limit_s, workers), strict=True
    ):
        out[i] = sol
        if sol.status in _PROVEN:
            _store(d, jobs[i], sol)
    return [s for s in out if s is not None]
