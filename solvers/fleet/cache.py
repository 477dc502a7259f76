"""On-disk cache of configuration evaluations (goodput searches cost ~0.1-1 s each).

Keyed by a SHA-256 of everything the evaluation reads: the model, device, plan,
workload lengths and burstiness, SLO, engine settings, and the source text of the
``perfmodel`` and ``hardware`` packages, of the PD planner's modules and of
``solvers/fleet/candidates.py``, ``pd_roles.py``, ``search.py`` and ``planning.py`` (so a
change to the performance model invalidates every entry; a change to the fleet MILP or the
report does not: the MILP solutions of :mod:`solvers.fleet.batch` have their own key).
Entries are pickles of the project's own frozen dataclasses, written atomically. Directory:
``$PERFMODEL_CACHE_DIR``, else ``$XDG_CACHE_HOME/perfmodel``, else ``~/.cache/perfmodel``;
``PERFMODEL_CACHE_DIR=off`` disables it.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, TypeVar, cast

T = TypeVar("T")
_MAX_WORKERS = 4


@cache
def code_version() -> str:
    """A digest of the modelling code the evaluations run (see the module docstring)."""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parents[2]
    files = [*(root / "perfmodel").rglob("*.py"), *(root / "hardware").rglob("*.py")]
    files += [*(root / "solvers").rglob("pd*.py"), root / "solvers/fleet/candidates.py"]
    files += [root / "solvers/fleet/planning.py"]
    files += [root / "solvers/fleet/pd_roles.py"]
    files += [*(root / "solvers").rglob("pd/*.py")]
    for f in sorted(set(files)):
        h.update(f.relative_to(root).as_posix().encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def cache_dir() -> Path | None:
    env = os.environ.get("PERFMODEL_CACHE_DIR")
    if env == "off":
        return None
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "perfmodel"


def digest(*parts: Any) -> str:
    """A stable key of ``parts`` (reprs; numpy arrays by their bytes)."""
    h = hashlib.sha256(code_version().encode())
    for p in parts:
        tobytes = getattr(p, "tobytes", None)
        h.update(tobytes() if callable(tobytes) else repr(p).encode())
        h.update(b"\x00")
    return h.hexdigest()


def cached(kind: str, key: str, compute: Callable[[], T], *, enabled: bool = True) -> T:
    """``compute()``, memoized on disk under ``kind/key`` (a corrupt entry is recomputed)."""
    d = cache_dir() if enabled else None
    if d is None:
        return compute()
    job = Job(kind, key, compute)
    hit, value = _load(d, job)
    if hit:
        return cast(T, value)
    value = compute()
    _store(d, job, value)
    return cast(T, value)


@dataclass(frozen=True)
class Job:
    """One cacheable evaluation: ``compute(*values of after)`` stored under ``kind/key``.

    ``after``: the keys of earlier jobs of the same :func:`run_jobs` call whose values
    ``compute`` takes (the job's own key must determine its value: they are evaluations
    of the same inputs)."""

    kind: str
    key: str
    compute: Callable[..., Any]
    after: tuple[str, ...] = ()


def _load(d: Path | None, job: Job) -> tuple[bool, Any]:
    if d is None:
        return False, None
    try:
        with (d / job.kind / f"{job.key}.pkl").open("rb") as f:
            return True, pickle.load(f)
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError):
        return False, None


def _store(d: Path | None, job: Job, value: Any) -> None:
    if d is None:
        return
    path = d / job.kind / f"{job.key}.pkl"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, path)
    except OSError:  # a read-only home: the cache is an optimization, not a requirement
        pass


@dataclass(frozen=True)
class _Inputs:
    """``compute`` with the inputs known before it is sent (``known``; None at the
    positions ``late`` of the values it waits for, given as its arguments)."""

    compute: Callable[..., Any]
    known: tuple[Any, ...]
    late: tuple[int, ...]

    def __call__(self, *args: Any) -> Any:
        values = list(self.known)
        for p, v in zip(self.late, args, strict=True):
            values[p] = v
        return self.compute(*values)


def run_jobs(
    jobs: Sequence[Job],
    *,
    enabled: bool = True,
    workers: int | None = None,
    preload: Sequence[str] = (),
    meanwhile: Sequence[str] = (),
) -> list[Any]:
    """Every job's value: from the cache, else computed — in ``workers`` forked processes
    when more than one job misses (default: the CPUs this process may use, at most 4),
    serially when a pool cannot be had. Results are identical either way. ``preload``:
    modules the jobs import, imported before the fork when some job misses (once, not
    once per process); ``meanwhile``: modules the caller needs next, imported in this
    process while the workers compute."""
    d = cache_dir() if enabled else None
    out: list[Any] = [None] * len(jobs)
    missing = []
    for i, job in enumerate(jobs):
        hit, value = _load(d, job)
        if hit:
            out[i] = value
        else:
            missing.append(i)
    if workers is None:
        workers = min(len(os.sched_getaffinity(0)), _MAX_WORKERS)
    values: list[Any] | None = None
    import importlib

    if missing:
        for name in preload:
            importlib.import_module(name)
    index = {job.key: i for i, job in enumerate(jobs)}
    deps = [tuple(index[k] for k in jobs[i].after) for i in missing]
    if len(missing) > 1 and workers > 1:
        from perfmodel.forked import fork_map

        def imports() -> None:
            for name in meanwhile:
                importlib.import_module(name)

        # a job's inputs: other missing jobs' values (it waits for them), and values read
        # from the cache (bound now)
        slot = {i: n for n, i in enumerate(missing)}
        calls: list[Callable[..., Any]] = []
        after: list[tuple[int, ...]] = []
        for i, dep in zip(missing, deps, strict=True):
            known = tuple(None if j in slot else out[j] for j in dep)
            late = tuple(p for p, j in enumerate(dep) if j in slot)
            calls.append(_Inputs(jobs[i].compute, known, late) if dep else jobs[i].compute)
            after.append(tuple(slot[j] for j in dep if j in slot))
        values = fork_map(calls, workers, meanwhile=imports, after=after)
    if values is None:
        values = []
        for i, dep in zip(missing, deps, strict=True):
            out[i] = jobs[i].compute(*(out[j] for j in dep))
            values.append(out[i])
    for i, v in zip(missing, values, strict=True):
        out[i] = v
        _store(d, jobs[i], v)
    return out
