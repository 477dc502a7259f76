"""Option validation in one place: finite, in range, and bounded work.

Every command's options are checked by name before the command does any work
(:func:`check_options`, called by ``cli.common.handle_errors``). A rule says what the
option must be and why; a *work* bound (``requests``, ``adapters``, grid levels, tokens)
is a limit on how long a command may run and can be lifted with ``perfmodel
--no-limits <command>``; the other bounds are what makes sense physically.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfmodel.errors import SpecError

#: Set by ``perfmodel --no-limits``: work bounds are not enforced.
_STATE = {"no_limits": False}


def set_no_limits(value: bool) -> None:
    _STATE["no_limits"] = bool(value)


def no_limits() -> bool:
    return _STATE["no_limits"]


@dataclass(frozen=True)
class Rule:
    """``lo <= value <= hi`` (``lo_open``: strictly above ``lo``) for a number option.

    ``work_hi``: a tighter upper bound on work, lifted by ``--no-limits``; ``why`` is said
    when it is hit. ``integer``: the value must be whole (ints from Typer always are).
    """

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    work_hi: float | None = None
    why: str = ""
    integer: bool = False


def _r(lo: float | None, hi: float | None, **kw: Any) -> Rule:
    return Rule(lo, hi, **kw)


POS = _r(0, None, lo_open=True)  # a positive finite number
NONNEG = _r(0, None)
FRACTION = _r(0, 1, lo_open=True)

RULES: dict[str, Rule] = {
    "tp": _r(1, 1024),
    "pp": _r(1, 1024),
    "ep": _r(1, 1024),
    "dp": _r(1, 1024),
    "max_evals": _r(1, 100_000, work_hi=10_000, why="each evaluation predicts every row"),
    "max_rows": _r(1, 10_000_000),
    "batch": _r(1, 10_000_000),
    "input_len": _r(1, 10_000_000, why="longer than any model's context"),
    "output_len": _r(1, 10_000_000, why="longer than any model's context"),
    "seed": _r(0, 9_223_372_036_854_775_808 - 1),
    "rate_per_s": _r(0, 1_000_000_000.0, lo_open=True),
    "arrival_cv": _r(0, 1000),
    "ttft_slo_ms": _r(0, 1_000_000_000.0, lo_open=True),
    "tpot_slo_ms": _r(0, 1_000_000_000.0, lo_open=True),
    "slo_percentile": _r(0, 1, lo_open=True),
    "percentile": _r(0, 1, lo_open=True),
    "goal": _r(0, 1, lo_open=True),
    "target_utilization": _r(0, 1, lo_open=True),
    "kv_capacity_tokens": _r(1, 1_099_511_627_776),
    "max_batched_tokens": _r(1, 2_147_483_648),
    "chunk_size": _r(1, 2_147_483_648),
    "requests": _r(
        1, 10_000_000_000, work_hi=2_000_000, why="simulated requests (~10 s per million)"
    ),
    "time_scale": _r(0, 1_000_000.0, lo_open=True),
    "gpus": _r(1, 65_536, work_hi=4096, why="GPUs in one dispatch or placement problem"),
    "gpus_per_node": _r(1, 1024),
    "replicas": _r(1, 1024),
    "slots_per_gpu": _r(0, 65_536),
    "row": _r(0, 1_099_511_627_776),
    "tokens": _r(1, 1_099_511_627_776, work_hi=10_000_000, why="tokens in one dispatch batch"),
    "skew": _r(0, 100),
    "samples": _r(1, 1_000_000, work_hi=1000, why="sampled batches"),
    "tile_rows": _r(1, 65_536),
    "migration_cost_us": _r(0, 1_000_000_000_000.0),
    "time_limit_s": _r(0, 86400, lo_open=True),
    "boots": _r(1, 10_000_000, work_hi=10_000, why="bootstrap resamples"),
    "pieces": _r(1, 64),
    "budget_gib": _r(0, 1_048_576, lo_open=True),
    "expert_zipf": _r(0, 100),
    "adapter_zipf": _r(0, 100),
    "low_fraction": _r(0, 1),
    "prefetched": _r(0, 1),
    "adapters": _r(0, 1_000_000_000, work_hi=100_000, why="LoRA adapters in the cache model"),
    "adapter_rank": _r(1, 65_536),
    "nvme_gb_per_s": _r(0, 1_000_000.0, lo_open=True),
    "kv_levels": _r(1, 10_000, work_hi=64, why="grid levels of the cache MILP"),
    "expert_levels": _r(1, 10_000, work_hi=64, why="grid levels of the cache MILP"),
    "adapter_levels": _r(1, 10_000, work_hi=64, why="grid levels of the cache MILP"),
    "rates": _r(2, 100_000, work_hi=10_000, why="rates per phase-diagram row (formulas)"),
    "sim_rows": _r(0, 10_000, work_hi=64, why="simulated rows"),
    "sim_requests": _r(0, 100_000_000, work_hi=1_000_000, why="requests per simulated cell"),
    "max_gpus": _r(1, 1_000_000),
    "headroom": _r(1, 1000),  # plan: capacity for rate x headroom (a burst factor >= 1)
    "buckets": _r(1, 1000, work_hi=64, why="request buckets of the fleet MILP"),
    "workers": _r(1, 1024),
    "grid": _r(2, 10_000, work_hi=64, why="points per axis of a phase diagram"),
    "price_per_hour_usd": _r(0, 1_000_000.0, lo_open=True),
    "decode_price_per_hour_usd": _r(0, 1_000_000.0, lo_open=True),
}

#: Comma-separated list options: (kind, lower bound, lower open, most entries).
LISTS: dict[str, tuple[str, float, bool, int]] = {
    "skews": ("float", 0.0, False, 64),
    "slo_scales": ("float", 0.0, True, 64),
    "inputs": ("int", 1, False, 64),
    "outputs": ("int", 1, False, 64),
    "tokens_per_gpu": ("int", 1, False, 64),
    "output_tokens": ("int", 1, False, 64),
    "kv_grid_tokens": ("int", 1, False, 64),
}
#: Options taking one of a few words (checked here where the command does not).
CHOICES: dict[str, tuple[str, ...]] = {
    "kv_link": ("auto", "scale-up", "scale-out"),
}
#: Largest entry of an integer list option (tokens).
MAX_LIST_INT = 10_000_000


def _n(x: float) -> str:
    """A bound or value as a person writes it: 2000000, 0.5, 1e+300."""
    if float(x).is_integer() and abs(x) < 1e16:
        return str(int(x))
    return f"{x:g}"


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_number(name: str, value: Any, rule: Rule) -> None:
    """Raise SpecError ``--name: ...`` unless ``value`` meets ``rule``."""
    f = flag(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise SpecError(f"{f}: {value} is not a finite number")
    if rule.lo is not None and (value <= rule.lo if rule.lo_open else value < rule.lo):
        if isinstance(value, int) and rule.lo in (0, 1) and not rule.lo_open:
            kind = "positive" if rule.lo == 1 else "non-negative"
            raise SpecError(f"{f} must be a {kind} integer, got {value}")
        raise SpecError(
            f"{f} must be {'>' if rule.lo_open else '>='} {_n(rule.lo)}, got {_n(value)}"
        )
    if rule.hi is not None and value > rule.hi:
        why = f" ({rule.why})" if rule.why else ""
        raise SpecError(f"{f} must be <= {_n(rule.hi)}{why}, got {_n(value)}")
    if rule.work_hi is not None and value > rule.work_hi and not no_limits():
        raise SpecError(
            f"{f} {_n(value)} is over the work limit {_n(rule.work_hi)} ({rule.why}); "
            "pass `perfmodel --no-limits ...` to run it anyway"
        )


def geometric_axis(name: str, values: list[float], points: int) -> list[float]:
    """``points`` (≥ 2: ``RULES["grid"]``) values geometric from the least of ``values`` to
    the greatest (``--grid``), whole numbers on an integer axis (distinct: a short range
    gives fewer), three figures otherwise."""
    kind = LISTS[name][0]
    lo, hi = min(values), max(values)
    if lo == hi:
        raise SpecError(f"--grid needs a range: {flag(name)} has one value, {lo:g}")
    axis = [lo * (hi / lo) ** (i / (points - 1)) for i in range(points)]
    if kind == "int":
        return [float(v) for v in sorted({round(v) for v in axis})]
    return [float(f"{v:.3g}") for v in axis]


def parse_list(name: str, text: str) -> list[float]:
    """A comma list option's numbers, each checked (finite, bound, count)."""
    kind, lo, lo_open, most = LISTS[name]
    f = flag(name)
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    if not parts:
        raise SpecError(f"{f}: give a comma-separated list of numbers")
    if len(parts) > most and not no_limits():
        raise SpecError(
            f"{f}: {len(parts)} values, over the work limit {most}; "
            "pass `perfmodel --no-limits ...` to run it anyway"
        )
    out: list[float] = []
    for p in parts:
        try:
            x = float(p)
        except ValueError:
            raise SpecError(f"{f}: {p!r} is not a number") from None
        if not math.isfinite(x):
            raise SpecError(f"{f}: {p!r} is not a finite number")
        if kind == "int" and not (x.is_integer() and x <= MAX_LIST_INT):
            raise SpecError(f"{f}: {p!r} must be a whole number <= {MAX_LIST_INT}")
        if x < lo or (lo_open and x == lo):
            raise SpecError(f"{f}: {p!r} must be {'>' if lo_open else '>='} {lo:g}")
        out.append(x)
    return out


#: Options naming a file the command writes.
OUT_OPTIONS = ("out", "output")


def check_options(params: Mapping[str, Any]) -> None:
    """Check every option a command received, by name (see RULES and LISTS), and its
    output path (``--out``/``--output``) before any work."""
    for name in OUT_OPTIONS:
        if isinstance(params.get(name), Path):
            force = bool(params.get("force")) or _resumes(params[name], params)
            check_out(params[name], force=force, f=flag(name))
    for name, value in params.items():
        if value is None:
            continue
        rule = RULES.get(name)
        if rule is not None:
            check_number(name, value, rule)
        elif name in LISTS and isinstance(value, str):
            parse_list(name, value)
        elif name in CHOICES and value not in CHOICES[name]:
            raise SpecError(
                f"{flag(name)} must be one of {', '.join(CHOICES[name])}; got {value!r}"
            )


def _resumes(out: Path, params: Mapping[str, Any]) -> bool:
    """``sweep --resume`` into a file it wrote: the file may exist (the sweep checks that
    the record beside it is of the same spec, and appends the missing chunks)."""
    p = Path(out)
    if not params.get("resume") or not p.name or p.is_dir():
        return False  # (a directory: check_out says so)
    from reports.sweep.run import manifest_path

    return manifest_path(p).is_file()


def check_out(path: Path | None, *, force: bool, f: str = "--out") -> None:
    """An output path is writable before any work: not a directory, parent exists and is
    writable, no existing file without ``force``."""
    if path is None:
        return
    import os

    p = Path(path)
    if str(p) in ("", ".") or p.is_dir():
        raise SpecError(f"{f} {p} is a directory; give a file name inside it")
    if p.exists() and not force:
        raise SpecError(f"{p} exists; pass --force to overwrite it")
    if p.exists() and not p.is_file():
        raise SpecError(f"{f} {p} is not a regular file; give a file name")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise SpecError(f"{f}: directory {parent} does not exist; create it first")
    if str(parent.resolve()).startswith(("/proc", "/sys")) or not os.access(parent, os.W_OK):
        raise SpecError(f"{f}: cannot write in {parent}; choose a writable directory")
