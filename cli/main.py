"""The ``perfmodel`` Typer app: one sub-app per domain. Heavy imports stay lazy."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

# One BLAS thread, set before numpy loads OpenBLAS: the vectors here are small (a dot of
# 262,144 atoms takes 0.4 ms on one thread and 16 ms on two contended ones, where idle
# threads spin), and the sweep's parallelism is processes. An explicit setting wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import typer
from typer import _click as click
from typer.core import Abort, TyperGroup

from cli import (
    cache_cmd,
    capacity_cmd,
    claims_cmd,
    dispatch_cmd,
    estimate_cmd,
    hardware_cmd,
    model_cmd,
    pd_cmd,
    phase_cmd,
    plan_cmd,
    predict_cmd,
    profile_cmd,
    sweep_cmd,
    validate_cmd,
)

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


app = typer.Typer(
    cls=OneLineGroup,
    name="perfmodel",
    help="Analytical performance modeling and capacity planning for LLM inference serving.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def _root(
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


app.command("plan")(plan_cmd.plan_cmd)
app.add_typer(hardware_cmd.app, name="hardware")
app.add_typer(model_cmd.app, name="model")
app.add_typer(predict_cmd.app, name="predict")
app.command("estimate")(estimate_cmd.estimate_cmd)
app.add_typer(dispatch_cmd.app, name="dispatch")
app.add_typer(profile_cmd.app, name="profile")
app.add_typer(cache_cmd.app, name="cache")
app.command("capacity")(capacity_cmd.capacity_cmd)
app.command("simulate")(capacity_cmd.simulate_cmd)
app.add_typer(pd_cmd.app, name="pd")
app.add_typer(phase_cmd.app, name="phase")
app.command("sweep")(sweep_cmd.sweep_cmd)
app.add_typer(claims_cmd.app, name="claims")
app.command("validate")(validate_cmd.validate_cmd)
app.command("calibrate")(validate_cmd.calibrate_cmd)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
