"""``perfmodel phase stability``: stable / unstable / SLO-feasible regions of one instance."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cli import options as po
from cli.common import JsonOpt, echo_json, fail, handle_errors, progress, table, write_atomic
from cli.options import (
    DEFAULT_GOAL,
    DEFAULT_HARDWARE,
    DEFAULT_MAX_BATCHED_TOKENS,
    DEFAULT_MODEL,
    DEFAULT_SLO_PERCENTILE,
    DEFAULT_TPOT_SLO_MS,
    DEFAULT_TTFT_SLO_MS,
    DEFAULT_WORKLOAD,
    ArrivalCvOpt,
    ChunkSizeOpt,
    ForceOpt,
    GoalOpt,
    HardwareOpt,
    KvCapacityOpt,
    MaxBatchedTokensOpt,
    ModelOpt,
    SeedOpt,
    SloPercentileOpt,
    TpOpt,
    TpotSloOpt,
    TraceOpt,
    TtftSloOpt,
    WorkloadOpt,
    build_instance,
    build_slo,
    build_workload,
)

app = typer.Typer(help="Phase diagrams: where the system is stable.", no_args_is_help=True)


@app.command("stability")
@handle_errors
def stability_cmd(
    out: Annotated[Path, typer.Option(help="Output HTML file (self-contained).")],
    model: ModelOpt = DEFAULT_MODEL,
    hardware: HardwareOpt = DEFAULT_HARDWARE,
    tp: TpOpt = 1,
    workload: WorkloadOpt = DEFAULT_WORKLOAD,
    trace: TraceOpt = None,
    arrival_cv: ArrivalCvOpt = 1.0,
    ttft_slo_ms: TtftSloOpt = DEFAULT_TTFT_SLO_MS,
    tpot_slo_ms: TpotSloOpt = DEFAULT_TPOT_SLO_MS,
    slo_percentile: SloPercentileOpt = DEFAULT_SLO_PERCENTILE,
    goal: GoalOpt = DEFAULT_GOAL,
    kv_capacity_tokens: KvCapacityOpt = None,
    max_batched_tokens: MaxBatchedTokensOpt = DEFAULT_MAX_BATCHED_TOKENS,
    chunk_size: ChunkSizeOpt = None,
    output_tokens: Annotated[
        str | None,
        typer.Option(help="Mean output lengths of the first panel (default: 0.25..4 × E[o])."),
    ] = None,
    kv_grid_tokens: Annotated[
        str | None,
        typer.Option(help="KV capacities of the second panel (default: geometric to M)."),
    ] = None,
    rates: Annotated[int, typer.Option(help="Arrival rates per panel (geometric).")] = 720,
    sim_rows: Annotated[int, typer.Option(help="Rows per panel checked by simulation.")] = 3,
    sim_requests: Annotated[
        int, typer.Option(help="Requests per simulated point (0: no simulation).")
    ] = 8000,
    seed: SeedOpt = 0,
    force: ForceOpt = False,
    dtype: po.DtypeOpt = None,
    act_dtype: po.ActDtypeOpt = None,
    kv_dtype: po.KvDtypeOpt = None,
    engine: po.EngineOpt = po.DEFAULT_ENGINE,
    workers: po.WorkersOpt = None,
    scheduler: po.SchedulerOpt = None,
    json_out: bool = JsonOpt,
) -> None:
    """Arrival rate × mean output length and × KV capacity: regimes, boundary, simulation."""
    from cli.validate import parse_list
    from reports.stability_plot import stability_html
    from reports.stability_sweep import (
        DEFAULT_KV_POINTS,
        DEFAULT_OUTPUT_SCALES,
        DEFAULT_SIM_LOADS,
        stability_phase,
        sweep_steps,
    )

    if out.exists() and not force:
        raise fail(f"{out} exists; pass --force to overwrite it")
    if not out.parent.is_dir():
        raise fail(f"directory {out.parent} does not exist")
    if rates < 2:
        raise fail(f"--rates must be >= 2, got {rates}")
    if sim_rows < 0 or sim_requests < 0:
        raise fail("--sim-rows and --sim-requests must be >= 0")
    for flag, v in (("--ttft-slo-ms", ttft_slo_ms), ("--tpot-slo-ms", tpot_slo_ms)):
        if not v > 0:
            raise fail(f"{flag} must be a positive number of milliseconds, got {v}")
    outs = None if output_tokens is None else parse_list("output_tokens", output_tokens)
    kvs = None if kv_grid_tokens is None else parse_list("kv_grid_tokens", kv_grid_tokens)
    slo = build_slo(ttft_slo_ms, tpot_slo_ms, slo_percentile, goal)
    inst = build_instance(
        model, hardware, tp, dtype=dtype, act_dtype=act_dtype, kv_dtype=kv_dtype, engine=engine
    )
    m, d, plan = inst.model, inst.device, inst.plan
    w = build_workload(workload, trace, arrival_cv)
    steps = sweep_steps(
        output_rows=len(outs) if outs else len(DEFAULT_OUTPUT_SCALES),
        kv_rows=len(kvs) if kvs else DEFAULT_KV_POINTS,
        sim_rows=sim_rows,
        sim_loads=len(DEFAULT_SIM_LOADS),
        sim_requests=sim_requests,
    )
    with progress(steps, "sweeping") as tick:
        phase = stability_phase(
            m, d, plan, w, slo=slo, mean_output_tokens=outs,
            kv_capacities_tokens=[int(k) for k in kvs] if kvs else None,
            kv_capacity_tokens=kv_capacity_tokens, max_batched_tokens=max_batched_tokens,
            chunk_size=chunk_size, rates=rates, sim_rows=sim_rows, sim_requests=sim_requests,
            seed=seed, progress=tick, engine=inst.engine, workers=workers, scheduler=scheduler,
        )  # fmt: skip
    write_atomic(out, stability_html(phase), force=force)
    if json_out:
        from reports.written import Engined

        echo_json(Engined(phase, inst.engine_keys()))
        return
    typer.echo(f"engine: {inst.engine_accuracy}")
    typer.echo(f"{m.id} on {plan.tp}x {d.id}, workload {w.name}; wrote {out}")
    for p in phase.panels:
        rows = [
            [
                f"{r.y:,.0f}",
                f"{r.service_rate_per_s:.3g}",
                r.binding if r.largest_request_fits else "largest request > KV",
                f"{r.goodput_per_s:.3g}" if r.slo_feasible else "infeasible",
                f"{r.guaranteed_rate_per_s:.3g}",
            ]
            for r in p.rows
        ]
        typer.echo(f"\n{p.y_label}: stability boundary μ and goodput (req/s)")
        typer.echo(table(rows, [p.y_label, "μ", "bound", "goodput", "μ(1−δ)"]))
        if p.points:
            agree = sum(pt.agrees for pt in p.points)
            near = [pt for pt in p.points if abs(pt.utilization - 1) <= 0.1 + 1e-9]
            typer.echo(
                f"simulated points: {agree}/{len(p.points)} agree with the formula "
                f"({sum(pt.agrees for pt in near)}/{len(near)} within ±10 % of the boundary)"
            )
