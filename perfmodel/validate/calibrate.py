"""Fit an engine's few physical parameters to published measurements, with grouped CV.

Free parameters (each bounded, each with a physical meaning):

* ``iteration_overhead_s@<family>`` — host time per iteration on that device family;
* ``per_request_overhead_s`` — host time per sequence in the batch;
* ``collective_overhead_s`` — fixed cost per tensor-parallel collective call (rows with
  more than one device only);
* ``gqa_kv_sharing`` — K/V read sharing across a query-head group in decode attention;
* ``kv_dequant_efficiency`` — KV read rate factor of a software-dequantized cache (rows
  with such a cache only);
* ``moe_efficiency`` — the routed-expert grouped GEMM's efficiency relative to a dense
  GEMM (rows of mixture-of-experts models only);
* ``gemm_compute@<family>/<dtype>``, ``memory@<family>/<dtype>`` — kernel efficiencies,
  only for the (family, math dtype) pairs with at least ``MIN_PAIR_ROWS`` rows in the fit.

Fits use at most ``max_rows`` rows (an even stride through the rows, so every group
keeps its share) to bound the time of one fit.

The fit minimizes a robust (soft-L1) sum of log errors ``log(predicted/measured)`` with
``scipy.optimize.least_squares`` inside the bounds. Held-out error: the rows are split by
model (leave one model out) and by device (leave one device out); each fold refits from
the engine file's start values on the other groups and predicts the held-out group.
Nothing of a held-out group enters its fold's fit.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from hardware.engine import Engine, KernelEfficiency, device_family
from perfmodel.dtypes import get_dtype
from perfmodel.errors import SpecError
from perfmodel.units import S_PER_MS, S_PER_US
from perfmodel.validate.data import Measurement
from perfmodel.validate.predict import RowResult, _device, _model, plan_for, predict_row
from perfmodel.validate.summary import ErrorStats, acceptance_summary, error_stats

EFF_BOUNDS = (0.03, 0.95)  # no kernel streams or computes at 100 % of peak
MIN_PAIR_ROWS = 10  # rows of a (device family, math dtype) pair to fit its efficiencies
MOE_EFF_BOUNDS = (0.2, 1.0)  # a grouped GEMM relative to a dense one: at most as good
OVERHEAD_MS_BOUNDS = (0.0, 30.0)
PER_REQUEST_US_BOUNDS = (0.0, 300.0)
COLLECTIVE_US_BOUNDS = (0.0, 200.0)


@dataclass(frozen=True)
class Param:
    name: str
    lo: float
    hi: float


@dataclass(frozen=True)
class Calibration:
    """A fitted engine and its held-out errors."""

    engine: Engine
    params: dict[str, float]
    fit: ErrorStats  # in-sample
    leave_one_model_out: ErrorStats
    leave_one_device_out: ErrorStats
    folds: dict[str, dict[str, float]]  # held-out group -> its fold's fitted params
    rows: int
    lomo_groups: dict[str, ErrorStats] = field(default_factory=dict)  # acceptance groups
    lodo_groups: dict[str, ErrorStats] = field(default_factory=dict)  # the same, by device

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine.id,
            "params": self.params,
            "rows": self.rows,
            "fit": self.fit.to_dict(),
            "leave_one_model_out": self.leave_one_model_out.to_dict(),
            "leave_one_device_out": self.leave_one_device_out.to_dict(),
            "param_spread_over_folds": spread(self.folds),
            "leave_one_model_out_by_group": {k: v.to_dict() for k, v in self.lomo_groups.items()},
            "leave_one_device_out_by_group": {k: v.to_dict() for k, v in self.lodo_groups.items()},
        }


def spread(folds: dict[str, dict[str, float]]) -> dict[str, list[float]]:
    """Per parameter: [min, max] over the CV folds (its uncertainty)."""
    names = sorted({k for f in folds.values() for k in f})
    return {
        k: [
            min(f[k] for f in folds.values() if k in f),
            max(f[k] for f in folds.values() if k in f),
        ]
        for k in names
    }


def _kernel_class(m: Measurement) -> tuple[str, str]:
    """The (device family, kernel class) whose efficiencies a row informs."""
    act = plan_for(m, _device(m.device)).act_dtype
    return device_family(m.device), get_dtype(act).kernel_key


def free_params(engine: Engine, rows: Sequence[Measurement]) -> list[Param]:
    """The parameters the rows can inform (see the module docstring)."""
    fams = sorted({device_family(m.device) for m in rows})
    pairs = sorted({_kernel_class(m) for m in rows})
    out = [Param(f"iteration_overhead_s@{f}", *OVERHEAD_MS_BOUNDS) for f in fams]
    out.append(Param("per_request_overhead_s", *PER_REQUEST_US_BOUNDS))
    if any(m.tp * m.pp > 1 for m in rows):
        out.append(Param("collective_overhead_s", *COLLECTIVE_US_BOUNDS))
    out.append(Param("gqa_kv_sharing", 0.0, 1.0))
    if any(_soft_kv(m) for m in rows):
        out.append(Param("kv_dequant_efficiency", *EFF_BOUNDS))
    if any(_model(m.model).moe for m in rows):
        out.append(Param("moe_efficiency", *MOE_EFF_BOUNDS))
    count = Counter(_kernel_class(m) for m in rows)
    for f, d in pairs:
        # a (family, dtype) pair with a handful of rows keeps the file's values: two
        # efficiencies fitted to a few rows of one table follow that table's quirks
        if count[(f, d)] < MIN_PAIR_ROWS:
            continue
        # attention's compute efficiency stays the file's: prefill attention is a small
        # share of these rows' time and would be fitted to noise
        for k in ("gemm_compute", "memory"):
            out.append(Param(f"{k}@{f}/{d}", *EFF_BOUNDS))
    return out


def _soft_kv(m: Measurement) -> bool:
    """The row's KV format has no math on its device (dequantized in software)."""
    plan = plan_for(m, _device(m.device))
    return plan.kv_bytes < plan.act_bytes and not _device(m.device).computes(plan.kv_dtype)


def _scale(name: str) -> float:
    if name.startswith("iteration_overhead_s"):
        return S_PER_MS
    if name in ("per_request_overhead_s", "collective_overhead_s"):
        return S_PER_US
    return 1.0


def current(engine: Engine, p: Param) -> float:
    """The engine's value of ``p``, in the fit's units (ms, µs, fractions)."""
    name, _, where = p.name.partition("@")
    if name == "iteration_overhead_s":
        v = engine.iteration_overhead_by_family.get(where, engine.iteration_overhead_s)
    elif name in (
        "per_request_overhead_s",
        "collective_overhead_s",
        "gqa_kv_sharing",
        "kv_dequant_efficiency",
        "moe_efficiency",
    ):
        v = getattr(engine, name)
    else:
        fam, _, dt = where.partition("/")
        v = getattr(engine.efficiency.get((fam, dt), engine.default_efficiency), name)
    return float(np.clip(v / _scale(p.name), p.lo, p.hi))


def apply(engine: Engine, values: dict[str, float]) -> Engine:
    """A copy of ``engine`` with the named parameters (fit units) set."""
    by_family = dict(engine.iteration_overhead_by_family)
    effs = dict(engine.efficiency)
    scalars: dict[str, Any] = {}
    for key, v in values.items():
        name, _, where = key.partition("@")
        if name == "iteration_overhead_s":
            by_family[where] = v * S_PER_MS
        elif name in ("per_request_overhead_s", "collective_overhead_s"):
            scalars[name] = v * S_PER_US
        elif name in ("gqa_kv_sharing", "kv_dequant_efficiency", "moe_efficiency"):
            scalars[name] = v
        else:
            fam, _, dt = where.partition("/")
            e = effs.get((fam, dt), engine.default_efficiency)
            effs[(fam, dt)] = replace(e, **{name: v})
    return replace(engine, iteration_overhead_by_family=by_family, efficiency=effs, **scalars)


def _log_errors(engine: Engine, rows: Sequence[Measurement]) -> np.ndarray:
    out = []
    for m in rows:
        r = predict_row(m, engine=engine)
        out.append(math.log1p(r.error) if r.error is not None and r.error > -1 else 0.0)
    return np.asarray(out)


def subsample(rows: Sequence[Measurement], max_rows: int) -> list[Measurement]:
    """An even stride through ``rows`` keeping at most ``max_rows``."""
    if len(rows) <= max_rows:
        return list(rows)
    idx = np.linspace(0, len(rows) - 1, max_rows).round().astype(int)
    return [rows[i] for i in sorted(set(idx.tolist()))]


def fit_engine(
    start: Engine,
    rows: Sequence[Measurement],
    *,
    max_evals: int = 40,
    max_rows: int = 150,
) -> dict[str, float]:
    """Least-squares fit of :func:`free_params` (robust log error) from ``start``."""
    from scipy.optimize import least_squares

    if not rows:
        raise SpecError(f"no representable rows to calibrate {start.id} on")
    rows = subsample(rows, max_rows)
    params = free_params(start, rows)
    x0 = np.array([current(start, p) for p in params])
    lo = np.array([p.lo for p in params])
    hi = np.array([p.hi for p in params])
    names = [p.name for p in params]

    def resid(x: np.ndarray) -> np.ndarray:
        return _log_errors(apply(start, dict(zip(names, x, strict=True))), rows)

    sol = least_squares(
        resid,
        x0,
        bounds=(lo, hi),
        loss="soft_l1",
        f_scale=0.2,
        max_nfev=max_evals,
        diff_step=1e-2,
    )
    return {n: float(v) for n, v in zip(names, sol.x, strict=True)}


def _held_out(
    start: Engine,
    rows: Sequence[Measurement],
    key: Callable[[Measurement], str],
    max_evals: int,
    max_rows: int,
) -> tuple[list[RowResult], dict[str, dict[str, float]]]:
    groups = sorted({key(m) for m in rows})
    results: list[RowResult] = []
    folds: dict[str, dict[str, float]] = {}
    if len(groups) < 2:
        return results, folds
    for g in groups:
        train = [m for m in rows if key(m) != g]
        test = [m for m in rows if key(m) == g]
        vals = fit_engine(start, train, max_evals=max_evals, max_rows=max_rows)
        folds[g] = vals
        eng = apply(start, vals)
        results += [predict_row(m, engine=eng) for m in test]
    return results, folds


def held_out(
    start: Engine, rows: Sequence[Measurement], *, by: str, max_evals: int, max_rows: int
) -> list[RowResult]:
    """Every row predicted by a fit from ``start`` without its ``by`` group (``"model"`` or
    ``"device"``): the rows behind :func:`calibrate`'s held-out errors, to pool over files."""
    rows = representable(start, rows)
    return _held_out(start, rows, lambda m: str(getattr(m, by)), max_evals, max_rows)[0]


def representable(start: Engine, rows: Sequence[Measurement]) -> list[Measurement]:
    return [m for m in rows if predict_row(m, engine=start).status == "ok"]


def calibrate(
    start: Engine,
    rows: Sequence[Measurement],
    *,
    max_evals: int = 40,
    max_rows: int = 150,
    cv: bool = True,
) -> Calibration:
    """Fit ``start``'s free parameters on ``rows`` and measure the held-out error."""
    rows = representable(start, rows)
    vals = fit_engine(start, rows, max_evals=max_evals, max_rows=max_rows)
    fitted = apply(start, vals)
    fit = error_stats([predict_row(m, engine=fitted) for m in rows], ("fit",))
    empty = error_stats([], ())
    lomo_res, folds_m = (
        _held_out(start, rows, lambda m: m.model, max_evals, max_rows) if cv else ([], {})
    )
    lodo_res, folds_d = (
        _held_out(start, rows, lambda m: m.device, max_evals, max_rows) if cv else ([], {})
    )
    lomo = error_stats(lomo_res, ("leave-one-model-out",)) if lomo_res else empty
    lodo = error_stats(lodo_res, ("leave-one-device-out",)) if lodo_res else empty
    return Calibration(
        engine=fitted,
        params=vals,
        fit=fit,
        leave_one_model_out=lomo,
        leave_one_device_out=lodo,
        folds={
            **{f"model:{k}": v for k, v in folds_m.items()},
            **{f"device:{k}": v for k, v in folds_d.items()},
        },
        rows=len(rows),
        lomo_groups=acceptance_summary(lomo_res),
        lodo_groups=acceptance_summary(lodo_res),
    )


def _finite_only(d: Any) -> Any:
    """The table without non-finite numbers (TOML has no null; an empty group's error is
    NaN): such entries are left out, and readers refuse NaN."""
    if isinstance(d, dict):
        return {k: _finite_only(v) for k, v in d.items() if not _nonfinite(v)}
    if isinstance(d, list):
        return [_finite_only(v) for v in d if not _nonfinite(v)]
    return d


def _nonfinite(v: Any) -> bool:
    return isinstance(v, float) and not math.isfinite(v)


def engine_toml_table(cal: Calibration, *, data: str, default: bool = False) -> dict[str, Any]:
    """The calibrated engine as a TOML table (``hardware/engines`` layout) with provenance."""
    e = cal.engine
    eff = {f"{f}/{d}": k.to_dict() for (f, d), k in sorted(e.efficiency.items())}
    return {
        "id": e.id,
        "name": e.name,
        "family": e.family,
        "versions": list(e.versions),
        "default": default,
        "sources": list(e.sources),
        "notes": e.notes,
        "calibrated": sorted(
            {k.partition("@")[2] for k in cal.params if "/" in k.partition("@")[2]}
        ),
        "provenance": _finite_only({"data": data, **cal.to_dict()}),
        "host": {
            "iteration_overhead_s": e.iteration_overhead_s,
            "per_request_overhead_s": e.per_request_overhead_s,
            "collective_overhead_s": e.collective_overhead_s,
            "by_family": dict(sorted(e.iteration_overhead_by_family.items())),
        },
        "batching": {
            "max_num_seqs": e.max_num_seqs,
            "max_num_batched_tokens": e.max_num_batched_tokens,
            "chunked_prefill": e.chunked_prefill,
            "preemption": e.preemption,
            "offline_caps": e.offline_caps,
        },
        "kv_cache": {
            "memory_fraction": e.kv_memory_fraction,
            "basis": e.kv_memory_basis,
            "block_tokens": e.kv_block_tokens,
            "reservation": e.kv_reservation,
        },
        "attention": {
            "gqa_kv_sharing": e.gqa_kv_sharing,
            "kv_dequant_efficiency": e.kv_dequant_efficiency,
        },
        "moe": {"efficiency": e.moe_efficiency},
        "default_efficiency": e.default_efficiency.to_dict(),
        "efficiency": eff,
    }


__all__ = [
    "Calibration",
    "KernelEfficiency",
    "apply",
    "calibrate",
    "engine_toml_table",
    "fit_engine",
    "free_params",
    "held_out",
]


def rows_for(start: Engine, rows: Sequence[Measurement]) -> list[Measurement]:
    """The rows whose engine resolves to ``start``'s engine file (by id)."""
    from perfmodel.validate.predict import _engine

    out = []
    for m in rows:
        try:
            if _engine(m.engine).id == start.id:
                out.append(m)
        except SpecError:
            continue
    return out
