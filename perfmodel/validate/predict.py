"""One prediction per measurement row (``perfmodel validate``).

How each kind of row is predicted:

* offline (no batch size, no rate): :func:`perfmodel.serving.offline.offline_throughput` with the
  row's engine; the engine-less baseline (``engine=None``) is today's answer without an
  engine, the stable rate ``μ`` of ``perfmodel.serving.service.service_rate`` times the output
  length;
* static batch (a batch size): :func:`perfmodel.estimate.estimate` — throughput
  ``batch·osl/e2e`` (total: ``batch·(isl+osl)/e2e``), TTFT = the prefill iteration,
  TPOT = the mean decode iteration;
* online, open loop (``request_rate_per_s``): ``perfmodel.serving.service.latency`` at that rate
  (mean and percentile TTFT/TPOT) on the instance with the row's engine;
* closed loop (``concurrency``) and metrics a row's kind cannot give: unrepresentable,
  with the reason.

Dtypes: ``precision`` is the weight format; the math runs in it when the device has that
peak (FP8 on Hopper), else in FP16 (weight-only quantization: FP8 or INT8 weights on an
A100 are dequantized to FP16).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from hardware.device import Device, load_device
from hardware.engine import Engine, load_engine
from perfmodel.dtypes import ModuleDTypes
from perfmodel.errors import PerfModelError, SpecError
from perfmodel.model import ModelSpec, load_model
from perfmodel.plan import ParallelPlan
from perfmodel.step.instance import Instance
from perfmodel.units import MS_PER_S
from perfmodel.validate.data import Measurement

BASELINE = "none"  # engine name that selects the engine-less model


@dataclass(frozen=True)
class RowResult:
    """A measurement, its prediction and the signed error ``predicted/measured − 1``."""

    measurement: Measurement
    predicted: float | None
    status: str  # "ok" | "unrepresentable"
    reason: str = ""
    engine: str = ""  # engine id used ("" = engine-less)
    detail: dict[str, Any] | None = None

    @property
    def error(self) -> float | None:
        if self.predicted is None:
            return None
        return self.predicted / self.measurement.value - 1.0

    def to_dict(self) -> dict[str, Any]:
        err = self.error
        return {
            **self.measurement.raw,
            "predicted": self.predicted,
            "error_pct": None if err is None else 100.0 * err,
            "status": self.status,
            "reason": self.reason,
            "engine_used": self.engine,
            **({"detail": self.detail} if self.detail else {}),
        }


@functools.lru_cache(maxsize=64)
def _model(name: str) -> ModelSpec:
    return load_model(name)


@functools.lru_cache(maxsize=64)
def _device(name: str) -> Device:
    return load_device(name)


@functools.lru_cache(maxsize=64)
def _engine(name: str) -> Engine:
    return load_engine(name)


QUANTIZED = ("fp8", "int8", "int4", "fp4")


def plan_for(m: Measurement, device: Device) -> ParallelPlan:
    """The parallel plan of a row: math in the weight format when the device has it.

    A quantized ``precision`` is the format of the linear layers of the decoder; the
    embedding and the LM head stay 16-bit, as post-training quantizers leave them
    (ModelOpt, which made the TensorRT-LLM FP8 checkpoints, excludes ``*lm_head*`` by
    default, and an embedding is a lookup, not a GEMM; vLLM's FP8 path does the same).
    """
    act = m.precision
    if m.precision in QUANTIZED and not (m.precision == "fp8" and device.computes("fp8")):
        act = "fp16"
    modules = None
    if m.precision in QUANTIZED:
        q = m.precision
        modules = ModuleDTypes(q, q, q, q, embedding="fp16")
    return ParallelPlan(m.tp, m.precision, act, m.kv_precision, pp=m.pp, modules=modules)


def _unrep(m: Measurement, reason: str, engine: str = "") -> RowResult:
    return RowResult(m, None, "unrepresentable", reason, engine)


def _per_metric(m: Measurement, out_tps: float, total_tps: float, plan: ParallelPlan) -> float:
    if m.metric == "output_tps_total":
        return out_tps
    if m.metric == "output_tps_per_gpu":
        return out_tps / plan.devices
    return total_tps


_THROUGHPUT = ("output_tps_total", "output_tps_per_gpu", "total_tps_total")


def _offline(
    m: Measurement, model: ModelSpec, device: Device, plan: ParallelPlan, engine: Engine | None
) -> tuple[float, dict[str, Any]]:
    if engine is None:
        from perfmodel.serving import service as queueing
        from perfmodel.workload.lengths import fixed_lengths
        from perfmodel.workload.presets import Workload

        sr = queueing.service_rate(
            Instance(model, device, plan), Workload("offline", fixed_lengths(m.isl, m.osl))
        )
        if m.metric == "max_rate_per_s":
            return sr.rate_per_s, {"binding": sr.binding}
        out = sr.rate_per_s * m.osl
        return _per_metric(m, out, out * (m.isl + m.osl) / m.osl, plan), {"binding": sr.binding}
    from perfmodel.serving.offline import offline_throughput

    r = offline_throughput(model, device, plan, input_len=m.isl, output_len=m.osl, engine=engine)
    detail = {"batch": r.batch, "binding": r.binding, "prefill_share": r.prefill_share}
    if m.metric == "max_rate_per_s":
        return r.requests_per_s, detail
    return _per_metric(m, r.output_tokens_per_s, r.total_tokens_per_s, plan), detail


def _static(
    m: Measurement, model: ModelSpec, device: Device, plan: ParallelPlan, engine: Engine | None
) -> tuple[float, dict[str, Any]]:
    from perfmodel.estimate import estimate

    assert m.batch_size is not None
    e = estimate(
        Instance(model, device, plan, engine=engine),
        batch=m.batch_size,
        input_len=m.isl,
        output_len=m.osl,
    )
    detail = {"fits": e.memory.fits}
    if m.metric in _THROUGHPUT:
        b = m.batch_size
        return _per_metric(m, e.output_tokens_per_s, b * (m.isl + m.osl) / e.e2e_s, plan), detail
    if m.metric == "ttft_ms":
        return e.ttft_s * MS_PER_S, detail
    if m.metric == "tpot_ms":
        return e.tpot_s * MS_PER_S, detail
    if m.metric == "e2e_s":
        return e.e2e_s, detail
    raise SpecError(f"a static batch gives no {m.metric}")


def _online(
    m: Measurement, model: ModelSpec, device: Device, plan: ParallelPlan, engine: Engine | None
) -> tuple[float, dict[str, Any]]:
    from perfmodel.serving import service as queueing
    from perfmodel.workload.lengths import fixed_lengths
    from perfmodel.workload.presets import Workload

    assert m.request_rate_per_s is not None
    kw = {"max_batched_tokens": engine.max_num_batched_tokens} if engine else {}
    sr = queueing.service_rate(
        Instance(model, device, plan, engine=engine),
        Workload("online", fixed_lengths(m.isl, m.osl)),
        **kw,
    )
    lat = queueing.latency(sr, m.request_rate_per_s)
    if not lat.stable:
        raise SpecError(
            f"the rate {m.request_rate_per_s:g}/s exceeds the predicted μ = "
            f"{sr.rate_per_s:.3g}/s: no steady state to compare with"
        )
    key = m.metric.replace("_ms", "")
    name = {"ttft": "ttft_mean_s", "tpot": "tpot_mean_s"}.get(key, f"{key}_s")
    if not hasattr(lat, name):
        raise SpecError(f"an online run gives no {m.metric} here")
    return float(getattr(lat, name)) * MS_PER_S, {
        "utilization": m.request_rate_per_s / sr.rate_per_s
    }


def predict_row(m: Measurement, *, engine: str | Engine | None = None) -> RowResult:
    """Predict one row. ``engine``: ``None`` uses the row's engine, :data:`BASELINE`
    (``"none"``) the engine-less model, anything else overrides every row's engine."""
    try:
        if engine is None:
            eng: Engine | None = _engine(m.engine)
        elif isinstance(engine, Engine):
            eng = engine
        elif engine == BASELINE:
            eng = None
        else:
            eng = _engine(engine)
    except PerfModelError as e:
        return _unrep(m, f"engine: {e}")
    used = eng.id if eng else ""
    try:
        model, device = _model(m.model), _device(m.device)
    except PerfModelError as e:
        return _unrep(m, str(e), used)
    if m.concurrency:
        return _unrep(m, "closed-loop (concurrency) runs are not modeled", used)
    try:
        plan = plan_for(m, device)
        model.check_tp(plan.tp)
        if m.request_rate_per_s is not None:
            value, detail = _online(m, model, device, plan, eng)
        elif m.batch_size is not None:
            value, detail = _static(m, model, device, plan, eng)
        elif m.metric in (*_THROUGHPUT, "max_rate_per_s"):
            value, detail = _offline(m, model, device, plan, eng)
        else:
            return _unrep(m, f"an offline run gives no steady-state {m.metric}", used)
    except PerfModelError as e:
        return _unrep(m, str(e), used)
    return RowResult(m, value, "ok", "", used, detail)


def predict_rows(rows: list[Measurement], *, engine: str | Engine | None = None) -> list[RowResult]:
    return [predict_row(m, engine=engine) for m in rows]
