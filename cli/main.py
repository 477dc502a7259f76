"""The ``perfmodel`` Typer app: one sub-app per domain. Heavy imports stay lazy."""

from __future__ import annotations

import typer

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

app = typer.Typer(
    name="perfmodel",
    help="Analytical performance modeling and capacity planning for LLM inference serving.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
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
