"""Error summaries of validation results: n, median |error|, p90 |error|, signed median."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from perfmodel.validate.predict import RowResult

GROUP_KEYS = ("device", "engine", "model", "metric")


@dataclass(frozen=True)
class ErrorStats:
    """Errors of one group of rows, as fractions (0.12 = 12 %)."""

    group: tuple[str, ...]
    n: int
    median_abs: float
    p90_abs: float
    signed_median: float
    unrepresentable: int = 0

    def to_dict(self) -> dict[str, object]:
        return {
            "group": list(self.group),
            "rows": self.n,
            "median_abs_error_pct": 100 * self.median_abs,
            "p90_abs_error_pct": 100 * self.p90_abs,
            "signed_median_error_pct": 100 * self.signed_median,
            "unrepresentable": self.unrepresentable,
        }


def key_of(r: RowResult, name: str) -> str:
    m = r.measurement
    if name == "engine":
        return m.engine_family
    if name == "engine_version":
        return m.engine
    return str(getattr(m, name, m.raw.get(name, "")))


def error_stats(results: Iterable[RowResult], group: tuple[str, ...] = ()) -> ErrorStats:
    res = list(results)
    errs = np.array([r.error for r in res if r.error is not None], dtype=np.float64)
    unrep = sum(r.status != "ok" for r in res)
    if errs.size == 0:
        nan = float("nan")
        return ErrorStats(group, 0, nan, nan, nan, unrep)
    a = np.abs(errs)
    return ErrorStats(
        group,
        int(errs.size),
        float(np.median(a)),
        float(np.quantile(a, 0.9)),
        float(np.median(errs)),
        unrep,
    )


def summarize(
    results: Sequence[RowResult],
    *,
    by: Sequence[str] = GROUP_KEYS,
    where: Callable[[RowResult], bool] | None = None,
) -> list[ErrorStats]:
    """One :class:`ErrorStats` per distinct value of the ``by`` keys (sorted)."""
    groups: dict[tuple[str, ...], list[RowResult]] = {}
    for r in results:
        if where is None or where(r):
            groups.setdefault(tuple(key_of(r, k) for k in by), []).append(r)
    return [error_stats(v, k) for k, v in sorted(groups.items())]
