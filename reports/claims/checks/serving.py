"""Serving checks: a metric of two configurations (``a`` over ``b``), and paged vs reserved KV.

``serving_ratio``: each side is an instance (model, device, tp, dtypes — KV
quantization is ``kv_dtype``) plus a ``policy``:

* ``continuous`` — continuous batching with chunked prefill (:mod:`perfmodel.queueing`,
  token budget ``max_batched_tokens``): throughput, goodput, tpot_mean, ttft_mean;
* ``chunked_tbt`` — the same with the largest budget whose full iteration meets
  ``tbt_slo_ms`` (Sarathi-Serve): throughput, goodput;
* ``prefill_stall`` — whole prefills ahead of stalled decodes
  (:mod:`perfmodel.serving.prefill_priority`): throughput, goodput, tpot_mean, ttft_mean;
* ``static`` — request-level batching (:mod:`perfmodel.serving.static_batching`): throughput;
* ``saturated_decode`` — decode at full KV with ``allocation`` paged / reserved_max /
  reserved_actual and ``kv_keep_fraction`` of the KV kept: decode_throughput.

Goodput: ``continuous`` uses the project's SLO criterion (``perfmodel.queueing.goodput``:
attainment of both TTFT and TPOT targets ≥ goal). ``chunked_tbt`` and ``prefill_stall``
are compared on the TBT criterion, the largest stable rate whose ``slo_percentile``
time between tokens is within ``tbt_slo_ms`` (for ``chunked_tbt`` its ``μ``: no
iteration exceeds the target); ``prefill_stall`` also takes an optional
``ttft_slo_ms`` on the same percentile.
"""

from __future__ import annotations

import math
from typing import Any

from perfmodel.cache.kv_paging import paging_vs_reservation
from perfmodel.errors import SpecError
from perfmodel.memory import memory_fit
from perfmodel.step.batch import Batch
from perfmodel.units import MS_PER_S, from_ms
from reports.claims.setup import Side, _cached
from reports.claims.verdict import Outcome, num

POLICIES = ("continuous", "chunked_tbt", "prefill_stall", "static", "saturated_decode")
METRICS = ("throughput", "goodput", "tpot_mean", "ttft_mean", "decode_throughput")
ALLOCATIONS = ("paged", "reserved_max", "reserved_actual")


def _kv(side: Side) -> int | None:
    v = side.get("kv_capacity_tokens")
    return None if v is None else side.int("kv_capacity_tokens")


def _continuous(side: Side, metric: str, policy: str) -> tuple[float, dict[str, Any]]:
    from perfmodel.serving.goodput import goodput
    from perfmodel.serving.prefill_priority import tbt_budget
    from perfmodel.serving.service import latency, service_rate

    model, dev, plan, wl = side.model(), side.device(), side.plan(), side.workload()
    if policy == "chunked_tbt":
        tbt = from_ms(side.num("tbt_slo_ms"))
        memo = _cached(
            ("budgets", model.id, dev.id, repr(plan), side.lengths_key(), _kv(side)), dict
        )
        sr = tbt_budget(
            side.instance(), wl, tbt_slo_s=tbt, kv_capacity_tokens=_kv(side), rates=memo
        )
        if sr is None:
            return 0.0, {"note": "no token budget meets the TBT target"}
    else:
        sr = service_rate(
            side.instance(),
            wl,
            kv_capacity_tokens=_kv(side),
            max_batched_tokens=side.int("max_batched_tokens", 8192),
        )
    info: dict[str, Any] = {
        "service rate μ (req/s)": sr.rate_per_s,
        "binding bound": sr.binding,
        "token budget B": sr.max_batched_tokens,
        "full iteration (ms)": sr.full_step_s * MS_PER_S,
        "KV capacity (tokens)": sr.kv_capacity_tokens,
    }
    if metric == "throughput":
        return sr.rate_per_s, info
    if metric == "goodput":
        if policy == "chunked_tbt":
            if side.get("ttft_slo_ms") is not None:
                raise SpecError("chunked_tbt goodput is the TBT-only criterion: drop ttft_slo_ms")
            g = sr.rate_per_s  # every iteration ≤ t(B) ≤ the TBT target: stable = within SLO
        else:
            g = goodput(sr, side.slo(), rel_tol=1e-2).rate_per_s
        info["goodput (req/s)"] = g
        return g, info
    if metric in ("tpot_mean", "ttft_mean"):
        rate = side.num("rate_per_s")
        est = latency(sr, rate)
        v = est.tpot_mean_s if metric == "tpot_mean" else est.ttft_mean_s
        info[f"{metric} at {rate:g} req/s (ms)"] = v * MS_PER_S
        return v, info
    raise SpecError(f"policy {policy!r} has no metric {metric!r}")


def _stall(side: Side, metric: str) -> tuple[float, dict[str, Any]]:
    from perfmodel.serving.prefill_priority import (
        prefill_times,
        stall_goodput,
        stall_operating_point,
    )

    model, dev, plan, lengths = side.model(), side.device(), side.plan(), side.lengths()
    M = _kv(side) or memory_fit(model, dev, plan).kv_capacity_tokens
    cap = side.int("max_num_seqs", 256)
    q = side.num("slo_percentile", 0.99)
    if metric in ("throughput", "goodput"):
        tbt = math.inf if metric == "throughput" else from_ms(side.num("tbt_slo_ms"))
        given = metric == "goodput" and side.get("ttft_slo_ms") is not None
        ttft = from_ms(side.num("ttft_slo_ms")) if given else math.inf
        g = stall_goodput(
            side.instance(),
            lengths,
            kv_capacity_tokens=M,
            tbt_slo_s=tbt,
            ttft_slo_s=ttft,
            percentile=q,
            max_num_seqs=cap,
        )
        return g, {"largest rate meeting the criterion (req/s)": g, "KV capacity (tokens)": M}
    if metric in ("tpot_mean", "ttft_mean"):
        pt = prefill_times(side.instance(), lengths, max_decode_seqs=cap)
        op = stall_operating_point(
            pt,
            side.num("rate_per_s"),
            kv_capacity_tokens=M,
            max_num_seqs=cap,
            percentile=q,
        )
        v = op.tpot_mean_s if metric == "tpot_mean" else op.ttft_mean_s
        return v, {k: v for k, v in op.to_dict().items()}
    raise SpecError(f"policy 'prefill_stall' has no metric {metric!r}")


def _static(side: Side, metric: str) -> tuple[float, dict[str, Any]]:
    from perfmodel.serving.static_batching import static_batching

    if metric != "throughput":
        raise SpecError("static batching is modeled at saturation only: metric 'throughput'")
    r = static_batching(
        side.instance(),
        side.lengths(),
        max_batch=side.int("max_batch", 256),
        kv_capacity_tokens=_kv(side),
        reserved_tokens=side.int("reserved_tokens") if side.get("reserved_tokens") else None,
    )
    return r.rate_per_s, r.to_dict()


def saturated_decode(side: Side) -> tuple[float, dict[str, Any]]:
    """Decode tokens/s with the KV full under an allocation scheme (kv_paging footprints)."""
    model, dev, plan, lengths = side.model(), side.device(), side.plan(), side.lengths()
    alloc = str(side.get("allocation", "paged"))
    if alloc not in ALLOCATIONS:
        raise SpecError(f"allocation must be one of {', '.join(ALLOCATIONS)}, got {alloc!r}")
    keep = side.num("kv_keep_fraction", 1.0)
    if not 0 < keep <= 1:
        raise SpecError(f"kv_keep_fraction must be in (0, 1], got {keep}")
    ml = side.get("max_len_tokens")
    key = ("paging", model.id, dev.id, repr(plan), side.lengths_key(), ml)
    cmp = _cached(
        key,
        lambda: paging_vs_reservation(
            side.instance(), lengths, max_len_tokens=None if ml is None else int(ml)
        ),
    )
    sch = {
        "paged": cmp.paged,
        "reserved_max": cmp.reserved_max,
        "reserved_actual": cmp.reserved_actual,
    }[alloc]
    cap = side.num("max_num_seqs", 256)
    raw = cmp.kv_capacity_tokens / (sch.footprint_tokens * keep)
    b = min(math.floor(raw) if alloc == "reserved_max" else raw, cap)
    ctx = cmp.mean_context_tokens * keep
    t = float(side.instance().iteration_s(Batch.decode(b, ctx)))
    return b / t, {
        "KV capacity M (tokens)": cmp.kv_capacity_tokens,
        "footprint per request (tokens)": sch.footprint_tokens * keep,
        "batch (M/footprint, capped)": b,
        "decode context read per request (tokens)": ctx,
        "decode step (ms)": t * MS_PER_S,
        "decode tokens/s": b / t,
    }


def side_metric(side: Side, metric: str) -> tuple[float, dict[str, Any]]:
    policy = str(side.get("policy", "continuous"))
    if policy not in POLICIES:
        raise SpecError(f"{side.what}: policy must be one of {', '.join(POLICIES)}")
    if metric not in METRICS:
        raise SpecError(f"metric must be one of {', '.join(METRICS)}, got {metric!r}")
    if policy in ("continuous", "chunked_tbt"):
        return _continuous(side, metric, policy)
    if policy == "prefill_stall":
        return _stall(side, metric)
    if policy == "static":
        return _static(side, metric)
    if metric != "decode_throughput":
        raise SpecError("policy 'saturated_decode' has only the metric 'decode_throughput'")
    return saturated_decode(side)


def serving_ratio(params: Side) -> Outcome:
    """``metric(a) / metric(b)`` (``invert = true``: ``b / a``, e.g. for latency cuts)."""
    metric = str(params.get("metric", "throughput"))
    a, b = params.side("a"), params.side("b")
    va, ia = side_metric(a, metric)
    vb, ib = side_metric(b, metric)
    if params.get("invert", False):
        va, vb = vb, va
    ratio = math.inf if vb == 0 and va > 0 else (math.nan if vb == 0 else va / vb)
    steps = [(f"a ({a.get('policy', 'continuous')}): {k}", num(v)) for k, v in ia.items()]
    steps += [(f"b ({b.get('policy', 'continuous')}): {k}", num(v)) for k, v in ib.items()]
    steps.append((f"{metric} a / b" if not params.get("invert") else f"{metric} b / a", num(ratio)))
    return Outcome(
        value=ratio,
        unit="x",
        inputs={"metric": metric, "a": a.describe(), "b": b.describe()},
        steps=steps,
    )


def kv_paging(params: Side) -> Outcome:
    """Paged over max-length-reserved decode throughput (``perfmodel.kv_paging``)."""
    p = paging_vs_reservation(
        params.instance(),
        params.lengths(),
        max_len_tokens=int(params.get("max_len_tokens")) if params.get("max_len_tokens") else None,
        max_num_seqs=params.int("max_num_seqs", 256),
    )
    steps = [
        ("KV capacity M (tokens)", num(p.kv_capacity_tokens)),
        ("reserved length L_max (tokens)", num(p.max_len_tokens)),
        ("step-averaged context c̄ (tokens)", num(p.mean_context_tokens)),
    ]
    for s in (p.reserved_max, p.reserved_actual, p.paged):
        steps.append(
            (
                f"{s.name}: footprint / batch / tok/s",
                f"{s.footprint_tokens:,.0f} / {s.batch:,.1f} / {s.tokens_per_s:,.0f}",
            )
        )
    steps.append(("paged / reserved-for-max decode throughput", num(p.throughput_ratio)))
    return Outcome(value=p.throughput_ratio, unit="x", inputs=params.describe(), steps=steps)
