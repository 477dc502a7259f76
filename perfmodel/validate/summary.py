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


def _table(r: RowResult) -> str:
    src = r.measurement.raw.get("source", "")
    for key in ("perf_overview", "static_batch", "argonne"):
        if key in src:
            return key
    return "other"


def _is_moe(r: RowResult) -> bool:
    from perfmodel.errors import PerfModelError
    from perfmodel.validate.predict import _model

    try:
        return _model(r.measurement.model).moe is not None
    except PerfModelError:  # an unknown model is not MoE as far as grouping goes
        return False


def _mha_7b(r: RowResult) -> bool:
    return r.measurement.model in ("llama-2-7b", "gpt-j-6b")


def _online(r: RowResult) -> bool:
    return r.measurement.request_rate_per_s is not None


def _dev(r: RowResult, *ids: str) -> bool:
    return r.measurement.device in ids


# The groups of the acceptance table (errors reported per group, also held out).
ACCEPTANCE_GROUPS: dict[str, Callable[[RowResult], bool]] = {
    "perf_overview offline A100+H100": lambda r: _table(r) == "perf_overview" and not _online(r),
    "perf_overview offline A100": lambda r: (
        _table(r) == "perf_overview" and not _online(r) and _dev(r, "a100-sxm-80gb")
    ),
    "perf_overview offline H100": lambda r: (
        _table(r) == "perf_overview" and not _online(r) and _dev(r, "h100-sxm")
    ),
    "perf_overview offline MoE": lambda r: (
        _table(r) == "perf_overview" and not _online(r) and _is_moe(r)
    ),
    "perf_overview online TTFT": lambda r: _online(r) and r.measurement.metric == "ttft_ms",
    "perf_overview online ITL": lambda r: _online(r) and r.measurement.metric == "tpot_ms",
    "static_batch throughput": lambda r: (
        _table(r) == "static_batch" and r.measurement.metric != "ttft_ms"
    ),
    "static_batch batch-1 TTFT": lambda r: (
        _table(r) == "static_batch" and r.measurement.metric == "ttft_ms"
    ),
    "argonne A100": lambda r: _table(r) == "argonne" and _dev(r, "a100-sxm-80gb"),
    "argonne H100": lambda r: _table(r) == "argonne" and _dev(r, "h100-sxm"),
    "argonne MI250": lambda r: _table(r) == "argonne" and _dev(r, "mi250"),
    "MHA 7B rows": _mha_7b,
    "MHA 7B static batch": lambda r: _mha_7b(r) and _table(r) == "static_batch",
}


def acceptance_summary(results: Sequence[RowResult]) -> dict[str, ErrorStats]:
    """:class:`ErrorStats` of every non-empty :data:`ACCEPTANCE_GROUPS` group."""
    out = {}
    for name, pred in ACCEPTANCE_GROUPS.items():
        sel = [r for r in results if pred(r)]
        if sel:
            out[name] = error_stats(sel, (name,))
    return out


@dataclass(frozen=True)
class ValidationReport:
    """``perfmodel validate``'s answer: every row's prediction and the error summaries."""

    engine: str  # the engine asked for, or "per row" (each row's engine column)
    rows: tuple[RowResult, ...]
    by: tuple[str, ...]
    total: ErrorStats
    groups: tuple[ErrorStats, ...]

    def to_dict(self) -> dict[str, object]:
        return {
            "engine": self.engine,
            "rows": [r.to_dict() for r in self.rows],
            "summary": {
                "all": self.total.to_dict(),
                "by": list(self.by),
                "groups": [g.to_dict() for g in self.groups],
            },
        }


def validation_report(
    results: Sequence[RowResult], *, by: Sequence[str] = GROUP_KEYS, engine: str | None = None
) -> ValidationReport:
    """The summaries of ``results``: all rows, and one group per value of the ``by`` keys."""
    return ValidationReport(
        engine=engine or "per row",
        rows=tuple(results),
        by=tuple(by),
        total=error_stats(results, ("all",)),
        groups=tuple(summarize(results, by=by)),
    )
