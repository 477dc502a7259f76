"""The ``perfmodel`` Typer app: one sub-app per domain. Heavy imports stay lazy.

:data:`COMMANDS` names each top-level command's module; a run of ``perfmodel NAME ...``
(:func:`main`) imports and builds only that command (Typer reads every command's
signature when it builds an app: ~60 ms of start-up for the 16 of them), while
``perfmodel --help``, an unknown name and ``cli.main.app`` (the tests) get them all.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Sequence
from typing import Any

# One BLAS thread, set before numpy loads OpenBLAS: the vectors here are small (a dot of
# 262,144 atoms takes 0.4 ms on one thread and 16 ms on two contended ones, where idle
# threads spin), and the sweep's parallelism is processes. An explicit setting wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# Plain Click help and errors, not Typer's rich panels: importing rich (and the markdown
# and syntax-highlighting modules Typer's rich layer pulls in) is ~0.1 s of every start-up,
# 40 % of `perfmodel --help`. `TYPER_USE_RICH=1` brings the panels back.
os.environ.setdefault("TYPER_USE_RICH", "0")

import typer
from typer import _click as click
from typer.core import Abort, TyperGroup

from cli.coerce import install as _plain_coercion

_plain_coercion()  # option values without pydantic when plain (cli/coerce.py)

_TYPE_WORDS = {
    "int_parsing": "is not an integer",
    "int_from_float": "is not an integer",
    "float_parsing": "is not a number",
    "finite_number": "is not a finite number",
    "bool_parsing": "is not true or false",
}


def _param_name(e: click.exceptions.ClickException) -> str:
    p = getattr(e, "param", None)
    opts = getattr(p, "opts", None)
    if opts:
        return str(max(opts, key=len))
    return str(getattr(e, "param_hint", None) or getattr(p, "name", "") or "")


def usage_line(e: click.exceptions.ClickException) -> str:
    """One line for a usage error: ``--tp: 'nan' is not an integer``."""
    cause = e.__cause__
    errs = getattr(cause, "errors", None)
    name = _param_name(e)
    if isinstance(e, click.exceptions.BadParameter) and callable(errs):
        first = errs()[0]
        words = _TYPE_WORDS.get(str(first.get("type")), str(first.get("msg", "is not valid")))
        return f"{name}: {first.get('input')!r} {words}"
    if isinstance(e, click.exceptions.BadParameter):
        msg = e.message if hasattr(e, "message") else e.format_message()
        return f"{name}: {msg}" if name else msg
    if isinstance(e, click.exceptions.MissingParameter):
        return f"missing option {name}" if name else e.format_message()
    return " ".join(e.format_message().split())


class OneLineGroup(TyperGroup):
    """The root group: usage errors and crashes are one line on stderr, exit 2."""

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.NoArgsIsHelpError as e:
            click.echo(e.ctx.get_help() if e.ctx else "", err=True)
            sys.exit(2)
        except click.exceptions.ClickException as e:
            click.echo(f"error: {usage_line(e).rstrip('.')}", err=True)
            sys.exit(2)
        except Abort:
            click.echo("error: interrupted", err=True)
            sys.exit(130)
        except KeyboardInterrupt:
            click.echo("error: interrupted", err=True)
            sys.exit(130)
        except BrokenPipeError:
            sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - the reader left; say nothing
            sys.exit(1)
        except MemoryError:
            click.echo("error: out of memory; ask for a smaller problem", err=True)
            sys.exit(2)
        except Exception as e:
            if os.environ.get("PERFMODEL_DEBUG"):
                raise
            # A bug, not bad input: exit 70 so tests catch it, one line for a user.
            msg = " ".join(str(e).split())[:300]
            click.echo(
                f"error: internal error ({type(e).__name__}: {msg}); please report it "
                "(PERFMODEL_DEBUG=1 shows the traceback)",
                err=True,
            )
            sys.exit(70)
        sys.exit(rv if isinstance(rv, int) else 0)


#: Top-level commands in ``--help`` order: name -> (module in ``cli``, attribute, kind); a
#: "group" attribute is a Typer sub-app, a "command" one a function.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "plan": ("plan_cmd", "plan_cmd", "command"),
    "hardware": ("hardware_cmd", "app", "group"),
    "model": ("model_cmd", "app", "group"),
    "predict": ("predict_cmd", "app", "group"),
    "estimate": ("estimate_cmd", "estimate_cmd", "command"),
    "dispatch": ("dispatch_cmd", "app", "group"),
    "profile": ("profile_cmd", "app", "group"),
    "cache": ("cache_cmd", "app", "group"),
    "capacity": ("capacity_cmd", "capacity_cmd", "command"),
    "simulate": ("capacity_cmd", "simulate_cmd", "command"),
    "pd": ("pd_cmd", "app", "group"),
    "phase": ("phase_cmd", "app", "group"),
    "sweep": ("sweep_cmd", "sweep_cmd", "command"),
    "claims": ("claims_cmd", "app", "group"),
    "validate": ("validate_cmd", "validate_cmd", "command"),
    "calibrate": ("validate_cmd", "calibrate_cmd", "command"),
}


def _no_limits_option(
    no_limits: bool = typer.Option(
        False,
        "--no-limits",
        help="Lift the work limits (requests, adapters, grid levels, tokens, samples) that "
        "keep a command from running for minutes.",
    ),
) -> None:
    """Analytical performance modeling and capacity planning for LLM inference serving."""
    from cli.validate import set_no_limits

    set_no_limits(no_limits)


def build_app(names: Sequence[str] | None = None) -> typer.Typer:
    """The root app with the commands ``names`` (default: all of :data:`COMMANDS`)."""
    root = typer.Typer(
        cls=OneLineGroup,
        name="perfmodel",
        help="Analytical performance modeling and capacity planning for LLM inference serving.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        add_completion=False,
    )
    root.callback()(_no_limits_option)
    for name in COMMANDS if names is None else names:
        module, attr, kind = COMMANDS[name]
        obj = getattr(importlib.import_module(f"cli.{module}"), attr)
        if kind == "group":
            root.add_typer(obj, name=name)
        else:
            root.command(name)(obj)
    return root


def _command_named(argv: Sequence[str]) -> str | None:
    """The top-level command of ``argv`` when it is one of :data:`COMMANDS` (the root's
    only option, ``--no-limits``, takes no value: the first other word is the command)."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


_FULL: dict[str, typer.Typer] = {}


def __getattr__(name: str) -> Any:
    """``cli.main.app``: the app with every command, built on first use."""
    if name == "app":
        if "app" not in _FULL:
            _FULL["app"] = build_app()
        return _FULL["app"]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    only = _command_named(sys.argv[1:])
    build_app(None if only is None else [only])()


if __name__ == "__main__":
    main()
