"""``perfmodel sweep SPEC.toml``: static-batch estimates over a grid, serial or on Dask."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from cli.common import JsonOpt, echo_json, handle_errors, stderr_isatty
from cli.options import DEFAULT_ENGINE, EngineOpt
from reports.cluster import SCHEDULER_HELP


@handle_errors
def sweep_cmd(
    spec_file: Annotated[Path, typer.Argument(help="Sweep TOML: chunk = N and a [grid] table.")],
    out: Annotated[Path, typer.Option(help="Results: JSON lines (.jsonl) or CSV (.csv).")],
    scheduler: Annotated[
        str | None,
        typer.Option(help=f"{SCHEDULER_HELP}. Default: local if dask is installed."),
    ] = None,
    workers: Annotated[
        int | None, typer.Option(help="Worker processes of the LocalCluster (default: cores).")
    ] = None,
    resume: Annotated[
        bool, typer.Option(help="Continue an interrupted sweep of the same spec into --out.")
    ] = True,
    force: Annotated[bool, typer.Option(help="Discard an existing --out and start over.")] = False,
    engine: EngineOpt = DEFAULT_ENGINE,
    json_out: bool = JsonOpt,
) -> None:
    """Run `estimate` on every configuration of a grid, in chunks, streaming the rows to
    one file in grid order; an interrupted sweep resumes where its file ends.

    SPEC.toml: `chunk = 2000` and a `[grid]` table whose keys (model, hardware, tp, pp,
    dtype, act_dtype, kv_dtype, engine, batch, input_len, output_len) are values or lists;
    the grid is their product, output_len varying fastest. --engine is grid.engine where
    the spec does not set it; every row names the engine it was costed with (engine_id)."""
    from reports.cluster import check_scheduler, dask_available
    from reports.sweep.run import run_sweep
    from reports.sweep.spec import load_spec

    spec = load_spec(spec_file, engine=engine)
    if scheduler is None:
        scheduler = "local" if dask_available() else "serial"
    check_scheduler(scheduler)
    if stderr_isatty():
        with typer.progressbar(length=spec.size, label="sweep", file=sys.stderr) as bar:
            run = run_sweep(
                spec,
                out,
                scheduler=scheduler,
                workers=workers,
                resume=resume,
                force=force,
                progress=bar.update,
            )
    else:
        run = run_sweep(spec, out, scheduler=scheduler, workers=workers, resume=resume, force=force)
    engines = list(dict(spec.axes)["engine"])
    if json_out:
        echo_json(run)
        return
    typer.echo(
        f"{run.configurations:,} configurations in {run.chunks} chunks -> {run.out}: "
        f"{run.computed_chunks} computed ({run.scheduler}, {run.workers} worker"
        f"{'s' if run.workers != 1 else ''}), {run.resumed_chunks} already done; "
        f"{run.wall_s:.1f} s; engine {', '.join(engines)} (each row's engine_id)"
    )
