"""Per-batch expert dispatch: split each expert's tokens over the GPUs holding its
replicas so that the slowest GPU finishes first — a fixed-charge makespan problem.

The public entry point; the parts live in small modules:

* ``solvers.dispatch_problem``   :class:`Placement`, :class:`DispatchProblem` (the
  max-affine per-GPU time with tile padding), :class:`DispatchResult`;
* ``solvers.dispatch_milp``      ``milp``: the exact MILP (PuLP; HiGHS, CBC fallback),
  time-limited, gap reported (``shared/reference/formal_models.md`` §5.1);
* ``solvers.dispatch_heuristic`` ``heuristic``: max-affine-aware greedy + local search
  (``solvers.dispatch_local``), also started from the exact single-piece optima and
  from every proxy, so never worse than the best proxy;
* ``solvers.dispatch_proxies``   ``token`` (LPLB's objective, exact by parametric
  max-flow in ``solvers.token_balance``), ``activated`` (METRO's greedy), ``static``
  (EPLB's even split over replicas);
* ``solvers.dispatch_lp``        ``bound``: the LP relaxation, a lower bound;
* ``solvers.dispatch_bounds``    cheap lower bounds (no LP) that prune the heuristic.

All methods return :class:`DispatchResult`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hardware.maxaffine import Provenance
from perfmodel.errors import SpecError
from solvers.dispatch.bounds import pruning_bound_s, simple_bound_s
from solvers.dispatch.heuristic import dispatch_heuristic
from solvers.dispatch.lp import lower_bound, token_lp
from solvers.dispatch.milp import solve_milp
from solvers.dispatch.problem import (
    DispatchProblem,
    DispatchResult,
    Placement,
    _result,
    make_problem,
    result_from_tokens,
    round_robin_placement,
)
from solvers.dispatch.proxies import dispatch_activated, dispatch_static, dispatch_token
from solvers.pulp_solver import pulp_solver as _pulp_solver  # solvers/pd_plan.py imports it

METHODS: tuple[str, ...] = ("milp", "heuristic", "token", "activated", "static", "bound")
PROXIES: tuple[str, ...] = ("token", "activated", "static")

__all__ = [
    "METHODS",
    "PROXIES",
    "DispatchProblem",
    "DispatchResult",
    "Placement",
    "_pulp_solver",
    "_result",
    "best_proxy",
    "dispatch",
    "dispatch_activated",
    "dispatch_heuristic",
    "dispatch_static",
    "dispatch_token",
    "lower_bound",
    "make_problem",
    "pruning_bound_s",
    "result_from_tokens",
    "round_robin_placement",
    "simple_bound_s",
    "solve_milp",
    "token_lp",
]


def dispatch(
    p: DispatchProblem,
    method: str = "heuristic",
    *,
    integer: bool = True,
    time_limit_s: float = 10.0,
) -> DispatchResult:
    """Run one of :data:`METHODS` on the problem."""
    if method == "milp":
        return solve_milp(p, integer=integer, time_limit_s=time_limit_s)
    if method == "heuristic":
        return dispatch_heuristic(p)
    if method == "token":
        return dispatch_token(p, integer=integer)
    if method == "activated":
        return dispatch_activated(p)
    if method == "static":
        return dispatch_static(p, integer=integer)
    if method == "bound":
        return lower_bound(p)
    raise SpecError(f"unknown dispatch method {method!r}; valid: {', '.join(METHODS)}")


def best_proxy(
    p: DispatchProblem, *, integer: bool = True
) -> tuple[str, dict[str, DispatchResult]]:
    """Run the three proxies; return the name of the fastest and all results."""
    res = {m: dispatch(p, m, integer=integer) for m in PROXIES}
    return min(res, key=lambda m: res[m].makespan_s), res


@dataclass(frozen=True)
class DispatchComparison:
    """``perfmodel dispatch solve``'s answer: one batch dispatched by several methods."""

    model: str
    hardware: str
    gpus: int
    replicas: int
    batch: str  # where the counts came from
    profile: Provenance  # the expert-block cost profile's
    results: tuple[DispatchResult, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "hardware": self.hardware,
            "gpus": self.gpus,
            "replicas": self.replicas,
            "batch": self.batch,
            "profile": self.profile.summary(),
            "results": [r.to_dict() for r in self.results],
        }
