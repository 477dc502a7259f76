"""The ``perfmodel plan --out report.html`` report: one self-contained offline HTML file.

Plotly's JavaScript is inlined once; every figure is a ``<div>`` drawn from it, so the
page needs no network. Sections: the recommendation (pools, $/h, $/M tokens, J/token,
kWh/day); cost vs rate per device type with the chosen mix; latency percentiles vs rate
per colocated pool with the SLO lines and the operating point; the stability margin of
every pool; the cost and power breakdown; alternatives, sensitivity, price flips, the
simulation check; the assumptions with their provenance. A small script records any
JavaScript error on ``<body data-js-error=...>`` (the browser test reads it).
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from perfmodel.units import MS_PER_S
from solvers.fleet.plan import PlanInputs
from solvers.fleet.results import Fleet, PlanResult

SWEEP_FACTORS = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0)
LATENCY_POINTS = 24
_QUANTILE_COLORS = {"p50": "#1f77b4", "p90": "#ff7f0e", "p99": "#d62728"}


@dataclass(frozen=True)
class LatencyCurve:
    label: str
    rate_per_s: tuple[float, ...]  # per instance
    ttft_s: dict[str, tuple[float, ...]]  # p50 / p90 / p99
    tpot_s: dict[str, tuple[float, ...]]
    operating_rate_per_s: float
    service_rate_per_s: float


@dataclass(frozen=True)
class PlanSweep:
    rates_per_s: tuple[float, ...]
    cost_by_type: dict[str, tuple[float | None, ...]]
    cost_mix: tuple[float | None, ...]
    latency: tuple[LatencyCurve, ...]


def _cost(f: Fleet | None, priced: bool) -> float | None:
    if f is None:
        return None
    return f.economics.cost_per_hour_usd if priced else float(f.devices)


def rate_sweep(result: PlanResult, inputs: PlanInputs) -> PlanSweep:
    """Cost vs rate (mix and each device type alone) and latency curves of colocated pools."""
    from solvers.fleet.whatif import fleet_at

    cands = list(result.candidates)
    rates = tuple(inputs.rate_per_s * f for f in SWEEP_FACTORS)
    types = sorted(result.best_single_device)
    by_type = {
        t: tuple(_cost(fleet_at(cands, inputs, r, only_type=t), result.priced) for r in rates)
        for t in types
    }
    mix = tuple(_cost(fleet_at(cands, inputs, r), result.priced) for r in rates)
    return PlanSweep(rates, by_type, mix, tuple(_latency_curves(result, inputs)))


def _latency_curves(result: PlanResult, inputs: PlanInputs) -> list[LatencyCurve]:
    from hardware.engine import engine_for
    from perfmodel.plan import ParallelPlan
    from perfmodel.serving.service import latency, service_rate
    from perfmodel.step.instance import Instance
    from perfmodel.workload.presets import Workload
    from solvers.fleet.verify import bucket_mix

    out = []
    for p in result.recommendation.pools:
        c = p.candidate
        if c.role != "colocated":
            continue
        plan = ParallelPlan(tp=c.tp, weight_dtype=c.dtype, act_dtype=c.dtype, kv_dtype=c.dtype)
        inst = Instance(inputs.model, c.device, plan, engine=engine_for(inputs.engine, c.device))
        w = inputs.workload
        if p.buckets:  # the pool serves its buckets' mix, not the whole workload
            w = Workload(f"{w.name} (pool mix)", bucket_mix(p, inputs), w.arrival_cv)
        sr = service_rate(inst, w, max_batched_tokens=c.max_batched_tokens)
        mu = sr.rate_per_s
        rs = tuple(mu * (i + 1) / (LATENCY_POINTS + 1) for i in range(LATENCY_POINTS))
        ests = [latency(sr, r) for r in rs]
        q = ("p50", "p90", "p99")
        out.append(
            LatencyCurve(
                f"{c.device.id} TP{c.tp} colocated",
                rs,
                {k: tuple(getattr(e, f"ttft_{k}_s") for e in ests) for k in q},
                {k: tuple(getattr(e, f"tpot_{k}_s") for e in ests) for k in q},
                p.per_instance_rate_per_s,
                mu,
            )
        )
    return out


def _figures(result: PlanResult, inputs: PlanInputs, sweep: PlanSweep) -> list[Any]:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    unit = "$/h" if result.priced else "devices"
    figs = []
    f1 = go.Figure()
    for t, ys in sweep.cost_by_type.items():
        f1.add_trace(go.Scatter(x=sweep.rates_per_s, y=ys, mode="lines+markers", name=f"{t} only"))
    f1.add_trace(
        go.Scatter(
            x=sweep.rates_per_s,
            y=sweep.cost_mix,
            mode="lines+markers",
            name="chosen mix",
            line={"width": 4, "color": "black"},
        )
    )
    f1.add_vline(x=inputs.rate_per_s, line_dash="dot", annotation_text="planned rate")
    f1.update_layout(
        title=f"Fleet cost vs arrival rate ({unit}); gaps: no fleet of that type meets the SLO",
        xaxis_title="arrival rate (req/s)",
        yaxis_title=unit,
    )
    figs.append(f1)
    slo = inputs.slo
    for cur in sweep.latency:
        f = make_subplots(rows=1, cols=2, subplot_titles=("TTFT", "TPOT"))
        for col, (series, target) in enumerate(
            ((cur.ttft_s, slo.ttft_s), (cur.tpot_s, slo.tpot_s)), start=1
        ):
            for k, ys in series.items():
                f.add_trace(
                    go.Scatter(
                        x=cur.rate_per_s,
                        y=[y * MS_PER_S for y in ys],
                        name=f"{k}",
                        line={"color": _QUANTILE_COLORS[k]},
                        legendgroup=k,
                        showlegend=col == 1,
                        mode="lines",
                    ),
                    row=1,
                    col=col,
                )
            f.add_hline(y=target * MS_PER_S, line_dash="dash", line_color="red", row=1, col=col)
            f.add_vline(x=cur.operating_rate_per_s, line_dash="dot", row=1, col=col)
        f.update_yaxes(title_text="ms", type="log")
        f.update_xaxes(title_text="req/s per instance")
        f.update_layout(
            title=f"{cur.label}: latency percentiles vs rate per instance (red: SLO, dotted: "
            f"planned {cur.operating_rate_per_s:.3g} of μ = {cur.service_rate_per_s:.3g} req/s)"
        )
        figs.append(f)
    pools = result.recommendation.pools
    labels = [
        f"{p.devices}x {p.candidate.device.id} TP{p.candidate.tp} {p.candidate.role}" for p in pools
    ]
    f3 = go.Figure(
        [
            go.Bar(x=labels, y=[p.utilization for p in pools], name="utilization λ/(Nμ)"),
            go.Bar(x=labels, y=[p.goodput_load for p in pools], name="load / SLO goodput"),
        ]
    )
    f3.add_hline(y=1.0, line_color="red", annotation_text="instability / SLO limit")
    f3.update_layout(
        title="Stability margin per pool (1 − utilization)", barmode="group", yaxis_title="fraction"
    )
    figs.append(f3)
    f4 = make_subplots(rows=1, cols=2, subplot_titles=("cost, $/h", "power, W"))
    f4.add_trace(
        go.Bar(x=labels, y=[p.cost_per_hour_usd or 0.0 for p in pools], name="$/h"), row=1, col=1
    )
    from perfmodel.cost.power import power_model

    watts = []
    for p in pools:
        pm = power_model(p.candidate.device)
        watts.append(pm.power_w(p.utilization) * p.devices if pm else 0.0)
    f4.add_trace(go.Bar(x=labels, y=watts, name="W"), row=1, col=2)
    f4.update_layout(title="Cost and power breakdown at the planned utilization", showlegend=False)
    figs.append(f4)
    return figs


def _table(rows: Sequence[Sequence[Any]], head: Sequence[str]) -> str:
    h = "".join(f"<th>{html.escape(str(x))}</th>" for x in head)
    b = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_fmt(x))}</td>" for x in r) + "</tr>" for r in rows
    )
    return f"<table><tr>{h}</tr>{b}</table>"


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:,.4g}"
    return "—" if x is None else str(x)


_STYLE = """body{font-family:sans-serif;margin:24px;max-width:1200px}
table{border-collapse:collapse;margin:8px 0}td,th{border:1px solid #ccc;padding:3px 8px;
font-size:13px;text-align:left}h1{font-size:22px}h2{font-size:18px;margin-top:28px}
.big{font-size:18px;background:#eef5ee;padding:10px;border-radius:6px}"""
_ERR = (
    "<script>window.addEventListener('error',function(e){document.body.setAttribute("
    "'data-js-error',String(e.message))});</script>"
)


def money(x: float | None) -> str:
    """A rent in $/h (``n/a`` without a price)."""
    return "n/a" if x is None else f"${x:,.2f}/h"


def pool_row(p: Any) -> list[Any]:
    """One pool of a fleet: device, count, instances, TP, role, req/s, utilization, margin,
    what bounds it and its rent (the report's and ``perfmodel plan``'s table)."""
    c = p.candidate
    util = p.utilization
    return [
        c.device.id, p.devices, p.instances, c.tp, c.role, p.rate_per_s,
        f"{util:.0%}", f"{1 - util:.0%}", c.limiter, money(p.cost_per_hour_usd),
    ]  # fmt: skip


def _pools_table(rec: Any) -> str:
    return _table(
        [
            [*pool_row(p), "; ".join(f"{f:.0%} of {b}" for b, f in p.buckets) or "all requests"]
            for p in rec.pools
        ],
        [
            "device",
            "count",
            "instances",
            "TP",
            "role",
            "req/s",
            "utilization",
            "margin to instability",
            "bound by",
            "cost",
            "requests served",
        ],
    )


def alternative_row(name: str, v: Any, missing: Any = None) -> list[Any]:
    """An alternative fleet: its name, rent (or ``infeasible``), devices and summary (or why
    there is none); ``missing`` stands for the devices of an infeasible one."""
    f = v.fleet
    if f is None:
        return [name, "infeasible", missing, v.reason]
    return [name, money(f.economics.cost_per_hour_usd), f.devices, f.summary]


def _alternative_rows(result: Any) -> list[list[Any]]:
    alt = [alternative_row(k, v) for k, v in sorted(result.best_single_device.items())]
    for name, v in (("colocated only", result.colocated_only), ("PD only", result.disaggregated)):
        if v is not None:
            alt.append(alternative_row(name, v))
    return alt


def _verification_table(result: Any, slo: dict[str, Any]) -> str:
    return (
        _table(
            [
                [
                    v.pools,
                    v.rate_per_s,
                    v.predicted_attainment,
                    v.simulated_attainment,
                    v.simulated_ttft_quantile_s * MS_PER_S,
                    v.simulated_tpot_quantile_s * MS_PER_S,
                    "yes" if v.meets_goal else "NO",
                    v.requests,
                ]
                for v in result.verification
            ],
            [
                "pools",
                "req/s",
                "predicted attainment",
                "simulated attainment",
                f"sim p{slo['percentile'] * 100:g} TTFT ms",
                f"sim p{slo['percentile'] * 100:g} TPOT ms",
                "meets goal",
                "requests",
            ],
        )
        if result.verification
        else "<p>not simulated</p>"
    )


def plan_report(result: PlanResult, inputs: PlanInputs, sweep: PlanSweep) -> str:
    """The report's HTML text (see the module docstring)."""
    import plotly.io as pio
    from plotly.offline import get_plotlyjs

    rec = result.recommendation
    e = rec.economics
    a = result.assumptions
    slo = a["slo"]
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>perfmodel plan</title>",
        f"<style>{_STYLE}</style><script>{get_plotlyjs()}</script></head><body>",
        _ERR,
        f"<h1>Provisioning plan: {html.escape(a['model'])}, {html.escape(a['workload'])} "
        f"workload, {a['rate_per_s']:g} req/s</h1>",
        f"<p>SLO p{slo['percentile'] * 100:g} TTFT ≤ {slo['ttft_ms']:g} ms, TPOT ≤ "
        f"{slo['tpot_ms']:g} ms, goal {slo['goal']:.0%}; headroom ×{a['headroom']:g}; engine: "
        f"{html.escape(str(a['engine']))}</p>",
        f"<p class='big'><b>Rent {html.escape(rec.summary)}</b>: {rec.devices} devices, "
        f"{money(e.cost_per_hour_usd)}"
        + (
            ""
            if e.cost_per_million_output_tokens_usd is None
            else f", ${e.cost_per_million_output_tokens_usd:.3f} per million output tokens"
        )
        + (
            ""
            if e.energy_j_per_output_token is None
            else f", {e.energy_j_per_output_token:.3g} J/token, {e.kwh_per_day:,.0f} kWh/day"
        )
        + f" (MILP {rec.status}, gap {_fmt(rec.gap)})</p>",
        _pools_table(rec),
        "<h2>Why</h2><ul>" + "".join(f"<li>{html.escape(w)}</li>" for w in result.why) + "</ul>",
    ]
    figs = _figures(result, inputs, sweep)
    titles = [
        "Cost vs rate",
        *["Latency vs rate" for _ in sweep.latency],
        "Stability margin",
        "Cost and energy",
    ]
    for t, f in zip(titles, figs, strict=True):
        parts.append(f"<h2>{t}</h2>")
        parts.append(pio.to_html(f, include_plotlyjs=False, full_html=False))
    alt = _alternative_rows(result)
    parts += [
        "<h2>Alternatives</h2>",
        _table(alt, ["fleet", "cost", "devices", "pools"]),
        "<h2>What would change the answer</h2>",
        _table(
            [
                [s.change, money(s.cost_per_hour_usd), s.devices, s.summary, s.same_mix]
                for s in result.sensitivity
            ],
            ["change", "cost", "devices", "fleet", "same mix"],
        ),
        "<ul>" + "".join(f"<li>{html.escape(f)}</li>" for f in result.price_flips) + "</ul>",
        "<h2>Simulated vs predicted</h2>",
        _verification_table(result, slo),
        "<h2>Assumptions and provenance</h2>",
        f"<pre>{html.escape(json.dumps(a, indent=1, default=str))}</pre>",
        "<h2>Configurations evaluated</h2>",
        _table(
            [
                [
                    c.label,
                    c.goodput_per_instance_per_s,
                    c.capacity_per_instance_per_s,
                    c.limiter,
                    c.kv_capacity_tokens,
                    c.decode_class,
                ]
                for c in result.candidates
            ],
            [
                "configuration",
                "goodput req/s",
                "service rate req/s",
                "bound",
                "KV tokens",
                "decode class",
            ],
        ),
        "</body></html>",
    ]
    return "\n".join(parts)
