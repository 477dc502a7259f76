"""MoE checks: the expert-block crossover, expert-cache hit rates, offloading speedups,
and the dispatch phase diagram at a point."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from perfmodel.errors import SpecError
from perfmodel.step.batch import Batch
from perfmodel.units import MS_PER_S
from reports.claims.setup import Side
from reports.claims.verdict import Outcome, num


def _shared_data(spec: str, base: Path) -> Path:
    """``{shared_data}/x.csv`` is ``x.csv`` in the ``shared/data`` folder beside the
    checkout (as the validation tests read it); other paths are relative to the claim."""
    if spec.startswith("{shared_data}/"):
        root = Path(__file__).resolve().parents[3].parent / "shared" / "data"
        return root / spec.removeprefix("{shared_data}/")
    return base / spec


def crossover(params: Side) -> Outcome:
    """n* (tokens per activated expert) of the expert block on each device in ``devices``.

    ``source``: ``derived`` (roofline), ``profile`` (the stored fitted profile
    ``<device>:moe_expert_<h>x<i>x<m>``) or ``data`` (bf16 GEMM CSVs in ``data``, one
    per device, fitted here with a bootstrap interval of ``boots`` resamples; when a
    file is absent the stored profile is used and the steps say so). The value is the
    n* of the devices by ``aggregate`` (mean, min or max); the steps give each with
    its interval — for a stored
    profile, the range from many activated experts (``b/β``) to one (``n*(G=1)``).
    """
    from hardware.device import load_device
    from hardware.profile_io import load_profile
    from perfmodel.moe.expert import (
        crossover_interval,
        crossover_tokens,
        derived_expert_profile,
        expert_shape,
        gemm_block_rows,
    )

    model = params.model()
    h, inter, mats = expert_shape(model, params.int("tp", 1))
    devices = params.get("devices") or [params.need("device")]
    source = str(params.get("source", "profile"))
    if source not in ("derived", "profile", "data"):
        raise SpecError(f"crossover source must be derived, profile or data, got {source!r}")
    data = list(params.get("data", []))
    stars, steps = [], []
    for i, d in enumerate(devices):
        dev = load_device(str(d))
        path = _shared_data(str(data[i]), params.base_dir) if i < len(data) else None
        how = source
        if source == "data" and path is not None and path.exists():
            from hardware.measurements import read_measurements

            meas = read_measurements(
                str(path), time_col="latency_ms", where={"gemm_dtype": "bfloat16"}
            )
            gm, gn, gk = (meas.numeric(c) for c in ("m", "n", "k"))
            G, N, _, ts = gemm_block_rows(
                gm, gn, gk, meas.time_s, hidden=h, inter=inter, mats=mats, padded=True
            )
            c = crossover_interval(G, N, ts, boots=params.int("boots", 40), seed=0)
            n, lo, hi = c.n_star, c.lo, c.hi
            how = f"fitted to {path.name}, 95% bootstrap ({c.boots} resamples)"
        elif source == "derived":
            prof = derived_expert_profile(dev, h, inter, mats=mats)
            n = lo = hi = crossover_tokens(prof)
        else:
            if source == "data":
                how = "stored profile (measurements not present)"
            prof = load_profile(f"{dev.id}:moe_expert_{h}x{inter}x{mats}", device=dev.id)
            n = crossover_tokens(prof)
            a, b = n, crossover_tokens(prof, G=1.0)
            lo, hi = min(a, b), max(a, b)
        stars.append(n)
        steps.append((f"{dev.id}: n* (tokens/expert), {how}", num(n)))
        steps.append((f"{dev.id}: interval", f"{num(lo)} … {num(hi)}"))
    steps.insert(0, ("expert shape (hidden × intermediate × matrices)", f"{h}×{inter}×{mats}"))
    agg = str(params.get("aggregate", "mean"))
    if agg not in ("mean", "min", "max"):
        raise SpecError("aggregate must be mean, min or max")
    v = {"mean": float(np.mean(stars)), "min": min(stars), "max": max(stars)}[agg]
    steps.append((f"{agg} over the devices", num(v)))
    return Outcome(value=v, unit="tokens", inputs=params.describe(), steps=steps)


def _activation(model: Any, skew: float) -> np.ndarray:
    from perfmodel.cache.serving import popularity_activation

    assert model.moe is not None
    e, k = model.moe.num_experts, model.moe.top_k
    return np.full(e, k / e) if skew <= 0 else popularity_activation(model, skew)


def expert_cache(params: Side) -> Outcome:
    """Hit rate of a per-layer expert cache of ``cache_multiple × top_k`` experts.

    Independent-reference routing with Zipf(``zipf_exponent``) popularity (0 = uniform),
    steps of ``tokens`` tokens, ``policy`` lru (Che) or static (top-C by popularity).
    """
    from perfmodel.cache.paging import expert_misses

    model = params.model()
    if model.moe is None:
        raise SpecError(f"{model.id} is not a mixture-of-experts model")
    k = model.moe.top_k
    c = params.num("cache_multiple", 2.0) * k
    skew = params.num("zipf_exponent", 0.0)
    tokens = params.num("tokens", 1)
    m = expert_misses(_activation(model, skew), tokens, c, policy=str(params.get("policy", "lru")))
    return Outcome(
        value=m.hit_ratio,
        inputs=params.describe(),
        steps=[
            ("experts per layer E, top-k", f"{model.moe.num_experts}, {k}"),
            ("cache per layer (experts)", num(c)),
            ("distinct experts a step needs D(B)", num(m.distinct)),
            ("misses per step per layer", num(m.misses)),
            ("hit ratio (activation-weighted)", num(m.hit_ratio)),
        ],
    )


def _offload_step(side: Side, model: Any, compute_s: float, tokens: float) -> tuple[float, dict]:
    from perfmodel.cache.footprint import expert_bytes
    from perfmodel.cache.paging import expert_fetch, expert_misses, step_with_misses_s

    dev = side.device()
    assert model.moe is not None
    hi_b = expert_bytes(model, str(side.get("weight_dtype", "bf16")))
    lo_dtype = side.get("low_dtype")
    lo_b = expert_bytes(model, str(lo_dtype)) if lo_dtype else None
    cache = side.num("cache_experts", 0.0)
    act = _activation(model, side.num("zipf_exponent", 0.0))
    if cache > 0:
        per_layer = expert_misses(act, tokens, cache, policy=str(side.get("policy", "lru"))).misses
    else:
        per_layer = float(np.sum(1 - (1 - act) ** tokens))  # nothing cached: every D(B)
    per_layer *= side.num("miss_scale", 1.0)
    misses = model.n_moe_layers * per_layer
    fetch = expert_fetch(
        hi_b,
        dev.host_link,
        low_bytes=lo_b,
        low_fraction=side.num("low_fraction", 0.0) if lo_b else 0.0,
    )
    t = step_with_misses_s(compute_s, misses * fetch.mean_s, prefetched=side.num("prefetched", 0.0))
    return t, {
        "misses per token step (all layers)": misses,
        "mean fetch per miss (ms)": fetch.mean_s * MS_PER_S,
        "step (ms)": t * MS_PER_S,
    }


def offload_speedup(params: Side) -> Outcome:
    """Decode step of side ``b`` (baseline) over side ``a`` (the method), experts offloaded.

    Each side: ``cache_experts`` per layer (0: load on demand), ``policy``, ``low_dtype``
    with ``low_fraction`` of misses fetched in it, ``prefetched`` fraction overlapped with
    compute, ``miss_scale`` (misses relative to the IRM model, e.g. < 1 for a predictor).
    The compute part is the decode iteration with every expert resident.
    """
    model = params.model()
    if model.moe is None:
        raise SpecError(f"{model.id} is not a mixture-of-experts model")
    batch = params.num("batch", 1)
    ctx = params.num("context_len", 512)
    comp = float(params.instance().iteration_s(Batch.decode(batch, ctx)))
    ta, ia = _offload_step(params.side("a"), model, comp, batch)
    tb, ib = _offload_step(params.side("b"), model, comp, batch)
    steps = [("decode step with experts resident (ms)", num(comp * MS_PER_S))]
    steps += [(f"a: {k}", num(v)) for k, v in ia.items()]
    steps += [(f"b: {k}", num(v)) for k, v in ib.items()]
    steps.append(("speedup b / a", num(tb / ta)))
    return Outcome(value=tb / ta, unit="x", inputs=params.describe(), steps=steps)


DISPATCH_FIELDS = ("comm_share", "layer_gain", "block_gain", "proxy_spread")


def dispatch_regime(params: Side) -> Outcome:
    """A field of the dispatch phase diagram (``reports.dispatch_phase``) over a small grid.

    ``field``: comm_share / layer_gain / block_gain / proxy_spread; ``aggregate``: max,
    min or mean over the cells of ``tokens_per_gpu`` × ``skews``.
    """
    from reports.dispatch_phase import phase_diagram

    fld = str(params.get("field", "comm_share"))
    if fld not in DISPATCH_FIELDS:
        raise SpecError(f"field must be one of {', '.join(DISPATCH_FIELDS)}")
    agg = str(params.get("aggregate", "max"))
    if agg not in ("max", "min", "mean"):
        raise SpecError("aggregate must be max, min or mean")
    pd = phase_diagram(
        params.model(),
        params.device(),
        num_gpus=params.int("num_gpus"),
        gpus_per_node=params.int("gpus_per_node", 8),
        tokens_per_gpu=[int(t) for t in params.need("tokens_per_gpu")],
        skews=[params.num("skew")]
        if params.get("skew") is not None
        else [float(s) for s in params.get("skews", [1.0])],
        samples=params.int("samples", 2),
    )
    vals = [float(getattr(c, fld)) for c in pd.cells]
    v = max(vals) if agg == "max" else min(vals) if agg == "min" else sum(vals) / len(vals)
    steps = [("link, n* (tokens/expert)", f"{pd.link}, {num(pd.n_star_tokens)}")]
    for c in pd.cells:
        steps.append(
            (
                f"{c.tokens_per_gpu} tok/GPU, skew {c.skew:g}: regime / comm share / gain / spread",
                f"{c.regime} / {c.comm_share:.2f} / {c.layer_gain:+.3f} / {c.proxy_spread:.2f}",
            )
        )
    steps.append((f"{agg} {fld}", num(v)))
    return Outcome(value=v, inputs=params.describe(), steps=steps)
