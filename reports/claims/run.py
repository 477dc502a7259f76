"""Run a claim's check and judge it.

Assumptions come from the check (its built-in ones) and from the claim file's
``[[check.assume]]`` entries; each names a parameter key (``"a.key"`` for one side),
and the check is re-run with that key changed to see where the claim would hold.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from perfmodel.errors import SpecError
from reports.claims.checks import get_check
from reports.claims.schema import Claim
from reports.claims.setup import Side
from reports.claims.verdict import Assumption, Verdict, judge


def _assumption(d: Any, where: str) -> Assumption:
    if not isinstance(d, dict) or "key" not in d or "low" not in d or "high" not in d:
        raise SpecError(f"{where}: each [[check.assume]] needs key, low and high")
    lo, hi = float(d["low"]), float(d["high"])
    if not lo < hi:
        raise SpecError(f"{where}: assumption {d['key']!r} needs low < high")
    default = d.get("default")
    return Assumption(
        name=str(d["key"]),
        default=None if default is None else float(default),
        low=lo,
        high=hi,
        unit=str(d.get("unit", "")),
        why=str(d.get("why", "")),
        log=bool(d.get("log", False)),
        points=int(d.get("points", 9)),
        refine=int(d.get("refine", 6)),
    )


def claim_assumptions(claim: Claim) -> list[Assumption]:
    raw = claim.raw.get("check", {}).get("assume", [])
    if not isinstance(raw, list):
        raise SpecError(f"{claim.id}: [[check.assume]] must be an array of tables")
    return [_assumption(d, f"{claim.id} [[check.assume]]") for d in raw]


def check_claim(claim: Claim) -> Verdict:
    """The verdict on one claim (errors in its setup propagate as ``SpecError``)."""
    t0 = time.perf_counter()
    fn = get_check(claim.check)
    setup = Side(claim.base_dir, claim.setup, f"{claim.id} [setup]")
    params = setup.with_values(claim.params)
    params.what = f"{claim.id} [check.params]"
    declared = claim_assumptions(claim)
    base = params.with_values({a.name: a.default for a in declared if a.default is not None})
    outcome = fn(base)
    names = {a.name for a in declared}
    assumptions = tuple(declared) + tuple(a for a in outcome.assumptions if a.name not in names)
    cache: dict[tuple[tuple[str, float], ...], float] = {}

    def evaluate(over: dict[str, float]) -> float:
        key = tuple(sorted((k, round(v, 12)) for k, v in over.items()))
        if key not in cache:
            v = fn(base.with_values(over)).value
            cache[key] = float("nan") if v is None else float(v)
        return cache[key]

    outcome = dataclasses.replace(
        outcome,
        assumptions=assumptions,
        evaluate=evaluate if assumptions else None,
    )
    return judge(claim, outcome, elapsed_s=time.perf_counter() - t0)
