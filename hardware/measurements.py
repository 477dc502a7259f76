"""Reading measured latencies (CSV) for fitting: columns, time units, feature matrices."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from perfmodel.datafile import parse_float, read_csv
from perfmodel.errors import SpecError
from perfmodel.units import S_PER_MS, S_PER_NS, S_PER_US

if TYPE_CHECKING:
    pass


Arr = NDArray[np.float64]


TIME_UNITS_S = {"s": 1.0, "ms": S_PER_MS, "us": S_PER_US, "ns": S_PER_NS}


@dataclass(frozen=True)
class Measurements:
    """Rows of a measurements CSV: string columns plus the parsed time in seconds."""

    path: str
    columns: dict[str, NDArray[np.str_]]
    time_s: Arr

    def __len__(self) -> int:
        return len(self.time_s)

    def numeric(self, col: str) -> Arr:
        """A numeric column; a clear error names the column and the bad value."""
        if col not in self.columns:
            raise SpecError(
                f"{self.path}: no column {col!r}; columns are {', '.join(self.columns)}"
            )
        raw = self.columns[col]
        try:
            x = raw.astype(np.float64)
        except ValueError:
            bad = next(v for v in raw if not _is_number(v))
            raise SpecError(
                f"{self.path}: column {col!r} has non-numeric value {str(bad)!r}"
            ) from None
        if not np.all(np.isfinite(x)):
            bad = raw[~np.isfinite(x)][0]
            raise SpecError(f"{self.path}: column {col!r} has non-finite value {str(bad)!r}")
        return x

    def subset(self, keep: NDArray[np.bool_]) -> Measurements:
        return Measurements(
            self.path, {k: v[keep] for k, v in self.columns.items()}, self.time_s[keep]
        )


def _is_number(v: str) -> bool:
    try:
        float(v)
    except ValueError:
        return False
    return True


def time_unit_of(col: str) -> str:
    """Unit from a column suffix: ``latency_ms`` -> ms, ``time_s`` -> s."""
    for u in TIME_UNITS_S:
        if col.endswith(f"_{u}"):
            return u
    raise SpecError(
        f"cannot tell the unit of time column {col!r}; name it *_s/_ms/_us/_ns or give "
        f"--time-unit ({', '.join(TIME_UNITS_S)})"
    )


#: Columns that name the dtype of a measured row: a profile is fitted to one of them.
DTYPE_COLUMNS = ("gemm_dtype", "dtype", "kv_cache_dtype", "moe_dtype")


def check_one_dtype(meas: Measurements) -> None:
    """Refuse a fit over rows of several dtypes (each has its own peak: mixing four dtypes
    of one file fitted at 20.6 % error instead of 6.3 % for one)."""
    for col in DTYPE_COLUMNS:
        if col in meas.columns:
            kinds = sorted({str(v) for v in meas.columns[col]})
            if len(kinds) > 1:
                raise SpecError(
                    f"{meas.path}: column {col} holds {len(kinds)} dtypes ({', '.join(kinds)}); a "
                    f"profile is for one dtype: add --where {col}={kinds[0]}"
                )


def read_measurements(
    path: str, *, time_col: str, time_unit: str | None = None, where: dict[str, str] | None = None
) -> Measurements:
    """Read a CSV of measurements; keep rows matching ``where`` (column = value).

    Times must be numeric and positive: a non-numeric or negative time is an error naming
    the row, never silently dropped.
    """
    tab = read_csv(path, what="measurements file")
    header = list(tab.header)
    body = [r for _, r in tab]
    cols = {h: np.array([r[i].strip() for r in body]) for i, h in enumerate(header)}
    if time_col not in cols:
        raise SpecError(f"{path}: no time column {time_col!r}; columns are {', '.join(header)}")
    keep = np.ones(len(body), dtype=bool)
    for c, v in (where or {}).items():
        if c not in cols:
            raise SpecError(f"{path}: --where column {c!r} not found; columns: {', '.join(header)}")
        keep &= cols[c] == v
    if not keep.any():
        raise SpecError(f"{path}: no rows match {where}")
    unit = time_unit or time_unit_of(time_col)
    if unit not in TIME_UNITS_S:
        raise SpecError(f"time unit {unit!r} is not one of {', '.join(TIME_UNITS_S)}")
    ti = header.index(time_col)
    t = np.array(
        [
            parse_float(r[ti], where=tab.where(n), name=time_col, positive=True)
            for (n, r), k in zip(tab, keep, strict=True)
            if k
        ]
    )
    return Measurements(path, {k: v[keep] for k, v in cols.items()}, t * TIME_UNITS_S[unit])


def feature_matrix(data: Measurements, exprs: list[str]) -> Arr:
    """Evaluate feature expressions over numeric columns.

    An expression is a column name, a number, ``+``, ``*``, ``/``, parentheses, and
    ``pad(col)`` (round up to 128-row tiles) or ``log2(col)``: e.g. ``pad(m)*n*k``,
    ``m*(n+k)``.
    """
    import ast

    def ev(node: ast.AST) -> Arr:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Name):
            return data.numeric(node.id)
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return np.full(len(data), float(node.value))
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Mult | ast.Div):
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Add):
                return a + b
            return a * b if isinstance(node.op, ast.Mult) else a / b
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("pad", "log2")
            and len(node.args) == 1
        ):
            v = ev(node.args[0])
            return np.ceil(v / 128.0) * 128.0 if node.func.id == "pad" else np.log2(v)
        raise SpecError(
            "feature expressions use columns, numbers, + * /, ( ), pad(col) and log2(col); "
            f"cannot use {ast.dump(node)[:40]}"
        )

    cols = []
    for e in exprs:
        try:
            tree = ast.parse(e.strip(), mode="eval")
        except SyntaxError:
            raise SpecError(f"feature expression {e!r} is not valid") from None
        cols.append(ev(tree))
    X = np.stack(cols, axis=-1)
    if not np.all(np.isfinite(X)) or np.any(X < 0):
        raise SpecError("features must be finite and non-negative (check the expressions)")
    return X
