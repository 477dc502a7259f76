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
