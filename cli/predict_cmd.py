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
from perfmodel.datafile import parse_int, read_csv
from perfmodel.dtypes import get_dtype
from perfmodel.errors import SpecError
from perfmodel.units import MS_PER_S

app = typer.Typer(
    help="Predict kernel latencies from the device's cost profile.", no_args_is_help=True
)


#: Largest GEMM dimension accepted in a shapes CSV (far beyond any real kernel).
MAX_GEMM_DIM = 2**31


def read_gemm_shapes(path: Path) -> tuple[list[dict[str, str]], list[str], np.ndarray, list[str]]:
    """Rows, header, an (n, 3) array of m, n, k, and per-row dtype names."""
    tab = read_csv(path, what="shapes CSV", required=("m", "n", "k"))
    header = list(tab.header)
    shapes = np.empty((len(tab), 3))
    dtypes = []
    has_dtype = "dtype" in header
    for i, (line, r) in enumerate(tab):
        where = tab.where(line)
        for j, c in enumerate(("m", "n", "k")):
            shapes[i, j] = parse_int(
                r[header.index(c)], where=where, name=c, min_value=1, max_value=MAX_GEMM_DIM
            )
        dt = (r[header.index("dtype")] if has_dtype else "") or "bf16"
        try:
            dtypes.append(get_dtype(dt).name)
        except SpecError as e:
            raise SpecError(f"{where}: {e}") from None
    return tab.to_dicts(), header, shapes, dtypes


def predict_gemm_ms(
    hardware: str, shapes: np.ndarray, dtypes: list[str], *, profile: str | None = None
) -> np.ndarray:
    """Milliseconds per shape: the device's roofline, or a fitted GEMM profile."""
    dev = load_device(hardware)
    if profile is not None:
        return _profile_gemm_ms(profile, dev.id, shapes, dtypes)
    prof = Roofline(dev)
    out = np.empty(len(shapes))
    arr = np.array(dtypes)
    for dt in np.unique(arr):
        sel = arr == dt
        m, n, k = shapes[sel].T
        out[sel] = prof.gemm_time_s(m, n, k, dtype=str(dt)) * MS_PER_S
    return out


def _profile_gemm_ms(
    spec: str, device_id: str, shapes: np.ndarray, dtypes: list[str]
) -> np.ndarray:
    from hardware.maxaffine import GEMM_FEATURES, gemm_features
    from hardware.profile_io import load_profile

    prof = load_profile(spec, device=device_id)
    if prof.features != GEMM_FEATURES:
        raise SpecError(
            f"profile {spec} has features {list(prof.features)}, not the GEMM features "
            f"{list(GEMM_FEATURES)}; fit one with `perfmodel profile fit --features gemm`"
        )
    want = get_dtype(prof.provenance.dtype).name
    other = sorted({d for d in dtypes if get_dtype(d).name != want})
    if other:
        raise SpecError(
            f"profile {spec} was fitted to {want} GEMMs; the input also has {other} "
            f"(predict those rows without --profile, or fit a profile per dtype)"
        )
    m, n, k = shapes.T
    return np.asarray(prof(gemm_features(m, n, k)) * MS_PER_S, dtype=np.float64)


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
    """Predict GEMM latency (ms) for every row of a shapes CSV."""
    rows, header, shapes, dtypes = read_gemm_shapes(input)
    lat = predict_gemm_ms(hardware, shapes, dtypes, profile=profile)
    # A measured latency_ms column is kept; the prediction then goes next to it.
    col = "predicted_latency_ms" if "latency_ms" in header else "latency_ms"
    if json_out:
        echo_json([{**r, col: float(t)} for r, t in zip(rows, lat, strict=True)])
        return
    buf = io.StringIO()
    fields = [*header, col] if col not in header else header
    w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    w.writeheader()
    for r, t in zip(rows, lat, strict=True):
        w.writerow({**r, col: f"{t:.6g}"})
    if output is None:
        typer.echo(buf.getvalue(), nl=False)
    else:
        write_atomic(output, buf.getvalue(), force=force)
        typer.echo(f"wrote {len(rows)} predictions to {output}", err=True)
