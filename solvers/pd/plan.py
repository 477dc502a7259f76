"""PD planner: prefill/decode instance counts and parallelism at least cost under both SLOs.

1. **Enumerate** per-phase configurations: device type × TP (× decode batch cap). Each
   prefill configuration is evaluated against every decode *class* (device, TP), since
   the KV transfer in its TTFT depends on the receiver (``perfmodel.pd_models``).
2. **MILP** over integer instance counts at least cost under both goodputs, the KV
   link capacities and an optional GPU limit: formulated in ``solvers.pd_milp``.
3. **Colocated baseline**: the best goodput per GPU of the same device(s) serving both
   phases with chunked prefill (``perfmodel.queueing``), under the same SLO criterion.
   Compared like with like: ``gain`` at the plan's rate (whole instances on both
   sides: colocated GPUs needed for λ / plan GPUs) and ``fluid_gain`` at scale
   (fractional instances on both sides: :func:`fluid_optimum` per GPU / colocated per
   GPU), so integer rounding at small λ cannot decide the verdict at scale.

The SLO criterion is DistServe's: the ``slo.percentile`` quantile of TTFT and that of
TPOT both within their targets.

The planner lives in five modules; this one re-exports their names:
``solvers.pd_enumerate`` (step 1), ``solvers.pd_milp`` (step 2, :func:`plan_pd`),
``solvers.pd_colocated`` (step 3), ``solvers.pd_fluid`` (rate-free optimum, DistServe's
unit search) and ``solvers.pd_results`` (the result dataclasses).
"""

from __future__ import annotations

from solvers.pd.colocated import COLOCATED_BUDGET_TOKENS, colocated_baseline
from solvers.pd.enumerate import (
    TP_CANDIDATES,
    PhaseOptions,
    PhaseProfiles,
    check_feasible,
    evaluate_options,
)
from solvers.pd.fluid import FluidOptimum, UnitChoice, distserve_unit_search, fluid_optimum
from solvers.pd.milp import _solve, plan_pd
from solvers.pd.results import Allocation, Colocated, Constraint, PDPlan

__all__ = [
    "COLOCATED_BUDGET_TOKENS",
    "TP_CANDIDATES",
    "Allocation",
    "Colocated",
    "Constraint",
    "FluidOptimum",
    "PDPlan",
    "PhaseOptions",
    "PhaseProfiles",
    "UnitChoice",
    "_solve",
    "check_feasible",
    "colocated_baseline",
    "distserve_unit_search",
    "evaluate_options",
    "fluid_optimum",
    "plan_pd",
]
