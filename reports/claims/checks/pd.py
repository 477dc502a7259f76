"""Prefill/decode disaggregation: goodput per GPU against colocated serving, and the P:D ratio.

Both use the PD planner's pieces (``solvers.pd_plan``): the per-configuration phase
goodputs under DistServe's percentile criterion (``evaluate_options``), the rate-free
optimum with fractional instance counts (``fluid_optimum``: goodput per GPU at scale)
and the best colocated chunked-prefill configuration under the same criterion
(``colocated_baseline``). ``tps`` limits the tensor-parallel degrees searched.
"""

from __future__ import annotations

from typing import Any

from reports.claims.setup import Side
from reports.claims.verdict import Outcome, num


def _fluid(p: Side, *, lengths: Any = None) -> tuple[Any, list[tuple[str, str]]]:
    from solvers.pd.plan import evaluate_options, fluid_optimum

    model, dev = p.model(), p.device()
    dec = p.device("decode_device") if p.get("decode_device") else dev
    opts = evaluate_options(
        model,
        lengths or p.lengths(),
        p.slo(),
        prefill_devices=[dev],
        decode_devices=[dec],
        dtype=str(p.get("weight_dtype", "bf16")),
        kv_dtype=str(p.get("kv_dtype", "bf16")),
        tp_candidates=[int(t) for t in p.get("tps", [1, 2, 4, 8])],
    )
    f = fluid_optimum(opts)
    steps = [
        (
            "prefill config, goodput per instance (req/s)",
            f"{f.prefill.config.label}, {num(f.prefill.rate_per_s)}",
        ),
        (
            "decode config, goodput per instance (req/s)",
            f"{f.decode.config.label}, {num(f.decode.rate_per_s)}",
        ),
        ("P:D instance ratio (fluid)", num(f.instance_ratio)),
        ("PD goodput per GPU at scale (req/s)", num(f.per_gpu_rate_per_s)),
    ]
    return f, steps


def pd_gain(params: Side) -> Outcome:
    """Goodput per GPU of the best disaggregated pair over the best colocated instance."""
    from solvers.pd.plan import colocated_baseline

    f, steps = _fluid(params)
    col = colocated_baseline(
        params.model(),
        params.workload(),
        params.slo(),
        devices=[params.device()],
        dtype=str(params.get("weight_dtype", "bf16")),
        kv_dtype=str(params.get("kv_dtype", "bf16")),
        tps=[int(t) for t in params.get("tps", [1, 2, 4, 8])],
    )
    if not col.feasible or col.per_gpu_rate_per_s <= 0:
        steps.append(("colocated", "no colocated configuration meets the SLO at any rate"))
        return Outcome(value=float("inf"), unit="x", inputs=params.describe(), steps=steps)
    g = f.per_gpu_rate_per_s / col.per_gpu_rate_per_s
    steps += [
        (
            "colocated best (TP), goodput per GPU (req/s)",
            f"{col.tp}, {num(col.per_gpu_rate_per_s)}",
        ),
        ("PD / colocated goodput per GPU", num(g)),
    ]
    return Outcome(value=g, unit="x", inputs=params.describe(), steps=steps)


def pd_ratio(params: Side) -> Outcome:
    """How much the optimal P:D instance ratio moves between two request mixes ``a``/``b``
    (value: the larger ratio over the smaller)."""
    fa, sa = _fluid(params.side("a"))
    fb, sb = _fluid(params.side("b"))
    ra, rb = fa.instance_ratio, fb.instance_ratio
    v = max(ra, rb) / min(ra, rb)
    steps = [(f"a: {k}", x) for k, x in sa] + [(f"b: {k}", x) for k, x in sb]
    steps.append(("larger / smaller P:D ratio", num(v)))
    return Outcome(value=v, unit="x", inputs=params.describe(), steps=steps)
