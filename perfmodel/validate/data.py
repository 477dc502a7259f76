"""The long measurement format read by ``perfmodel validate`` and ``perfmodel calibrate``.

One measurement per CSV row::

    device,model,engine,precision,kv_precision,tp,pp,isl,osl,batch_size,metric,value
    [,request_rate_per_s][,concurrency][,source]

* ``device``, ``model``: catalog ids or file paths (relative to the CSV's folder);
* ``engine``: an engine id, optionally with a version (``vllm@0.5``), or a TOML path;
* ``precision`` (weights), ``kv_precision``: dtype names;
* ``batch_size``: empty for offline saturation runs (all requests queued) and online runs;
* ``metric``: one of :data:`METRICS`;
* ``request_rate_per_s`` (open loop, Poisson) or ``concurrency`` (closed loop): online runs.

Other columns are kept (echoed in the output) but not interpreted.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from perfmodel.dtypes import get_dtype
from perfmodel.errors import SpecError

REQUIRED = (
    "device",
    "model",
    "engine",
    "precision",
    "kv_precision",
    "tp",
    "pp",
    "isl",
    "osl",
    "batch_size",
    "metric",
    "value",
)
METRICS = (
    "output_tps_total",
    "output_tps_per_gpu",
    "total_tps_total",
    "ttft_ms",
    "tpot_ms",
    "e2e_s",
    "ttft_p50_ms",
    "ttft_p90_ms",
    "ttft_p99_ms",
    "tpot_p50_ms",
    "tpot_p90_ms",
    "tpot_p99_ms",
    "max_rate_per_s",
)


@dataclass(frozen=True)
class Measurement:
    """One published measurement (``raw`` keeps every input column as read)."""

    device: str
    model: str
    engine: str
    precision: str
    kv_precision: str
    tp: int
    pp: int
    isl: int
    osl: int
    batch_size: int | None
    metric: str
    value: float
    request_rate_per_s: float | None
    concurrency: int | None
    raw: dict[str, str]

    @property
    def engine_family(self) -> str:
        return self.engine.partition("@")[0]

    @property
    def offline(self) -> bool:
        return self.batch_size is None and self.request_rate_per_s is None and not self.concurrency


def _int(v: str, col: str, where: str, *, empty_ok: bool = False) -> int | None:
    v = v.strip()
    if not v and empty_ok:
        return None
    try:
        n = int(float(v))
    except ValueError:
        raise SpecError(f"{where}: {col} must be an integer, got {v!r}") from None
    if n < 1 or n != float(v):
        raise SpecError(f"{where}: {col} must be a positive integer, got {v!r}")
    return n


def _resolve(value: str, base: Path) -> str:
    """A relative file path is relative to the CSV's folder; an id stays an id."""
    v = value.strip()
    if v.endswith((".toml", ".json")) and not Path(v).is_absolute():
        return str(base / v)
    return v


def read_measurements(path: str | Path) -> list[Measurement]:
    """Every row of a long-format CSV, validated (one clear error naming row and column)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise SpecError(f"cannot read measurements {p}: {e.strerror}") from None
    reader = csv.DictReader(text.splitlines())
    missing = [c for c in REQUIRED if c not in (reader.fieldnames or [])]
    if missing:
        raise SpecError(f"{p}: missing column(s) {', '.join(missing)}")
    out = []
    for i, r in enumerate(reader, start=2):
        where = f"{p}:{i}"
        metric = r["metric"].strip()
        if metric not in METRICS:
            raise SpecError(f"{where}: metric {metric!r} is not one of {', '.join(METRICS)}")
        for col in ("precision", "kv_precision"):
            get_dtype(r[col])
        try:
            value = float(r["value"])
        except ValueError:
            raise SpecError(f"{where}: value must be a number, got {r['value']!r}") from None
        if not value > 0:
            raise SpecError(f"{where}: value must be > 0, got {value}")
        rate_s = (r.get("request_rate_per_s") or "").strip()
        try:
            rate = float(rate_s) if rate_s else None
        except ValueError:
            raise SpecError(f"{where}: request_rate_per_s must be a number") from None
        conc = _int(r.get("concurrency") or "", "concurrency", where, empty_ok=True)
        out.append(
            Measurement(
                device=_resolve(r["device"], p.parent),
                model=_resolve(r["model"], p.parent),
                engine=_resolve(r["engine"], p.parent) or "vllm",
                precision=get_dtype(r["precision"]).name,
                kv_precision=get_dtype(r["kv_precision"]).name,
                tp=_int(r["tp"], "tp", where) or 1,
                pp=_int(r["pp"] or "1", "pp", where) or 1,
                isl=_int(r["isl"], "isl", where) or 1,
                osl=_int(r["osl"], "osl", where) or 1,
                batch_size=_int(r["batch_size"], "batch_size", where, empty_ok=True),
                metric=metric,
                value=value,
                request_rate_per_s=rate,
                concurrency=conc,
                raw={k: v for k, v in r.items() if k is not None},
            )
        )
    return out
