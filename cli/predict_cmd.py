"""``perfmodel predict``: latencies for many kernel shapes at once."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from cli.common import JsonOpt, echo_json, handle_errors, write_atomic
from hardware.device import load_device
from hardware.roofline import Roofline
from perfmodel.dtypes import get_dtype
from perfmodel.errors import SpecError
from perfmodel.units import MS_PER_S

app = typer.Typer(
    help="Predict kernel latencies from the device's cost profile.", no_args_is_help=True
)


def read_gemm_shapes(path: Path) -> tuple[list[dict[str, str]], list[str], np.ndarray, list[str]]:
    """Rows, header, an (n, 3) array of m, n, k, and per-row dtype names."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise SpecError(f"cannot read {path}: {e.strerror}") from None
    reader = csv.DictReader(io.StringIO(text))
    header = list(reader.fieldnames or [])
    missing = [c for c in ("m", "n", "k") if c not in header]
    if missing:
        raise SpecError(f"{path}: missing column(s) {', '.join(missing)}; need m,n,k[,dtype]")
    rows = list(reader)
    if not rows:
        raise SpecError(f"{path}: no data rows")
    shapes = np.empty((len(rows), 3))
    dtypes = []
    for i, r in enumerate(rows):
        line = i + 2
        for j, c in enumerate(("m", "n", "k")):
            v = r.get(c)
            try:
                x = float(v)  # type: ignore[arg-type]
            except (TypeError, ValueError):
                raise SpecError(f"{path}:{line}: column {c} = {v!r} is not a number") from None
            if not x > 0 or x != int(x):
                raise SpecError(f"{path}:{line}: column {c} = {v!r} must be a positive integer")
            shapes[i, j] = x
        dt = (r.get("dtype") or "bf16").strip()
        try:
            dtypes.append(get_dtype(dt).name)
        except SpecError as e:
            raise SpecError(f"{path}:{line}: {e}") from None
    return rows, header, shapes, dtypes


def predict_gemm_ms(hardware: str, shapes: np.ndarray, dtypes: list[str]) -> np.ndarray:
    prof = Roofline(load_device(hardware))
    out = np.empty(len(shapes))
    arr = np.array(dtypes)
    for dt in np.unique(arr):
        sel = arr == dt
        m, n, k = shapes[sel].T
        out[sel] = prof.gemm_time_s(m, n, k, dtype=str(dt)) * MS_PER_S
    return out


@app.command("gemm")
@handle_errors
def gemm_cmd(
    hardware: Annotated[str, typer.Option(help="Device id or TOML path.")],
    input: Annotated[Path, typer.Option("--input", help="CSV with columns m,n,k[,dtype].")],
    output: Annotated[Path | None, typer.Option(help="Write the CSV here (else stdout).")] = None,
    force: Annotated[bool, typer.Option(help="Overwrite --output if it exists.")] = False,
    json_out: bool = JsonOpt,
) -> None:
    """Predict GEMM latency (ms) for every row of a shapes CSV."""
    rows, header, shapes, dtypes = read_gemm_shapes(input)
    lat = predict_gemm_ms(hardware, shapes, dtypes)
    if json_out:
        echo_json([{**r, "latency_ms": float(t)} for r, t in zip(rows, lat, strict=True)])
        return
    buf = io.StringIO()
    fields = [*header, "latency_ms"] if "latency_ms" not in header else header
    w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    w.writeheader()
    for r, t in zip(rows, lat, strict=True):
        w.writerow({**r, "latency_ms": f"{t:.6g}"})
    if output is None:
        typer.echo(buf.getvalue(), nl=False)
    else:
        write_atomic(output, buf.getvalue(), force=force)
        typer.echo(f"wrote {len(rows)} predictions to {output}", err=True)
