"""``perfmodel predict``: latencies for many kernel shapes at once (``hardware.gemm_predict``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from cli.common import JsonOpt, echo_json, handle_errors, write_atomic

app = typer.Typer(
    help="Predict kernel latencies from the device's cost profile.", no_args_is_help=True
)


@app.command("gemm")
@handle_errors
def gemm_cmd(
    hardware: Annotated[str, typer.Option(help="Device id or TOML path.")],
    input: Annotated[Path, typer.Option("--input", help="CSV with columns m,n,k[,dtype].")],
    output: Annotated[Path | None, typer.Option(help="Write the CSV here (else stdout).")] = None,
    force: Annotated[bool, typer.Option(help="Overwrite --output if it exists.")] = False,
    profile: Annotated[
        str | None,
        typer.Option(
            help="Fitted GEMM profile: <device>:gemm_bf16 (built-in, see `perfmodel profile "
            "show`) or a TOML from `profile fit --features gemm` (with --residual if fitted "
            "so). Default: the device's roofline."
        ),
    ] = None,
    json_out: bool = JsonOpt,
) -> None:
    """Predict GEMM latency (ms) for every row of a shapes CSV.

    The prediction goes to a column ``latency_ms`` (``predicted_latency_ms`` when the input
    already has a ``latency_ms``, e.g. measured times: it is kept as it is)."""
    from hardware.gemm_predict import (
        csv_chunks,
        predict_gemm_ms,
        prediction_column,
        read_gemm_shapes,
        row_predictions,
    )

    data = read_gemm_shapes(input, keep_rows=json_out)
    col = prediction_column(data.header)
    lat = predict_gemm_ms(hardware, data.shapes, data.dtypes, profile=profile)
    if json_out:
        echo_json(row_predictions(data, col, lat))
        return
    chunks = csv_chunks(input, data, col, lat)
    if output is None:
        sys.stdout.writelines(chunks)
        sys.stdout.flush()
    else:
        write_atomic(output, chunks, force=force)
        typer.echo(f"wrote {len(lat)} predictions to {output}", err=True)
