"""Memory arithmetic: fits, max batch, max context, concurrent sequences, peak memory.

The budget is the project's (:func:`perfmodel.memory.memory_fit`: usable HBM minus
weights and the activation reserve) for a catalog model, or — for a model the catalog
lacks — ``hbm · gpu_memory_utilization − weight_params · weight_bits/8 −
reserve_bytes`` from explicit numbers. A sequence's bytes at a context follow
:func:`perfmodel.cache.context_memory.sequence_kv_bytes` (full, sliding-window and recurrent
layers), times ``kv_keep_fraction`` for a compressed cache; ``kv_bytes_per_token``
overrides the model's.

``kind``: ``fits`` (value: usable / needed, ≥ 1 fits), ``max_batch`` /
``concurrent_sequences`` (sequences at ``context_len``), ``max_context`` (tokens each
of ``batch`` sequences can hold). With tables ``a`` and ``b``: the ratio a / b.
"""

from __future__ import annotations

import math
from typing import Any

from perfmodel.cache.context_memory import concurrent_sequences, sequence_kv_bytes
from perfmodel.dtypes import get_dtype
from perfmodel.errors import SpecError
from perfmodel.memory import DEFAULT_GPU_MEMORY_UTILIZATION, memory_fit
from perfmodel.units import BITS_PER_BYTE, GiB, MiB
from reports.claims.verdict import Outcome, num

KINDS = ("fits", "max_batch", "concurrent_sequences", "max_context")
MAX_CONTEXT_TOKENS = 1 << 34


def _budget(side: Any) -> tuple[float, float, dict[str, Any]]:
    """(KV budget bytes, KV bytes per token, steps) for one side."""
    dev = side.device()
    util = side.num("gpu_memory_utilization", DEFAULT_GPU_MEMORY_UTILIZATION)
    if side.get("model") is not None and side.get("weight_params") is None:
        model, plan = side.model(), side.plan()
        fit = memory_fit(model, dev, plan, search_tp=False)
        budget, kv_tok = fit.kv_budget_bytes, fit.kv_bytes_per_token
        info = {
            "usable HBM per device (GiB)": fit.usable_bytes / GiB,
            "weights per device (GiB)": fit.weight_bytes / GiB,
            "activation reserve (GiB)": fit.reserve_bytes / GiB,
        }
    else:
        devices = side.int("tp", 1) * side.int("pp", 1)
        bits = side.num("weight_bits", get_dtype(str(side.get("weight_dtype", "bf16"))).bytes * 8)
        w = side.num("weight_params") * bits / BITS_PER_BYTE / devices
        usable = dev.hbm_bytes * util
        reserve = side.num("reserve_bytes", 0.0)
        budget, kv_tok = usable - w - reserve, side.num("kv_bytes_per_token", 0.0)
        info = {
            "usable HBM per device (GiB)": usable / GiB,
            f"weights per device at {bits:g} bits (GiB)": w / GiB,
            "activation reserve (GiB)": reserve / GiB,
        }
    if side.get("kv_bytes_per_token") is not None:
        kv_tok = side.num("kv_bytes_per_token")
    info["KV budget per device (GiB)"] = budget / GiB
    info["KV bytes per token per device (all layers full)"] = kv_tok
    return budget, kv_tok, info


def _seq_bytes(side: Any, kv_tok: float, L: float) -> float:
    keep = side.num("kv_keep_fraction", 1.0)
    if not 0 < keep <= 1:
        raise SpecError(f"kv_keep_fraction must be in (0, 1], got {keep}")
    return keep * sequence_kv_bytes(
        kv_tok,
        L,
        full_fraction=side.num("full_fraction", 1.0),
        window_fraction=side.num("window_fraction", 0.0),
        window_tokens=side.num("window_tokens", 0.0),
        state_bytes=side.num("state_bytes", 0.0),
    )


def _one(side: Any) -> tuple[float, dict[str, Any]]:
    kind = str(side.get("kind", "max_batch"))
    if kind not in KINDS:
        raise SpecError(f"memory kind must be one of {', '.join(KINDS)}, got {kind!r}")
    budget, kv_tok, info = _budget(side)
    if kind in ("max_batch", "concurrent_sequences", "fits"):
        L = side.num("context_len")
        per = _seq_bytes(side, kv_tok, L)
        if per <= 0:  # nothing held per sequence: the KV bytes are an open assumption
            return math.nan, info
        info[f"bytes per sequence at {L:,.0f} tokens (MiB)"] = per / MiB
        if kind == "fits":
            b = side.num("batch", 1)
            v = (budget + b * per) / (b * per) if budget > -b * per else 0.0
            info["(budget + KV needed) / KV needed"] = v
            return v, info
        n = concurrent_sequences(budget, per)
        info["concurrent sequences ⌊budget / bytes⌋"] = n
        return float(n), info
    b = side.num("batch", 1)
    lo, hi = 0.0, float(MAX_CONTEXT_TOKENS)
    if b * _seq_bytes(side, kv_tok, 1) > budget:
        info["max context (tokens)"] = 0
        return 0.0, info
    for _ in range(80):
        mid = 0.5 * (lo + hi)
        if b * _seq_bytes(side, kv_tok, mid) <= budget:
            lo = mid
        else:
            hi = mid
    info[f"max context for {b:g} sequences (tokens)"] = lo
    return lo, info


def memory(params: Any) -> Outcome:
    """Memory arithmetic on one configuration, or the ratio of two (module docstring)."""
    if isinstance(params.get("a"), dict):
        va, ia = _one(params.side("a"))
        vb, ib = _one(params.side("b"))
        ratio = va / vb if vb else float("inf")
        steps = [(f"a: {k}", num(v)) for k, v in ia.items()]
        steps += [(f"b: {k}", num(v)) for k, v in ib.items()] + [("a / b", num(ratio))]
        return Outcome(value=ratio, unit="x", inputs=params.describe(), steps=steps)
    v, info = _one(params)
    return Outcome(
        value=None if math.isnan(v) else v,
        unit=str(params.get("unit", "")),
        inputs=params.describe(),
        steps=[(k, num(x)) for k, x in info.items()],
    )


def memory_ratio(params: Any) -> Outcome:
    """Peak device memory (weights + reserve + KV of ``batch × context_len``) of b over a."""
    peaks = []
    steps = []
    for name in ("a", "b"):
        s = params.side(name)
        budget, kv_tok, info = _budget(s)
        usable = info["usable HBM per device (GiB)"] * GiB
        fixed = usable - budget  # weights + reserve
        kv = s.num("batch", 1) * _seq_bytes(s, kv_tok, s.num("context_len"))
        peaks.append(fixed + kv)
        steps += [
            (f"{name}: weights + reserve (GiB)", num(fixed / GiB)),
            (f"{name}: KV of the batch (GiB)", num(kv / GiB)),
            (f"{name}: peak (GiB)", num((fixed + kv) / GiB)),
        ]
    r = peaks[1] / peaks[0]
    steps.append(("peak b / peak a", num(r)))
    return Outcome(value=r, unit="x", inputs=params.describe(), steps=steps)
