"""Shared CLI plumbing: error handling, JSON, tables, atomic writes."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, ParamSpec, Protocol, TypeVar

import typer

from perfmodel.errors import PerfModelError

P = ParamSpec("P")
R = TypeVar("R")

JsonOpt = typer.Option(False, "--json", help="Print machine-readable JSON instead of tables.")


def fail(message: str) -> typer.Exit:
    """Print a one-line error to stderr and return the exit (code 2) to raise."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=2)


def handle_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn the project's errors (and bad files) into one line on stderr and exit 2.

    Options are checked first (``cli.validate``), and the command runs under the wall-clock
    limit (:func:`time_limit`).
    """

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        from cli.validate import check_options

        try:
            check_options(kwargs)
            with time_limit():
                return fn(*args, **kwargs)
        except PerfModelError as e:
            raise fail(str(e)) from None
        except FileExistsError as e:
            raise fail(str(e)) from None
        except TimeLimitExceeded as e:
            raise fail(str(e)) from None

    return wrapper


#: Wall-clock limit of one command's work, seconds (env PERFMODEL_TIME_LIMIT_S; --no-limits
#: lifts it): 50 s of work leaves room for start-up within the 60 s a command may take.
DEFAULT_TIME_LIMIT_S = 50.0
_PROGRESS = {"done": 0, "total": 0}


class TimeLimitExceeded(BaseException):
    """Raised by the alarm; a BaseException so that no ``except Exception`` swallows it."""


def time_limit_s() -> float:
    from cli.validate import no_limits

    if no_limits():
        return math.inf
    raw = os.environ.get("PERFMODEL_TIME_LIMIT_S", "")
    try:
        v = float(raw) if raw else DEFAULT_TIME_LIMIT_S
    except ValueError:
        v = DEFAULT_TIME_LIMIT_S
    return v if math.isfinite(v) and v > 0 else math.inf


@contextlib.contextmanager
def time_limit() -> Iterator[None]:
    """Stop the command with one line once it has run ``time_limit_s()`` seconds.

    Uses SIGALRM (main thread, POSIX); elsewhere the command runs unbounded. Output files
    are written atomically, so a stopped command leaves nothing behind.
    """
    import signal
    import threading

    limit = time_limit_s()
    usable = (
        math.isfinite(limit)
        and hasattr(signal, "setitimer")
        and threading.current_thread() is threading.main_thread()
    )
    if not usable:
        yield
        return
    _PROGRESS.update(done=0, total=0)

    def on_alarm(_sig: int, _frame: object) -> None:
        done, total = _PROGRESS["done"], _PROGRESS["total"]
        part = f" ({done} of {total} steps done)" if total else ""
        raise TimeLimitExceeded(
            f"stopped after {limit:g} s, the time limit{part}; ask for less work (fewer "
            "requests, a coarser grid) or pass `perfmodel --no-limits ...` to let it run"
        )

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _default(o: Any) -> Any:
    try:
        import numpy as np

        if isinstance(o, np.ndarray):
            return o.tolist()
        if isinstance(o, np.generic):
            return o.item()
    except ImportError:  # pragma: no cover
        pass
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def _clean(o: Any) -> Any:
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, dict):
        return {k: _clean(v) for k, v in o.items()}
    if isinstance(o, list | tuple):
        return [_clean(v) for v in o]
    return o


class Result(Protocol):
    """A command's answer: a library object whose ``to_dict()`` is the command's JSON."""

    def to_dict(self) -> Any: ...


def json_of(result: Result | Sequence[Result]) -> Any:
    """The JSON value of a result (a list of results: the list of theirs): ``to_dict()``.

    The one way a command's ``--json`` is made; a dict or list built by hand is refused,
    so that every command's JSON comes from the library's result objects.
    """
    if isinstance(result, list | tuple):
        return [_dict_of(r) for r in result]
    return _dict_of(result)


def _dict_of(result: object) -> Any:
    to_dict = getattr(result, "to_dict", None)
    if not callable(to_dict):
        raise TypeError(
            f"--json prints a result object's to_dict(), not a {type(result).__name__} "
            "built in the CLI"
        )
    return _clean(json.loads(json.dumps(to_dict(), default=_default)))


def echo_json(result: Result | Sequence[Result]) -> None:
    """Print :func:`json_of` the result."""
    typer.echo(json.dumps(json_of(result), indent=2))


def table(rows: Sequence[Sequence[Any]], headers: Sequence[str]) -> str:
    """A plain aligned text table."""
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(c: Any) -> str:
    if isinstance(c, float):
        if c == 0:
            return "0"
        if abs(c) >= 1e5 or abs(c) < 1e-3:
            return f"{c:.3g}"
        return f"{c:,.4g}" if abs(c) < 1000 else f"{c:,.0f}"
    return str(c)


class PerfModelErrorPath(PerfModelError):
    """An output path that cannot be written."""


def write_atomic(path: Path, text: str | Iterable[str], *, force: bool) -> None:
    """Write ``text`` (or its chunks, in order) to ``path`` via a temporary file; refuse to
    overwrite without force."""
    if path.exists() and not force:
        raise FileExistsError(f"{path} exists; pass --force to overwrite it")
    if not path.parent.exists():
        raise PerfModelErrorPath(f"directory {path.parent} does not exist")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text) if isinstance(text, str) else f.writelines(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a report should be readable
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def stderr_isatty() -> bool:
    return sys.stderr.isatty()


@contextlib.contextmanager
def progress(length: int, label: str) -> Iterator[Callable[[int], None]]:
    """A progress bar with an ETA on stderr, only on a terminal; yields its ``update``.

    Off a terminal nothing is printed (no label before an ``error:`` line, nothing in
    captured output).
    """
    _PROGRESS.update(done=0, total=length)

    def count(n: int) -> None:
        _PROGRESS["done"] += n

    if not stderr_isatty():
        yield count
        return
    with typer.progressbar(length=length, label=label, file=sys.stderr, show_eta=True) as bar:

        def tick(n: int) -> None:
            count(n)
            bar.update(n)

        yield tick
