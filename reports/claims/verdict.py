"""Outcomes of checks and the verdict rule.

A check returns an :class:`Outcome`: the computed value of the claimed quantity (or a
bound on it), the inputs and intermediate numbers, and the assumptions it rests on,
each with a plausible range and a function giving the value under another assumed
value. The verdict follows from the outcome alone:

* ``consistent`` — the value at the default assumptions satisfies the claim (for a
  bound: the claimed value is within the bound);
* ``needs an assumption`` — it does not, or the main assumption has no defensible
  default, but some value of it inside its plausible range makes the claim hold: the
  verdict names the assumption and the interval of values that would be needed;
* ``inconsistent`` — no value in the plausible range makes it hold; the breaking
  number is the computed value (or bound) closest to the claim;
* ``not checkable`` — the check says what the tool lacks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from reports.claims.schema import Claim, Stated

CONSISTENT = "consistent"
INCONSISTENT = "inconsistent"
NEEDS = "needs an assumption"
NOT_CHECKABLE = "not checkable"
VERDICTS = (CONSISTENT, INCONSISTENT, NEEDS, NOT_CHECKABLE)
GRID_POINTS = 7
REFINE_STEPS = 5


@dataclass(frozen=True)
class Assumption:
    """A modeling input the verdict depends on; ``default=None``: no defensible default."""

    name: str
    default: float | None
    low: float
    high: float
    unit: str = ""
    why: str = ""
    log: bool = False
    points: int = GRID_POINTS
    refine: int = REFINE_STEPS

    def grid(self) -> list[float]:
        if self.log:
            return [float(x) for x in np.geomspace(self.low, self.high, self.points)]
        return [float(x) for x in np.linspace(self.low, self.high, self.points)]

    def fmt(self, v: float) -> str:
        return f"{v:.4g}{(' ' + self.unit) if self.unit else ''}"


@dataclass(frozen=True)
class Outcome:
    """What a check computed. ``bound``: ``"upper"``/``"lower"`` if ``value`` bounds it."""

    value: float | None
    unit: str = ""
    inputs: dict[str, Any] = field(default_factory=dict)
    steps: list[tuple[str, str]] = field(default_factory=list)
    assumptions: tuple[Assumption, ...] = ()
    evaluate: Callable[[dict[str, float]], float] | None = None
    bound: str | None = None
    not_checkable: str | None = None
    note: str = ""


@dataclass(frozen=True)
class Verdict:
    claim: Claim
    verdict: str
    value: float | None
    unit: str
    explanation: str
    outcome: Outcome
    needed: dict[str, Any] | None = None
    sensitivity: list[dict[str, Any]] = field(default_factory=list)
    elapsed_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        o = self.outcome
        return {
            **self.claim.to_dict(),
            "verdict": self.verdict,
            "value": _finite(self.value),
            "unit": self.unit,
            "bound": o.bound,
            "explanation": self.explanation,
            "needed": self.needed,
            "inputs": o.inputs,
            "steps": [{"label": k, "value": v} for k, v in o.steps],
            "assumptions": [
                {
                    "name": a.name,
                    "default": a.default,
                    "low": a.low,
                    "high": a.high,
                    "unit": a.unit,
                    "why": a.why,
                }
                for a in o.assumptions
            ],
            "sensitivity": self.sensitivity,
            "not_checkable": o.not_checkable,
            "note": o.note,
            "elapsed_s": self.elapsed_s,
        }


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def _agrees(stated: Stated, x: float, bound: str | None) -> bool:
    if not math.isfinite(x) and bound is None:
        return False
    return stated.possible_under(x, bound) if bound else stated.holds(x)


def _holding_interval(
    stated: Stated, a: Assumption, f: Callable[[float], float], bound: str | None
) -> tuple[float, float] | None:
    """The values of ``a`` in its range where the claim holds, refined at the edges.

    A claim that holds only in a window narrower than the grid step (``≈`` with a small
    tolerance) is found where the value crosses the claimed one between two grid points.
    """
    grid = a.grid()
    ok = [_agrees(stated, f(v), bound) for v in grid]
    if not any(ok) and bound is None:
        found = _crossing(stated, a, f, grid)
        if found is not None:
            grid = sorted([*grid, found])
            ok = [_agrees(stated, f(v), bound) for v in grid]
    if not any(ok):
        return None
    idx = [i for i, k in enumerate(ok) if k]
    i0, i1 = idx[0], idx[-1]

    def edge(good: float, bad: float) -> float:
        for _ in range(a.refine):
            mid = math.sqrt(good * bad) if a.log else 0.5 * (good + bad)
            if _agrees(stated, f(mid), bound):
                good = mid
            else:
                bad = mid
        return good

    lo = grid[i0] if i0 == 0 else edge(grid[i0], grid[i0 - 1])
    hi = grid[i1] if i1 == len(grid) - 1 else edge(grid[i1], grid[i1 + 1])
    return lo, hi


def _side(stated: Stated, x: float) -> int:
    """-1 below the claimed value (or range), +1 above, 0 agreeing."""
    if stated.holds(x):
        return 0
    ref = stated.low if stated.relation == "in" else stated.value
    assert ref is not None
    return -1 if x < ref else 1


def _crossing(
    stated: Stated, a: Assumption, f: Callable[[float], float], grid: list[float]
) -> float | None:
    """A value of ``a`` where the claim holds, bisected between grid points whose values
    lie on opposite sides of the claim (``None`` if there is no such pair)."""
    sides = [_side(stated, f(v)) if math.isfinite(f(v)) else 0 for v in grid]
    for i in range(len(grid) - 1):
        if sides[i] * sides[i + 1] < 0:
            lo, hi, s_lo = grid[i], grid[i + 1], sides[i]
            for _ in range(4 * a.refine):
                mid = math.sqrt(lo * hi) if a.log else 0.5 * (lo + hi)
                sm = _side(stated, f(mid))
                if sm == 0:
                    return mid
                if sm == s_lo:
                    lo = mid
                else:
                    hi = mid
    return None


def _defaults(o: Outcome) -> dict[str, float]:
    return {a.name: a.default for a in o.assumptions if a.default is not None}


def sensitivity(o: Outcome, stated: Stated) -> list[dict[str, Any]]:
    """The value at the low, default and high end of each assumption (others at default)."""
    if o.evaluate is None:
        return []
    rows = []
    base = _defaults(o)
    for a in o.assumptions:
        pts = [a.low, a.high] if a.default is None else [a.low, a.default, a.high]
        pts = sorted(set(pts))
        for v in pts:
            over = {**base, a.name: v}
            if any(b.default is None and b.name not in over for b in o.assumptions):
                continue  # another assumption without a default: no single value
            x = o.evaluate(over)
            rows.append(
                {
                    "assumption": a.name,
                    "at": v,
                    "unit": a.unit,
                    "value": _finite(x),
                    "holds": _agrees(stated, x, o.bound),
                }
            )
    return rows


def judge(claim: Claim, o: Outcome, *, elapsed_s: float = 0.0) -> Verdict:
    """Apply the verdict rule of the module docstring to a check's outcome."""
    st = claim.stated
    what = "bound" if o.bound else "value"
    if o.not_checkable is not None:
        return Verdict(claim, NOT_CHECKABLE, None, o.unit, o.not_checkable, o, elapsed_s=elapsed_s)
    sens = sensitivity(o, st)
    free = [a for a in o.assumptions if a.default is None]
    main = free[0] if free else (o.assumptions[0] if o.assumptions else None)
    x = o.value
    if x is not None and not free and _agrees(st, x, o.bound):
        text = f"the model's {what} {x:.4g}{_u(o.unit)} agrees with the claim ({st.text()})"
        return Verdict(claim, CONSISTENT, x, o.unit, text, o, sensitivity=sens, elapsed_s=elapsed_s)
    if main is not None and o.evaluate is not None:
        base = _defaults(o)
        evaluate = o.evaluate

        def f(v: float) -> float:
            return evaluate({**base, main.name: v})

        iv = _holding_interval(st, main, f, o.bound)
        if iv is not None:
            lo, hi = iv
            need = (
                f"{main.name} ≥ {main.fmt(lo)}"
                if hi >= main.high and lo > main.low
                else f"{main.name} ≤ {main.fmt(hi)}"
                if lo <= main.low and hi < main.high
                else f"{main.name} in [{main.fmt(lo)}, {main.fmt(hi)}]"
            )
            at = "" if x is None else f"; as set up, the {what} is {x:.4g}{_u(o.unit)}"
            text = (
                f"holds if {need} (plausible range {main.fmt(main.low)}–{main.fmt(main.high)}){at}"
            )
            needed = {"assumption": main.name, "low": lo, "high": hi, "unit": main.unit}
            return Verdict(
                claim,
                NEEDS,
                x,
                o.unit,
                text,
                o,
                needed=needed,
                sensitivity=sens,
                elapsed_s=elapsed_s,
            )
        vals = [f(v) for v in main.grid()]
        fin = [v for v in vals if math.isfinite(v)]
        best = _closest(st, fin) if fin else x
        text = (
            f"no {main.name} in {main.fmt(main.low)}–{main.fmt(main.high)} makes it hold: "
            f"the {what} reaches at best {best:.4g}{_u(o.unit)} against {st.text()}"
        )
        return Verdict(
            claim, INCONSISTENT, best, o.unit, text, o, sensitivity=sens, elapsed_s=elapsed_s
        )
    text = f"the model's {what} is {x:.4g}{_u(o.unit)}, against {st.text()}"
    return Verdict(claim, INCONSISTENT, x, o.unit, text, o, sensitivity=sens, elapsed_s=elapsed_s)


def _closest(st: Stated, vals: list[float]) -> float:
    if st.relation == "in":
        assert st.low is not None and st.high is not None
        target = math.sqrt(st.low * st.high) if st.low > 0 else 0.5 * (st.low + st.high)
    else:
        assert st.value is not None
        target = st.value
    return min(vals, key=lambda v: abs(math.log(max(v, 1e-300) / target)) if target > 0 else abs(v))


def _u(unit: str) -> str:
    return f" {unit}" if unit else ""


def num(v: Any) -> str:
    """A number for the arithmetic tables (4 significant digits, thousands separated)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return str(v)
    if v == 0 or not math.isfinite(v):
        return str(v)
    return f"{v:,.4g}" if abs(v) < 1e5 else f"{v:,.0f}"
