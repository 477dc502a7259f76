"""What-if: the fleet at other rates or device types, and with tighter or looser SLOs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from perfmodel.errors import InfeasibleError
from perfmodel.units import MS_PER_S
from solvers.fleet.candidates import Candidate
from solvers.fleet.plan import PlanInputs, _solve, evaluate, to_fleet
from solvers.fleet.results import Fleet, Sensitivity


def fleet_at(
    cands: Sequence[Candidate],
    inputs: PlanInputs,
    rate_per_s: float,
    *,
    only_type: str | None = None,
) -> Fleet | None:
    """The least-cost fleet at another rate (optionally of one device type); None if none."""
    sol, by_name = _solve(cands, inputs, rate_per_s=rate_per_s, only_type=only_type)
    if sol.status == "infeasible":
        return None
    return to_fleet(sol, by_name, inputs, rate_per_s)


SLO_STEPS = (0.8, 1.25)


def slo_sensitivity(inputs: PlanInputs, rec: Fleet) -> tuple[Sensitivity, ...]:
    """The recommendation with both latency targets scaled by 0.8 (tighter) and 1.25."""
    out = []
    for f in SLO_STEPS:
        slo = replace(inputs.slo, ttft_s=inputs.slo.ttft_s * f, tpot_s=inputs.slo.tpot_s * f)
        alt = replace(inputs, slo=slo)
        word = "tighter" if f < 1 else "looser"
        ttft, tpot = slo.ttft_s * MS_PER_S, slo.tpot_s * MS_PER_S
        change = f"SLO {word} x{f:g} (TTFT {ttft:g} ms, TPOT {tpot:g} ms)"
        try:
            cands, _ = evaluate(alt)
            if not any(c.feasible for c in cands):
                raise InfeasibleError("no configuration meets it")
            sol, by = _solve(cands, alt)
            if sol.status == "infeasible":
                raise InfeasibleError("infeasible under the caps")
        except InfeasibleError as e:
            out.append(Sensitivity(change, None, None, f"infeasible: {e}", None))
            continue
        fl = to_fleet(sol, by, alt, inputs.rate_per_s)
        same = {p.candidate.key for p in fl.pools} == {p.candidate.key for p in rec.pools}
        out.append(
            Sensitivity(change, fl.economics.cost_per_hour_usd, fl.devices, fl.summary, same)
        )
    return tuple(out)
