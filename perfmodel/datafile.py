"""The input layer: every file the tool reads (TOML, JSON, CSV) goes through here. Base.

Imports nothing of the project but ``perfmodel.errors`` and ``perfmodel.units``, so
``hardware/`` may use it. Every failure is one ``SpecError`` line naming the file (and
the line or field) and what to change:

- not a regular file, missing, unreadable, larger than ``max_bytes``;
- not UTF-8 (UTF-16 is named as such); a UTF-8 byte-order mark and CRLF line ends are
  accepted;
- malformed TOML/JSON, nesting deeper than ``MAX_NESTING``, ``NaN``/``Infinity`` or a
  number too large for a float, integers with more than ``MAX_INT_DIGITS`` digits;
- CSV: ragged rows, duplicate or empty column names, a missing required column;
- values: :func:`parse_int` / :func:`parse_float` give the same wording everywhere.
"""

from __future__ import annotations

import csv
import io
import json
import math
import stat
import sys
import tomllib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

from perfmodel.errors import SpecError
from perfmodel.units import MiB

T = TypeVar("T")

#: Default size limit of an input file (traces and measurement files included).
MAX_FILE_BYTES = 512 * MiB
#: Deepest nesting of tables/arrays accepted in TOML or JSON.
MAX_NESTING = 64
#: Integers with more digits than this are refused (no input needs more than a few dozen).
MAX_INT_DIGITS = 30
#: Largest integer a count field may hold (2**53: the largest exactly representable in floats).
MAX_INT = 2**53

_UTF8_BOM = b"\xef\xbb\xbf"
_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")


def check_file(path: str | Path, *, what: str, max_bytes: int = MAX_FILE_BYTES) -> None:
    """A regular file no larger than ``max_bytes`` (for readers with their own fast path)."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError as e:
        raise SpecError(f"cannot read {what} {p}: {e.strerror or e}") from None
    if stat.S_ISDIR(st.st_mode):
        raise SpecError(f"cannot read {what} {p}: it is a directory; pass a file")
    if not stat.S_ISREG(st.st_mode):
        raise SpecError(f"cannot read {what} {p}: not a regular file; pass a file on disk")
    if st.st_size > max_bytes:
        raise SpecError(
            f"{p}: {what} is {st.st_size / MiB:.0f} MiB, over the {max_bytes / MiB:.0f} MiB "
            "limit; pass a smaller file"
        )


def read_text(path: str | Path, *, what: str, max_bytes: int = MAX_FILE_BYTES) -> str:
    """The text of a UTF-8 file (BOM stripped, line ends kept) or a SpecError line."""
    p = Path(path)
    check_file(p, what=what, max_bytes=max_bytes)
    try:
        with p.open("rb") as f:
            raw = f.read(max_bytes + 1)
    except OSError as e:
        raise SpecError(f"cannot read {what} {p}: {e.strerror or e}") from None
    if len(raw) > max_bytes:
        raise SpecError(f"{p}: {what} is over the {max_bytes / MiB:.0f} MiB limit")
    return decode_utf8(raw, where=str(p), what=what)


def decode_utf8(raw: bytes, *, where: str, what: str) -> str:
    """UTF-8 bytes -> text; a BOM is dropped; UTF-16 and binary data are named."""
    if raw.startswith(_UTF8_BOM):
        raw = raw[len(_UTF8_BOM) :]
    elif raw.startswith(_UTF16_BOMS) or (
        len(raw) > 1 and raw[1:2] == b"\x00" and raw[:1] != b"\x00"
    ):
        raise SpecError(f"{where}: {what} is UTF-16 encoded; save it as UTF-8")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise SpecError(
            f"{where}:{line}: {what} is not UTF-8 text (byte 0x{raw[e.start]:02x}); "
            "save it as UTF-8"
        ) from None
    if "\x00" in text:
        line = text[: text.index("\x00")].count("\n") + 1
        raise SpecError(f"{where}:{line}: {what} contains a NUL byte; it looks binary, not text")
    return text


# ---- TOML / JSON -----------------------------------------------------------------------


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number; write a finite value")


def _json_float(s: str) -> float:
    x = float(s)
    if not math.isfinite(x):
        raise ValueError(f"{s} is too large for a number")
    return x


def _json_int(s: str) -> int:
    if len(s.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"integer with {len(s)} digits is too large")
    return int(s)


def _nesting_depth(text: str) -> int:
    """Bracket depth of a JSON/inline-TOML text, ignoring strings (cheap, iterative)."""
    depth = best = 0
    in_str: str | None = None
    esc = False
    for ch in text:
        if in_str:
            if esc:
                esc = False
            elif ch == "\\" and in_str == '"':
                esc = True
            elif ch == in_str:
                in_str = None
        elif ch in "\"'":
            in_str = ch
        elif ch in "[{":
            depth += 1
            best = max(best, depth)
        elif ch in "]}":
            depth -= 1
    return best


def parse_data_text(text: str, *, where: str, is_json: bool) -> dict[str, Any]:
    """Parse TOML or JSON text into its top-level table; every failure one SpecError line."""
    kind = "JSON" if is_json else "TOML"
    brackets = text.count("[") + text.count("{")
    if brackets > MAX_NESTING and _nesting_depth(text) > MAX_NESTING:
        raise SpecError(f"{where}: {kind} nested deeper than {MAX_NESTING} levels; flatten it")
    try:
        if is_json:
            data = json.loads(
                text,
                parse_constant=_reject_constant,
                parse_float=_json_float,
                parse_int=_json_int,
            )
        else:
            data = tomllib.loads(text)
    except json.JSONDecodeError as e:
        raise SpecError(
            f"{where}: malformed JSON at line {e.lineno} column {e.colno}: {e.msg}"
        ) from None
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"{where}: malformed TOML: {e}") from None
    except RecursionError:
        raise SpecError(f"{where}: {kind} nested too deeply; flatten it") from None
    except ValueError as e:  # the hooks above, and Python's integer digit limit
        raise SpecError(f"{where}: malformed {kind}: {e}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{where}: expected a {'JSON object' if is_json else 'table'} at the top")
    _check_values(data, where=where)
    return data


def _check_values(data: dict[str, Any], *, where: str) -> None:
    """Non-finite floats and oversized integers anywhere in the tree (TOML allows inf/nan)."""
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        key, v = stack.pop()
        if isinstance(v, dict):
            stack.extend((f"{key}.{k}" if key else str(k), x) for k, x in v.items())
        elif isinstance(v, list):
            stack.extend((f"{key}[{i}]", x) for i, x in enumerate(v))
        elif isinstance(v, float) and not math.isfinite(v):
            raise SpecError(f"{where}: field {key} = {v} is not a finite number; write a value")
        elif isinstance(v, int) and not isinstance(v, bool) and abs(v) > 10**MAX_INT_DIGITS:
            raise SpecError(f"{where}: field {key} is too large a number")


def read_data_file(path: str | Path, *, what: str, max_bytes: int = 64 * MiB) -> dict[str, Any]:
    """The top-level table of a ``.toml`` or ``.json`` file (by suffix; TOML otherwise)."""
    p = Path(path)
    text = read_text(p, what=what, max_bytes=max_bytes)
    return parse_data_text(text, where=str(p), is_json=p.suffix.lower() == ".json")


def read_toml_header(path: str | Path, *, what: str) -> dict[str, Any]:
    """The keys a TOML file sets before its first table header (``[name]`` line): its
    root table's own scalars and arrays, without parsing the tables below (a catalog
    lookup that needs only an identity field of each file). Falls back to the whole file
    when that prefix does not parse alone (a multi-line array with a line opening ``[``);
    either way every value is one the whole file has."""
    p = Path(path)
    text = read_text(p, what=what)
    lines = text.splitlines(keepends=True)
    cut = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith("[")), len(lines))
    try:
        return parse_data_text("".join(lines[:cut]), where=str(p), is_json=False)
    except SpecError:
        return parse_data_text(text, where=str(p), is_json=False)


# ---- CSV -------------------------------------------------------------------------------


@dataclass(frozen=True)
class CsvTable:
    """A CSV file read in full: stripped header names and (line number, fields) rows."""

    path: str
    header: tuple[str, ...]
    rows: tuple[tuple[int, tuple[str, ...]], ...]

    def index(self, name: str) -> int:
        """Column index of ``name``; SpecError listing the columns when absent."""
        if name not in self.header:
            raise SpecError(
                f"{self.path}: no column {name!r}; columns are {', '.join(self.header)}"
            )
        return self.header.index(name)

    def __iter__(self) -> Iterator[tuple[int, tuple[str, ...]]]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def where(self, line: int) -> str:
        return f"{self.path}:{line}"

    def to_dicts(self) -> list[dict[str, str]]:
        return [dict(zip(self.header, r, strict=True)) for _, r in self.rows]


def read_csv(
    path: str | Path,
    *,
    what: str,
    required: Sequence[str] = (),
    lower: bool = False,
    min_rows: int = 1,
    max_bytes: int = MAX_FILE_BYTES,
) -> CsvTable:
    """Read a CSV file with a header row; blank lines skipped; CRLF and BOM accepted."""
    p = Path(path)
    text = read_text(p, what=what, max_bytes=max_bytes)
    return parse_csv_text(
        text, where=str(p), what=what, required=required, lower=lower, min_rows=min_rows
    )


def parse_csv_text(
    text: str,
    *,
    where: str,
    what: str,
    required: Sequence[str] = (),
    lower: bool = False,
    min_rows: int = 1,
) -> CsvTable:
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    header: list[str] | None = None
    rows: list[tuple[int, tuple[str, ...]]] = []
    try:
        for row in reader:
            if not row or all(not c.strip() for c in row):
                continue
            if header is None:
                header = [h.strip().lstrip("\ufeff") for h in row]
                if lower:
                    header = [h.lower() for h in header]
                _check_header(header, where=f"{where}:{reader.line_num}", what=what)
                continue
            if len(row) != len(header):
                raise SpecError(
                    f"{where}:{reader.line_num}: expected {len(header)} fields like the header "
                    f"({','.join(header)}), got {len(row)}"
                )
            rows.append((reader.line_num, tuple(c.strip() for c in row)))
    except csv.Error as e:
        raise SpecError(f"{where}:{reader.line_num}: malformed CSV: {e}") from None
    if header is None:
        raise SpecError(f"{where}: empty {what}; expected a header row and data rows")
    missing = [c for c in required if c not in header]
    if missing:
        raise SpecError(
            f"{where}: {what} has no column(s) {', '.join(missing)}; "
            f"columns are {', '.join(header)}"
        )
    if len(rows) < min_rows:
        raise SpecError(f"{where}: {what} has a header but no data rows")
    return CsvTable(path=where, header=tuple(header), rows=tuple(rows))


def _check_header(header: list[str], *, where: str, what: str) -> None:
    if any(not h for h in header):
        raise SpecError(f"{where}: {what} header has an empty column name; name every column")
    seen: set[str] = set()
    for h in header:
        if h in seen:
            raise SpecError(f"{where}: {what} header repeats column {h!r}; name it once")
        seen.add(h)


# ---- built-in catalogs -------------------------------------------------------------------


def catalog_ids(package: str) -> list[str]:
    """Ids of the ``<id>.toml`` files a catalog package ships (``hardware.catalog``), sorted."""
    files = resources.files(package).iterdir()
    return sorted(f.name.removesuffix(".toml") for f in files if f.name.endswith(".toml"))


def load_catalog_entry(
    package: str, id: str, load: Callable[[Path], T], *, kind: str, other: str
) -> T:
    """``load`` of the catalog's ``<id>.toml``; an unknown id names the valid ones and the
    ``other`` way to give one (``unknown hardware id 'x'; valid ids: ... (or a .toml path)``)."""
    ids = catalog_ids(package)
    if id not in ids:
        raise SpecError(f"unknown {kind} id {id!r}; valid ids: {', '.join(ids)} (or {other})")
    with resources.as_file(resources.files(package).joinpath(f"{id}.toml")) as p:
        return load(p)


# ---- values ----------------------------------------------------------------------------


def parse_float(
    v: str,
    *,
    where: str,
    name: str,
    positive: bool = False,
    nonnegative: bool = False,
) -> float:
    """A finite float from text; ``where`` is ``file:line``, ``name`` the column."""
    s = v.strip()
    try:
        x = float(s)
    except ValueError:
        raise SpecError(f"{where}: {name} = {s!r} is not a number") from None
    if not math.isfinite(x):
        raise SpecError(f"{where}: {name} = {s!r} is not finite; write a number")
    if positive and not x > 0:
        raise SpecError(f"{where}: {name} = {s!r} must be > 0")
    if nonnegative and x < 0:
        raise SpecError(f"{where}: {name} = {s!r} must be >= 0")
    return x


def parse_int(
    v: str, *, where: str, name: str, min_value: int = 0, max_value: int = MAX_INT
) -> int:
    """An integer from text (``1024`` or ``1024.0``) within [min_value, max_value]."""
    s = v.strip()
    if len(s) > MAX_INT_DIGITS + 4:
        raise SpecError(f"{where}: {name} = {s[:20]}... is too large")
    try:
        x = int(s)
    except ValueError:
        try:
            f = float(s)
        except ValueError:
            raise SpecError(f"{where}: {name} = {s!r} is not an integer") from None
        if not (math.isfinite(f) and f.is_integer()):
            raise SpecError(f"{where}: {name} = {s!r} is not an integer") from None
        x = int(f)
    if x < min_value:
        raise SpecError(f"{where}: {name} = {s} must be >= {min_value}")
    if x > max_value:
        raise SpecError(f"{where}: {name} = {s} is too large (at most {max_value:.3g})")
    return x
