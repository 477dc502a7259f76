"""Bounds from first principles: bytes and FLOPs removed, arithmetic intensity, the
HBM traffic of chunked prefill, transfers over a link, and prefix reuse."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from perfmodel.errors import SpecError
from perfmodel.step.batch import Batch
from perfmodel.step.time import StepTime
from perfmodel.units import MS_PER_S, GiB, gbit_per_s_to_bytes_per_s
from reports.claims.setup import Side
from reports.claims.verdict import Outcome, num


def _batch(p: Side) -> Batch:
    phase = str(p.get("phase", "decode"))
    if phase == "decode":
        return Batch.decode(p.num("batch", 1), p.num("context_len", 1024))
    if phase == "prefill":
        return Batch.prefill(p.num("batch", 1), p.num("input_len"), p.num("context_len", 0))
    raise SpecError(f"phase must be decode or prefill, got {phase!r}")


def _step(p: Side, batch: Batch | None = None) -> StepTime:
    return p.instance().step(batch or _batch(p))


def bytes_removed(params: Side) -> Outcome:
    """Upper bound on the speedup (or latency cut) from removing a fraction of an op's work.

    Ops named in ``ops`` (e.g. ``moe_experts``, ``attention``) lose ``bytes_fraction`` of
    their bytes and ``flops_fraction`` of their FLOPs; each op's roofline time becomes
    ``max(c·(1 − f_flops), m·(1 − f_bytes))`` plus its fixed overhead, everything else is
    unchanged (Amdahl). ``report``: ``speedup`` (t_old / t_new) or ``reduction``
    (1 − t_new / t_old). Either way the value bounds what removing that work can give.
    """
    st = _step(params)
    names = list(params.need("ops"))
    fb = params.num("bytes_fraction", 0.0)
    ff = params.num("flops_fraction", 0.0)
    known = {o.name for o in st.ops}
    if missing := [n for n in names if n not in known]:
        raise SpecError(f"no op {missing} in this step; ops are {', '.join(sorted(known))}")
    total = float(st.total_s)
    new = total
    steps = [("step time (ms)", num(total * MS_PER_S))]
    for o in st.ops:
        if o.name not in names:
            continue
        c, m, t = float(o.compute_s), float(o.memory_s), float(o.total_s)
        t_new = max(c * (1 - ff), m * (1 - fb)) + (t - max(c, m))
        new += t_new - t
        steps.append((f"{o.name}: share of step, bound", f"{t / total:.1%}, {o.bound}"))
        steps.append(
            (
                f"{o.name}: time before → after (ms)",
                f"{num(t * MS_PER_S)} → {num(t_new * MS_PER_S)}",
            )
        )
    report = str(params.get("report", "speedup"))
    v = total / new if report == "speedup" else 1 - new / total
    steps.append((f"bound on the {report}", num(v)))
    return Outcome(
        value=v,
        unit="x" if report == "speedup" else "",
        inputs=params.describe(),
        steps=steps,
        bound="upper",
    )


def intensity(params: Side) -> Outcome:
    """Share of a decode step's time in memory-bound ops at the largest batch that fits.

    The batch is ``min(max_num_seqs, ⌊M / context_len⌋)`` (``perfmodel.memory``); the
    steps give the arithmetic intensity FLOP/B against the device's ridge point.
    """
    from perfmodel.memory import memory_fit

    model, dev, plan = params.model(), params.device(), params.plan()
    ctx = params.int("context_len")
    fit = memory_fit(model, dev, plan)
    b = min(params.int("max_num_seqs", 1 << 20), fit.max_batch(ctx))
    if b < 1:
        raise SpecError(f"no sequence of {ctx} tokens fits in the KV cache")
    st = params.instance().step(Batch.decode(b, ctx))
    share = float(st.by_bound()["memory"]) / float(st.total_s)
    ai = float(st.flops) / float(st.bytes)
    ridge = dev.ridge_flop_per_byte(plan.act_dtype)
    return Outcome(
        value=share,
        inputs=params.describe(),
        steps=[
            ("largest batch at this context (KV capacity / context, capped)", num(b)),
            ("step FLOP, bytes", f"{float(st.flops):.3g}, {float(st.bytes):.3g}"),
            ("arithmetic intensity (FLOP/B) vs ridge point", f"{ai:.1f} vs {ridge:.0f}"),
            ("share of step time in memory-bound ops", f"{share:.1%}"),
        ],
    )


def chunked_traffic(params: Side) -> Outcome:
    """HBM bytes of an ``input_len`` prompt prefilled in chunks of ``chunk`` over the same
    prompt prefilled without chunking.

    Prefill alone (no ``decode_batch``): the chunks re-read every weight they touch (for
    MoE the experts their tokens activate, ``D(C)`` per chunk, ``perfmodel.ops``) and the
    KV of the chunks before them. With ``decode_batch = n`` running at ``context_len``:
    both schedules take ``G = ⌈S/C⌉`` iterations that each also decode the ``n`` requests.
    Chunked: iteration ``i`` is ``n`` decodes + chunk ``i``. Layered (the layer-group
    schedule): every iteration decodes, and each layer group prefills all ``S`` tokens
    once, so over the ``G`` iterations the prompt adds ``bytes(n decodes + S prefill) −
    bytes(n decodes)`` once. Value: ``bytes(chunked)/bytes(other) − 1``.
    """
    S, C = params.int("input_len"), max(1, round(params.num("chunk")))
    b = params.num("batch", 1)
    starts = np.arange(0, S, C)
    sizes = np.minimum(C, S - starts)
    G = len(starts)
    pre = Batch.prefill(b, sizes, starts)
    steps = [("chunks G", num(G))]
    if params.get("decode_batch") is None:
        other = float(_step(params, Batch.prefill(b, S)).bytes)
        chunked = float(np.sum(_step(params, pre).bytes))
        steps += [("bytes, whole prefill (GiB)", num(other / GiB))]
    else:
        dec = Batch.decode(params.num("decode_batch"), params.num("context_len", 1024))
        d_only = float(_step(params, dec).bytes)
        with_prompt = float(_step(params, dec + Batch.prefill(b, S)).bytes)
        other = G * d_only + (with_prompt - d_only)
        chunked = float(np.sum(_step(params, dec + pre).bytes))
        steps += [
            ("bytes of one decode-only iteration (GiB)", num(d_only / GiB)),
            ("bytes, layered: G decode iterations + the prompt once (GiB)", num(other / GiB)),
        ]
    inc = chunked / other - 1
    steps += [("bytes, chunked (GiB)", num(chunked / GiB)), ("relative increase", f"{inc:.1%}")]
    return Outcome(value=inc, inputs=params.describe(), steps=steps)


def _link(p: Side) -> Any:
    from hardware.device import Link

    if p.get("bw_gbit_per_s") is not None:
        return Link(
            "given",
            gbit_per_s_to_bytes_per_s(p.num("bw_gbit_per_s")),
            latency_s=p.num("latency_s", 0.0),
        )
    dev = p.device()
    which = str(p.get("link", "host"))
    link = {"host": dev.host_link, "scale_up": dev.scale_up, "scale_out": dev.scale_out}.get(which)
    if link is None:
        raise SpecError(f"{dev.id} has no {which} link (link: host, scale_up or scale_out)")
    if p.get("latency_s") is not None:
        link = dataclasses.replace(link, latency_s=p.num("latency_s"))
    return link


def transfer(params: Side) -> Outcome:
    """Minimum time to move ``bytes`` — or the KV of ``tokens`` tokens of ``model`` — over a
    link (``perfmodel.paging.link_transfer_s``; ``latency_s`` overrides the link's
    per-message latency). ``relative_to = "prefill"``: as a share of the ``tokens``-token
    prefill on ``device``. With ``messages`` and ``baseline_messages``: the bytes go as
    that many equal messages one after another (each paying the latency), and the value
    is the time saved, ``1 − t(messages)/t(baseline_messages)``."""
    from perfmodel.cache.paging import link_transfer_s
    from perfmodel.memory import kv_bytes_per_token_per_device

    steps = []
    if params.get("bytes") is not None:
        n = params.num("bytes")
    else:
        model, plan = params.model(), params.plan()
        per = kv_bytes_per_token_per_device(model, plan) * plan.tp
        n = per * params.num("tokens")
        steps.append(("KV bytes per token (all devices)", num(per)))
    link = _link(params)
    if params.get("baseline_messages") is not None:
        m, mb = params.num("messages", 1), params.num("baseline_messages")
        t, tb = (k * link_transfer_s(n / k, link) for k in (m, mb))
        v = 1 - t / tb
        steps += [
            ("bytes moved (GiB)", num(n / GiB)),
            (f"{mb:,.0f} messages over {link.name} (ms)", num(tb * MS_PER_S)),
            (f"{m:,.0f} messages (ms)", num(t * MS_PER_S)),
            ("time saved", f"{v:.1%}"),
        ]
        return Outcome(value=v, inputs=params.describe(), steps=steps)
    t = link_transfer_s(n, link)
    steps += [
        ("bytes moved (GiB)", num(n / GiB)),
        (f"time over {link.name} (ms)", num(t * MS_PER_S)),
    ]
    v = t
    if params.get("relative_to") == "prefill":
        tp = float(_step(params, Batch.prefill(1, params.num("tokens"))).total_s)
        v = t / tp
        steps += [("prefill time (ms)", num(tp * MS_PER_S)), ("transfer / prefill", num(v))]
    return Outcome(
        value=v,
        unit="" if params.get("relative_to") else "s",
        inputs=params.describe(),
        steps=steps,
    )


def prefix_reuse(params: Side) -> Outcome:
    """TTFT speedup from a cached prefix: ``t_prefill(S) / t_prefill((1 − h)·S over h·S)``
    at prefix hit rate ``hit_rate`` (the reused tokens' KV is read, not recomputed)."""
    S = params.num("input_len")
    h = params.num("hit_rate")
    if not 0 <= h < 1:
        raise SpecError(f"hit_rate must be in [0, 1), got {h}")
    b = params.num("batch", 1)
    full = float(_step(params, Batch.prefill(b, S)).total_s)
    new = max(1.0, round((1 - h) * S))
    part = float(_step(params, Batch.prefill(b, new, S - new)).total_s)
    return Outcome(
        value=full / part,
        unit="x",
        inputs=params.describe(),
        steps=[
            ("prefill of the whole prompt (ms)", num(full * MS_PER_S)),
            (
                f"prefill of {new:,.0f} new tokens over {S - new:,.0f} cached (ms)",
                num(part * MS_PER_S),
            ),
            ("TTFT speedup", num(full / part)),
        ],
    )


def overlap(params: Side) -> Outcome:
    """Upper bound on the speedup from overlapping compute-, memory- and
    communication-bound operators of one iteration (NanoFlow-style intra-device
    parallelism): ``Σ t_op / max(T_compute, T_memory, T_comm)``, each ``T`` the summed time
    of the ops bound by that resource (``StepTime.by_bound``)."""
    st = _step(params)
    parts = {k: float(v) for k, v in st.by_bound().items()}
    total = float(st.total_s)
    v = total / max(parts.values())
    steps = [("iteration (ms)", num(total * MS_PER_S))]
    steps += [(f"{k}-bound ops (ms)", num(t * MS_PER_S)) for k, t in parts.items()]
    steps.append(("bound: total / largest part", num(v)))
    return Outcome(value=v, unit="x", inputs=params.describe(), steps=steps, bound="upper")
