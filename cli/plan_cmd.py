"""``perfmodel plan``: the provisioning recommendation — fleet mix at least cost under SLOs."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

import typer

from cli import options as po
from cli.common import JsonOpt, echo_json, fail, handle_errors, table, write_atomic
from cli.options import (
    DEFAULT_GOAL,
    DEFAULT_MAX_BATCHED_TOKENS,
    DEFAULT_MODEL,
    DEFAULT_SLO_PERCENTILE,
    DEFAULT_TPOT_SLO_MS,
    DEFAULT_TTFT_SLO_MS,
    DEFAULT_WORKLOAD,
    ForceOpt,
    GoalOpt,
    MaxBatchedTokensOpt,
    ModelOpt,
    SloPercentileOpt,
    TpotSloOpt,
    TraceOpt,
    TtftSloOpt,
    WorkloadOpt,
)

#: planning needs a rate; 50 req/s of chat keeps several instances busy on most devices
DEFAULT_RATE_PER_S = 50.0

DevicesOpt = Annotated[
    str | None,
    typer.Option(help="Comma-separated device ids or TOML paths (default: every priced device)."),
]
CapOpt = Annotated[
    list[str] | None,
    typer.Option(metavar="DEVICE=N", help="Availability cap: at most N devices of a type."),
]


def _caps(items: list[str] | None) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in items or []:
        dev, sep, n = s.partition("=")
        if not sep or not dev or not n.strip().isdigit():
            raise fail(f"--max-devices takes DEVICE=N with N a whole number, got {s!r}")
        out[dev.strip()] = int(n)
    return out


def _devices(spec: str | None, prices: Any) -> tuple[Any, ...]:
    from hardware.device import catalog_ids, load_device

    if spec:
        ids = [s.strip() for s in spec.split(",") if s.strip()]
        if not ids:
            raise fail("--devices is empty")
        return tuple(load_device(i) for i in ids)
    devs = [load_device(i) for i in catalog_ids()]
    priced = tuple(d for d in devs if (prices.price(d.id) or d.price_per_hour_usd) is not None)
    if not priced:
        raise fail("no catalog device has a price; give --devices or --prices")
    return priced


def _workload(workload: str, trace: Path | None) -> Any:
    from perfmodel.workload.presets import Workload
    from perfmodel.workload.trace import load_trace
    from solvers.fleet.candidates import planning_workload

    if trace is not None:
        return Workload.from_trace(load_trace(trace))
    return planning_workload(workload)


def _price_book(devices: str | None, prices: Path | None, max_devices: list[str] | None) -> Any:
    """The planned devices and their price book: catalog prices, --prices, --max-devices."""
    from perfmodel.cost.prices import PriceBook, catalog_prices, load_prices

    user = load_prices(prices) if prices is not None else None
    devs = _devices(devices, user or PriceBook())
    book = catalog_prices(devs)
    if user is not None:
        book = book.override(user)
    caps = _caps(max_devices)
    unknown = sorted(set(caps) - {d.id for d in devs})
    if unknown:
        raise fail(f"--max-devices names {', '.join(unknown)}, not among the planned devices")
    return devs, book.with_caps(caps)


@handle_errors
def plan_cmd(
    model: ModelOpt = DEFAULT_MODEL,
    workload: WorkloadOpt = DEFAULT_WORKLOAD,
    trace: TraceOpt = None,
    rate_per_s: Annotated[
        float | None,
        typer.Option(
            help=f"Arrival rate, req/s (default: the trace's, else {DEFAULT_RATE_PER_S:g})."
        ),
    ] = None,
    ttft_slo_ms: TtftSloOpt = DEFAULT_TTFT_SLO_MS,
    tpot_slo_ms: TpotSloOpt = DEFAULT_TPOT_SLO_MS,
    slo_percentile: SloPercentileOpt = DEFAULT_SLO_PERCENTILE,
    goal: GoalOpt = DEFAULT_GOAL,
    devices: DevicesOpt = None,
    prices: Annotated[
        Path | None,
        typer.Option(help="Prices: TOML or CSV of device -> $/h [, max_devices, min_devices]."),
    ] = None,
    max_devices: CapOpt = None,
    engine: po.EngineOpt = po.DEFAULT_ENGINE,
    allow_pd: Annotated[
        bool, typer.Option("--allow-pd/--no-pd", help="Consider prefill/decode roles.")
    ] = True,
    headroom: Annotated[
        float, typer.Option(help="Burst factor: plan capacity for rate x headroom.")
    ] = 1.0,
    buckets: Annotated[
        int,
        typer.Option(
            help="Split requests into N input-length buckets routed to pools (Mélange); "
            "colocated pools only."
        ),
    ] = 1,
    max_batched_tokens: MaxBatchedTokensOpt = DEFAULT_MAX_BATCHED_TOKENS,
    out: Annotated[Path | None, typer.Option(help="Write a self-contained HTML report.")] = None,
    deploy: Annotated[
        Path | None, typer.Option(help="Write the engines' launch arguments to this file.")
    ] = None,
    verify: Annotated[
        bool, typer.Option(help="Simulate each pool at its share of the rate (slower).")
    ] = False,
    slo_sensitivity: Annotated[
        bool,
        typer.Option(help="Also re-plan with both SLO targets x0.8 and x1.25 (on with --out)."),
    ] = False,
    cache: Annotated[
        bool, typer.Option("--cache/--no-cache", help="Reuse cached configuration evaluations.")
    ] = True,
    time_limit_s: Annotated[float, typer.Option(help="MILP time limit per solve, s.")] = 10.0,
    force: ForceOpt = False,
    json_out: bool = JsonOpt,
) -> None:
    """Which devices to rent, how many, configured how, at what $/h -- and why not others."""
    t0 = time.perf_counter()
    from perfmodel.model import load_model
    from perfmodel.units import S_PER_MS
    from perfmodel.workload.slo import SLO
    from solvers.fleet.plan import PlanInputs, plan_fleet

    if max_batched_tokens < 1:
        raise fail(f"--max-batched-tokens must be >= 1, got {max_batched_tokens}")
    for p, what in ((out, "--out"), (deploy, "--deploy")):
        if p is not None and p.exists() and not force:
            raise fail(f"{p} exists; pass --force to overwrite it ({what})")
    m = load_model(model)
    devs, book = _price_book(devices, prices, max_devices)
    w = _workload(workload, trace)
    rate = rate_per_s
    if rate is None:
        rate = w.trace.rate_per_s if w.trace is not None else DEFAULT_RATE_PER_S
    slo = SLO(ttft_slo_ms * S_PER_MS, tpot_slo_ms * S_PER_MS, slo_percentile, goal)
    inputs = PlanInputs(
        m, w, slo, rate, devs, book, headroom=headroom, allow_pd=allow_pd, engine=engine,
        max_batched_tokens=max_batched_tokens, time_limit_s=time_limit_s, use_cache=cache,
        buckets=buckets,
    )  # fmt: skip
    result = plan_fleet(inputs)
    from solvers.fleet.candidates import compute_dtype

    eng_json, eng_lines = po.engines_for(
        devs, {d.id: compute_dtype(d) or "bf16" for d in devs}, engine
    )
    if slo_sensitivity or out is not None:
        from dataclasses import replace

        from solvers.fleet.whatif import slo_sensitivity as slo_steps

        extra = slo_steps(inputs, result.recommendation)
        result = replace(result, sensitivity=(*result.sensitivity, *extra))
    if verify or out is not None:
        from solvers.fleet.verify import verify_fleet

        result = verify_fleet(result, inputs)
    sweep = None
    if out is not None:
        from reports.plan_report import plan_report, rate_sweep

        sweep = rate_sweep(result, inputs)
        write_atomic(out, plan_report(result, inputs, sweep), force=force)
    if deploy is not None:
        from reports.plan_deploy import deploy_config

        write_atomic(deploy, deploy_config(result, model_sources=m.sources), force=force)
    elapsed = time.perf_counter() - t0
    if json_out:
        from reports.plan_deploy import PlanReport
        from reports.written import Engined

        echo_json(Engined(PlanReport(result, m.sources, elapsed), eng_json))
        return
    typer.echo("\n".join(eng_lines))
    _print(result, rate, elapsed, out, deploy)


def _print(result: Any, rate: float, elapsed: float, out: Path | None, deploy: Path | None) -> None:
    from reports.plan_report import alternative_row, money, pool_row

    a = result.assumptions
    rec = result.recommendation
    e = rec.economics
    slo = a["slo"]
    typer.echo(
        f"{a['model']}, {a['workload']} workload, {rate:g} req/s (x{a['headroom']:g} headroom), "
        f"p{slo['percentile'] * 100:g} TTFT <= {slo['ttft_ms']:g} ms, TPOT <= {slo['tpot_ms']:g} "
        f"ms, goal {slo['goal']:.0%}"
    )
    cost = money(e.cost_per_hour_usd)
    per_m = e.cost_per_million_output_tokens_usd
    typer.echo(
        f"recommendation: {rec.summary}: {rec.devices} devices, {cost}"
        + ("" if per_m is None else f", ${per_m:.3f}/M output tokens")
        + (
            ""
            if e.energy_j_per_output_token is None
            else f", {e.energy_j_per_output_token:.3g} J/token, {e.kwh_per_day:,.0f} kWh/day"
        )
    )
    rows = [pool_row(p) for p in rec.pools]
    typer.echo(
        table(
            rows,
            ["device", "count", "inst", "tp", "role", "req/s", "util", "margin", "bound", "cost"],
        )
    )
    typer.echo(f"solver: {rec.status}, gap {rec.gap if rec.gap is not None else 'n/a'}")
    alt = [alternative_row(k, v, "-") for k, v in sorted(result.best_single_device.items())]
    typer.echo("best fleet of a single device type:")
    typer.echo(table(alt, ["device", "cost", "devices", "fleet"]))
    for w in result.why:
        typer.echo(f"  why: {w}")
    for s in result.sensitivity:
        typer.echo(f"  if {s.change}: {money(s.cost_per_hour_usd)}, {s.summary}")
    for f in result.price_flips:
        typer.echo(f"  price flip: {f}")
    for v in result.verification:
        typer.echo(f"  simulated: {v.summary}")
    if out is not None:
        typer.echo(f"report: {out}")
    if deploy is not None:
        typer.echo(f"launch arguments: {deploy}")
    typer.echo(f"({elapsed:.2f} s)")
