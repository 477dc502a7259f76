"""GEMM latencies for a shapes CSV: read ``m,n,k[,dtype]`` rows in bulk, predict each with
the device's roofline or a fitted GEMM profile, write the rows back with the prediction.

``perfmodel predict gemm`` is this module's command; its ``--json`` is the list of
:class:`GemmPrediction` rows.
"""

from __future__ import annotations

import csv
import io
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import numpy as np

from perfmodel.errors import SpecError
from perfmodel.units import MS_PER_S

SHAPE_COLS = ("m", "n", "k")
PREDICTION_COL = "latency_ms"
_WRITE_BLOCK_CHARS = 1 << 22  # characters of input copied through at a time (bounded memory)
_MODEL_CHUNK_ROWS = 1 << 17  # shapes costed at a time (the roofline's temporaries)
#: Largest GEMM dimension accepted in a shapes CSV (far beyond any real kernel).
MAX_GEMM_DIM = 2**31


@dataclass(frozen=True)
class GemmShapes:
    """A shapes CSV: its header, the (rows, 3) array of m, n, k, each row's dtype name,
    and whether it was read in bulk (its data lines can then be copied through as is)."""

    header: list[str]
    shapes: np.ndarray
    dtypes: np.ndarray
    bulk: bool
    rows: list[dict[str, str]] | None = None  # per-row strings, from the row-by-row reader


def read_gemm_shapes(path: Path, *, keep_rows: bool = False) -> GemmShapes:
    """Read ``m,n,k[,dtype]`` rows: numpy's C reader for the numeric columns; a file it
    does not take (quoted fields, ragged rows, a bad value) is read row by row, which
    names the first bad row by line, column and value."""
    from perfmodel.datafile import check_file

    check_file(path, what="shapes CSV")  # a directory, a device, too large: one line
    try:
        with path.open(encoding="utf-8-sig", newline="") as f:  # a BOM is not a column name
            header = [h.strip() for h in next(csv.reader([f.readline()]), [])]
    except (OSError, UnicodeDecodeError, csv.Error):
        return _read_rows(path)  # the input layer says what is wrong
    if any(c not in header for c in SHAPE_COLS):
        return _read_rows(path)
    if not keep_rows:
        cols = [header.index(c) for c in SHAPE_COLS]
        usecols = [*cols, header.index("dtype")] if "dtype" in header else cols
        commas, ascii_ = _scan(path)
        a = _bulk_load(path, usecols, "dtype" in header, integers=ascii_)
        rows_ok = a is not None and commas == (len(header) - 1) * (a.size + 1)
        if rows_ok and a is not None and a.size and len(header) == len(set(header)) and all(header):
            shapes = np.stack([a[c] for c in SHAPE_COLS], axis=1).astype(np.float64)
            ok = np.isfinite(shapes) & (shapes > 0) & (shapes <= MAX_GEMM_DIM)
            if np.all(ok & (shapes == np.floor(shapes))):
                names = _dtype_names(a["dtype"] if "dtype" in header else None, a.size)
                if names is not None:
                    return GemmShapes(header, shapes, names, bulk=True)
    return _read_rows(path)


def _bulk_load(
    path: Path, usecols: list[int], has_dt: bool, *, integers: bool
) -> np.ndarray | None:
    """The shape columns (and the dtype column) by numpy's C reader: as integers when
    ``integers`` (3x faster to parse; numpy >= 2 refuses ``1.5`` as one), else or then as
    numbers (``1024.0``); None if neither takes the file."""
    for num in ("i8", "f8") if integers else ("f8",):
        fields = [(c, num) for c in SHAPE_COLS] + ([("dtype", "S16")] if has_dt else [])
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # "input contained no data"
                return np.loadtxt(
                    path,
                    delimiter=",",
                    skiprows=1,
                    usecols=usecols,
                    dtype=fields,
                    comments=None,
                    ndmin=1,
                    encoding="utf-8-sig",
                )
        except (ValueError, OverflowError, UnicodeDecodeError):
            continue  # the next reader (at last the row-by-row one) says what is wrong
    return None


def _scan(path: Path) -> tuple[int, bool]:
    """One pass over the bytes (C speed): the commas (every row must have the header's
    fields, and numpy's reader does not check the columns it does not use) and whether the
    file is ASCII but for a BOM (numpy 2.4's integer parser crashes the process — a
    segfault, found by tests/fuzz — on some fields with characters beyond the BMP; its
    float parser does not: other files skip the integer pass)."""
    n, ascii_ = 0, True
    with path.open("rb") as f:
        first = True
        while chunk := f.read(1 << 24):
            n += chunk.count(b",")
            ascii_ = ascii_ and (chunk.removeprefix(b"\xef\xbb\xbf") if first else chunk).isascii()
            first = False
    return n, ascii_


def _dtype_names(col: np.ndarray | None, n: int) -> np.ndarray | None:
    """Canonical dtype name per row (empty = bf16); None if one is unknown or cut short."""
    from perfmodel.dtypes import DTYPE_NAMES, get_dtype

    if col is None:
        return np.full(n, "bf16")
    if n and int(np.char.str_len(col).max()) >= col.dtype.itemsize:
        return None  # possibly cut at the field width: let the row reader judge it
    out = np.empty(n, dtype=f"U{max(map(len, DTYPE_NAMES))}")
    todo = np.arange(n)
    while todo.size:  # one vectorized pass per distinct spelling (a handful)
        raw = col[todo[0]]
        sel = col[todo] == raw
        try:
            out[todo[sel]] = get_dtype(raw.decode("utf-8").strip() or "bf16").name
        except (SpecError, UnicodeDecodeError):
            return None
        todo = todo[~sel]
    return out


def _read_rows(path: Path) -> GemmShapes:
    """Row by row through the input layer: the reference reader, and the one that names
    the bad row, column and value."""
    from perfmodel.datafile import parse_int, read_csv
    from perfmodel.dtypes import get_dtype

    tab = read_csv(path, what="shapes CSV", required=SHAPE_COLS)
    header = list(tab.header)
    shapes = np.empty((len(tab), 3))
    dtypes = []
    for i, (line, r) in enumerate(tab):
        where = tab.where(line)
        for j, c in enumerate(SHAPE_COLS):
            shapes[i, j] = parse_int(
                r[header.index(c)], where=where, name=c, min_value=1, max_value=MAX_GEMM_DIM
            )
        dt = (r[header.index("dtype")] if "dtype" in header else "") or "bf16"
        try:
            dtypes.append(get_dtype(dt).name)
        except SpecError as e:
            raise SpecError(f"{where}: {e}") from None
    return GemmShapes(header, shapes, np.array(dtypes), bulk=False, rows=tab.to_dicts())


def predict_gemm_ms(
    hardware: str, shapes: np.ndarray, dtypes: np.ndarray, *, profile: str | None = None
) -> np.ndarray:
    """Milliseconds per shape: the device's roofline, or a fitted GEMM profile."""
    from hardware.device import load_device
    from hardware.roofline import Roofline

    dev = load_device(hardware)
    if profile is not None:
        return _profile_gemm_ms(profile, dev.id, shapes, dtypes)
    prof = Roofline(dev)
    out = np.empty(len(shapes))
    for dt in sorted(set(dtypes.tolist())):
        idx = np.flatnonzero(dtypes == dt)
        for i in range(0, idx.size, _MODEL_CHUNK_ROWS):  # bounded temporaries
            sel = idx[i : i + _MODEL_CHUNK_ROWS]
            m, n, k = shapes[sel].T
            out[sel] = prof.gemm_time_s(m, n, k, dtype=str(dt)) * MS_PER_S
    return out


def _profile_gemm_ms(
    spec: str, device_id: str, shapes: np.ndarray, dtypes: np.ndarray
) -> np.ndarray:
    from hardware.maxaffine import GEMM_FEATURES, gemm_features
    from hardware.profile_io import load_profile
    from perfmodel.dtypes import get_dtype

    prof = load_profile(spec, device=device_id)
    if prof.features != GEMM_FEATURES:
        raise SpecError(
            f"profile {spec} has features {list(prof.features)}, not the GEMM features "
            f"{list(GEMM_FEATURES)}; fit one with `perfmodel profile fit --features gemm`"
        )
    want = get_dtype(prof.provenance.dtype).name
    other = sorted({d for d in set(dtypes.tolist()) if get_dtype(d).name != want})
    if other:
        raise SpecError(
            f"profile {spec} was fitted to {want} GEMMs; the input also has {other} "
            f"(predict those rows without --profile, or fit a profile per dtype)"
        )
    m, n, k = shapes.T
    return np.asarray(prof(gemm_features(m, n, k)) * MS_PER_S, dtype=np.float64)


def prediction_column(header: list[str]) -> str:
    """The output column: ``latency_ms``, or ``predicted_latency_ms`` beside a measured one."""
    for col in (PREDICTION_COL, f"predicted_{PREDICTION_COL}"):
        if col not in header:
            return col
    raise SpecError(
        f"the input already has columns {PREDICTION_COL} and predicted_{PREDICTION_COL}; "
        "rename one so the prediction has a column of its own"
    )


def csv_chunks(path: Path, data: GemmShapes, col: str, lat: np.ndarray) -> Iterator[str]:
    """The input's rows with the prediction appended, a block of rows at a time. Bulk-read
    files are copied through a block of text at a time (blank lines dropped); others are
    re-written by ``csv``. Predictions are written ``%.6g``."""
    if not data.bulk:
        assert data.rows is not None
        buf = io.StringIO()
        w = csv.DictWriter(buf, fieldnames=[*data.header, col], lineterminator="\n")
        w.writeheader()
        for r, t in zip(data.rows, lat, strict=True):
            w.writerow({**r, col: _fmt(t)})
        yield buf.getvalue()
        return
    # universal newlines: LF, CRLF and CR-only line ends, as numpy's reader splits them
    with path.open(encoding="utf-8-sig", newline=None) as f:
        yield f.readline().rstrip("\n") + f",{col}\n"
        done = 0
        for lines in _line_blocks(f):
            if done + len(lines) > len(lat):
                raise _row_mismatch(path, len(lat))
            vals = lat[done : done + len(lines)].tolist()
            done += len(vals)
            yield "\n".join(map(",".join, zip(lines, map(_fmt, vals), strict=True))) + "\n"
        if done != len(lat):
            raise _row_mismatch(path, len(lat))


def _row_mismatch(path: Path, rows: int) -> SpecError:
    """The copied lines are not the rows read (a line layout the reader split otherwise)."""
    return SpecError(
        f"{path}: its data lines do not match the {rows} rows read; save it as plain CSV "
        "with one row per line"
    )


#: a prediction's text: ``%`` formatting (``"{:.6g}".format`` writes the same, 25 % slower)
_fmt = "%.6g".__mod__


def _line_blocks(f: TextIO, block_chars: int = _WRITE_BLOCK_CHARS) -> Iterator[list[str]]:
    """The non-blank lines of ``f`` without their line ends, a block (of about
    ``block_chars`` characters) at a time; the per-line work is C's (split, a scan for
    empty lines), not Python's, unless the text has blanks in it."""
    carry = ""
    while True:
        text = f.read(block_chars)
        if not text:
            break
        text = carry + text
        cut = text.rfind("\n")
        if cut < 0:
            carry = text
            continue
        carry, text = text[cut + 1 :], text[:cut]
        yield _clean_lines(text)
    if carry:
        yield _clean_lines(carry)


def _clean_lines(text: str) -> list[str]:
    lines = text.split("\n")
    if any(c in text for c in " \t\f\v"):  # maybe whitespace-only lines: look at each
        return [ln for ln in lines if ln.strip()]
    return [ln for ln in lines if ln] if "" in lines else lines


@dataclass(frozen=True)
class GemmPrediction:
    """One row of a shapes CSV (its strings) with the predicted latency in ``column``."""

    row: dict[str, str]
    column: str
    latency_ms: float

    def to_dict(self) -> dict[str, object]:
        return {**self.row, self.column: self.latency_ms}


def row_predictions(data: GemmShapes, column: str, lat_ms: np.ndarray) -> list[GemmPrediction]:
    """The rows of a row-by-row read (``keep_rows=True``) with their predictions."""
    if data.rows is None:
        raise ValueError("row_predictions needs the rows: read with keep_rows=True")
    return [GemmPrediction(r, column, float(t)) for r, t in zip(data.rows, lat_ms, strict=True)]
