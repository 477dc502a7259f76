"""Claim files: one TOML per claim (format in ``reports/claims/README.md``).

A claim names the paper and the exact sentence, what is claimed (a quantity, a
relation and a value or a range, with a relative tolerance), the setup it is about
(model, device, parallelism, workload: catalog ids or files) and the check that
computes it with its parameters. Loading validates the fields and says what to fix.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from perfmodel.errors import SpecError

RELATIONS = (">=", "<=", "~", "in")
RELATION_ALIASES = {"≥": ">=", "≤": "<=", "≈": "~", "==": "~", "range": "in"}
DEFAULT_TOLERANCE = 0.10
FLOAT_SLACK = 1e-9  # so that a value exactly at the tolerance edge counts as inside


@dataclass(frozen=True)
class Paper:
    title: str
    venue: str = ""  # venue or "arXiv"
    arxiv: str = ""
    year: int | None = None
    source: str = ""  # where the quote was taken from

    def cite(self) -> str:
        parts = [self.title]
        where = ", ".join(x for x in (self.venue, f"arXiv:{self.arxiv}" if self.arxiv else "") if x)
        if where:
            parts.append(where)
        if self.year:
            parts.append(str(self.year))
        return " — ".join(parts)


@dataclass(frozen=True)
class Stated:
    """What the paper claims: ``quantity relation value`` within ``tolerance`` (relative)."""

    quantity: str
    relation: str
    value: float | None = None
    low: float | None = None
    high: float | None = None
    tolerance: float = DEFAULT_TOLERANCE
    unit: str = ""

    def text(self) -> str:
        u = f" {self.unit}" if self.unit else ""
        if self.relation == "in":
            core = f"in [{self.low:g}, {self.high:g}]{u}"
        else:
            sym = {">=": "≥", "<=": "≤", "~": "≈"}[self.relation]
            core = f"{sym} {self.value:g}{u}"
        return f"{self.quantity} {core} (±{self.tolerance:.0%})"

    def holds(self, x: float) -> bool:
        """Whether a computed value ``x`` agrees with the claim within the tolerance."""
        t = self.tolerance + FLOAT_SLACK
        if self.relation == "in":
            assert self.low is not None and self.high is not None
            return self.low * (1 - t) <= x <= self.high * (1 + t)
        assert self.value is not None
        v = self.value
        if self.relation == ">=":
            return x >= v - t * abs(v)
        if self.relation == "<=":
            return x <= v + t * abs(v)
        return abs(x - v) <= t * abs(v)

    def possible_under(self, bound: float, kind: str) -> bool:
        """Whether the claim can hold given an ``upper`` or ``lower`` bound on the quantity."""
        t = self.tolerance + FLOAT_SLACK
        if kind == "upper":
            if self.relation == "<=":
                return True
            need = self.low if self.relation == "in" else self.value
            assert need is not None
            return need * (1 - t) <= bound if need >= 0 else need <= bound
        if self.relation == ">=":
            return True
        need = self.high if self.relation == "in" else self.value
        assert need is not None
        return need * (1 + t) >= bound


@dataclass(frozen=True)
class Claim:
    id: str
    topic: str
    paper: Paper
    quote: str
    stated: Stated
    setup: dict[str, Any]
    check: str
    params: dict[str, Any]
    path: Path | None = None
    notes: str = ""
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def base_dir(self) -> Path:
        return self.path.parent if self.path is not None else Path.cwd()

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "topic": self.topic,
            "paper": {
                "title": self.paper.title,
                "venue": self.paper.venue,
                "arxiv": self.paper.arxiv,
                "year": self.paper.year,
            },
            "quote": self.quote,
            "claim": self.stated.text(),
            "check": self.check,
            "file": str(self.path) if self.path else None,
        }


def _need(d: dict[str, Any], key: str, where: str, typ: type | tuple[type, ...]) -> Any:
    if key not in d:
        raise SpecError(f"{where}: missing field {key!r}")
    v = d[key]
    if not isinstance(v, typ) or (isinstance(v, bool) and typ is not bool):
        raise SpecError(f"{where}: field {key!r} must be {getattr(typ, '__name__', typ)}")
    return v


def _num(d: dict[str, Any], key: str, where: str) -> float | None:
    v = d.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise SpecError(f"{where}: {key!r} must be a number, got {v!r}")
    return float(v)


def _stated(d: dict[str, Any], where: str) -> Stated:
    w = f"{where} [claim]"
    rel = str(_need(d, "relation", w, str)).strip()
    rel = RELATION_ALIASES.get(rel, rel)
    if rel not in RELATIONS:
        raise SpecError(f"{w}: relation must be one of >=, <=, ~ (≈), in; got {d['relation']!r}")
    value, low, high = _num(d, "value", w), _num(d, "low", w), _num(d, "high", w)
    if rel == "in":
        if low is None or high is None or low > high:
            raise SpecError(f"{w}: relation 'in' needs low <= high")
    elif value is None:
        raise SpecError(f"{w}: relation {rel!r} needs a value")
    tol = _num(d, "tolerance", w)
    tol = DEFAULT_TOLERANCE if tol is None else tol
    if not 0 <= tol < 1:
        raise SpecError(f"{w}: tolerance is a relative fraction in [0, 1), got {tol}")
    return Stated(
        quantity=str(_need(d, "quantity", w, str)),
        relation=rel,
        value=value,
        low=low,
        high=high,
        tolerance=tol,
        unit=str(d.get("unit", "")),
    )


def claim_from_dict(data: dict[str, Any], *, path: Path | None = None) -> Claim:
    """Validate a parsed claim file."""
    where = str(path) if path else "claim"
    paper = _need(data, "paper", where, dict)
    check = _need(data, "check", where, dict)
    year = paper.get("year")
    if year is not None and not isinstance(year, int):
        raise SpecError(f"{where} [paper]: year must be an integer")
    params = check.get("params", {})
    if not isinstance(params, dict):
        raise SpecError(f"{where} [check.params] must be a table")
    setup = data.get("setup", {})
    if not isinstance(setup, dict):
        raise SpecError(f"{where} [setup] must be a table")
    return Claim(
        id=str(_need(data, "id", where, str)),
        topic=str(data.get("topic", "other")),
        paper=Paper(
            title=str(_need(paper, "title", f"{where} [paper]", str)),
            venue=str(paper.get("venue", "")),
            arxiv=str(paper.get("arxiv", "")),
            year=year,
            source=str(paper.get("source", "")),
        ),
        quote=str(_need(data, "quote", where, str)).strip(),
        stated=_stated(_need(data, "claim", where, dict), where),
        setup=setup,
        check=str(_need(check, "name", f"{where} [check]", str)),
        params=params,
        path=path,
        notes=str(data.get("notes", "")).strip(),
        raw=data,
    )


def load_claim_file(path: str | Path) -> Claim:
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecError(f"no claim file {p}") from None
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"{p} is not valid TOML: {e}") from None
    return claim_from_dict(data, path=p)


def library_dir() -> Path:
    """The folder of the built-in claims (package data)."""
    return Path(str(resources.files("reports.claims") / "library"))


def load_library() -> list[Claim]:
    """Every built-in claim, sorted by topic then id; ids are unique."""
    claims = [load_claim_file(p) for p in sorted(library_dir().glob("*.toml"))]
    seen: dict[str, Path | None] = {}
    for c in claims:
        if c.id in seen:
            raise SpecError(f"duplicate claim id {c.id!r} in {c.path} and {seen[c.id]}")
        seen[c.id] = c.path
    return sorted(claims, key=lambda c: (c.topic, c.id))


def find_claim(id_or_file: str) -> Claim:
    """A built-in claim by id, or a claim file by path."""
    p = Path(id_or_file)
    if p.suffix == ".toml" or p.exists():
        return load_claim_file(p)
    for c in load_library():
        if c.id == id_or_file:
            return c
    raise SpecError(f"no claim {id_or_file!r}: give a built-in id (`claims list`) or a .toml file")
