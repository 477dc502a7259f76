"""Shared CLI plumbing: error handling, JSON, tables, atomic writes."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

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
    """Turn the project's errors (and bad files) into one line on stderr and exit 2."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        from cli.validate import check_options

        try:
            check_options(kwargs)
            return fn(*args, **kwargs)
        except PerfModelError as e:
            raise fail(str(e)) from None
        except FileExistsError as e:
            raise fail(str(e)) from None

    return wrapper


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


def echo_json(obj: Any) -> None:
    typer.echo(json.dumps(_clean(json.loads(json.dumps(obj, default=_default))), indent=2))


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


def write_atomic(path: Path, text: str, *, force: bool) -> None:
    """Write ``text`` to ``path`` via a temporary file; refuse to overwrite without force."""
    if path.exists() and not force:
        raise FileExistsError(f"{path} exists; pass --force to overwrite it")
    if not path.parent.exists():
        raise PerfModelErrorPath(f"directory {path.parent} does not exist")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
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
    if not stderr_isatty():
        yield lambda _n: None
        return
    with typer.progressbar(length=length, label=label, file=sys.stderr, show_eta=True) as bar:
        yield bar.update
