"""``perfmodel pd``: prefill/decode disaggregation plans and phase diagrams."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from cli import options as po
from cli.common import JsonOpt, echo_json, fail, handle_errors, progress, table, write_atomic
from cli.options import (
    DEFAULT_MODEL,
    DEFAULT_SLO_PERCENTILE,
    DEFAULT_TPOT_SLO_MS,
    DEFAULT_TTFT_SLO_MS,
    DEFAULT_WORKLOAD,
    SloPercentileOpt,
)

app = typer.Typer(
    help="Prefill/decode disaggregation: P:D ratio and parallelism under TTFT/TPOT SLOs.",
    no_args_is_help=True,
)

#: a phase diagram wider than this many columns is printed as a map of regime symbols
TABLE_MAX_COLUMNS = 6

HwOpt = Annotated[str, typer.Option(help="Device id or TOML path (prefill, and decode).")]
DecHwOpt = Annotated[
    str | None, typer.Option(help="Device for decode instances (default: --hardware).")
]
WorkloadOpt = Annotated[
    str, typer.Option(help="Built-in workload: chat, code or sharegpt (--trace overrides it).")
]
TraceOpt = Annotated[
    Path | None, typer.Option(help="Trace CSV (Azure or input_tokens,output_tokens).")
]
DtypeOpt = Annotated[str, typer.Option(help="Weight/math dtype (bf16, fp16, fp8).")]
KvOpt = Annotated[str, typer.Option(help="KV link: auto, scale-up or scale-out.")]
PrefillProfOpt = Annotated[
    list[str] | None,
    typer.Option(
        metavar="FILE|DEVICE:OP",
        help="Calibrated prefill cost profile (TOML path or device:op; provenance op "
        "<model>_prefill_tp<N>); repeat per TP. Only the TPs given are planned.",
    ),
]
DecodeProfOpt = Annotated[
    list[str] | None,
    typer.Option(
        metavar="FILE|DEVICE:OP",
        help="Calibrated decode cost profile (TOML path or device:op; provenance op "
        "<model>_decode_tp<N>); repeat per TP. Only the TPs given are planned.",
    ),
]
KvCapOpt = Annotated[
    list[str] | None,
    typer.Option(
        metavar="N|tpK=N",
        help="Measured KV capacity of a decode instance, tokens: N (every TP) or tp<K>=N "
        "(TP K); repeatable. Default: from memory_fit.",
    ),
]


def _workload(workload: str, trace: Path | None) -> Any:
    from perfmodel.pd.models import planner_lengths
    from perfmodel.workload.presets import Workload
    from perfmodel.workload.trace import load_trace

    if trace is not None:
        return Workload.from_trace(load_trace(trace))
    return Workload(workload, planner_lengths(workload))


def _slo(ttft_ms: float, tpot_ms: float, percentile: float) -> Any:
    from perfmodel.units import from_ms
    from perfmodel.workload.slo import SLO

    for name, v in (("--ttft-slo-ms", ttft_ms), ("--tpot-slo-ms", tpot_ms)):
        if not v > 0:
            raise fail(f"{name} must be a positive number of milliseconds, got {v}")
    return SLO(from_ms(ttft_ms), from_ms(tpot_ms), percentile=percentile)


def _kv_capacities(specs: list[str] | None, device_id: str) -> dict[tuple[str, int], int] | None:
    """``--decode-kv-capacity-tokens`` values by ``(device id, TP)``."""
    from solvers.pd.plan import TP_CANDIDATES

    if not specs:
        return None
    out: dict[tuple[str, int], int] = {}
    for spec in specs:
        tp_text, sep, n_text = spec.strip().partition("=")
        if not sep:
            tp_text, n_text = "", tp_text
        try:
            n = int(n_text.replace("_", "").replace(",", ""))
            tps = [int(tp_text.removeprefix("tp"))] if sep else list(TP_CANDIDATES)
        except ValueError:
            raise fail(
                f"--decode-kv-capacity-tokens takes N or tp<K>=N (e.g. tp1=66144), got {spec!r}"
            ) from None
        if n < 1 or min(tps) < 1:
            raise fail(f"--decode-kv-capacity-tokens needs a positive TP and tokens, got {spec!r}")
        out |= {(device_id, tp): n for tp in tps}
    return out


def _phase_profiles(
    prefill: list[str] | None,
    decode: list[str] | None,
    *,
    model_id: str,
    prefill_device: str,
    decode_device: str,
    dtype: str,
) -> Any:
    """``--prefill-profile`` / ``--decode-profile`` as ``(phase, device id, TP) -> profile``."""
    from perfmodel.pd.profiles import load_phase_profiles

    if not prefill and not decode:
        return None
    out = load_phase_profiles(
        prefill or [], phase="prefill", model_id=model_id, device_id=prefill_device, dtype=dtype
    )
    return out | load_phase_profiles(
        decode or [], phase="decode", model_id=model_id, device_id=decode_device, dtype=dtype
    )


def _plan_text(p: Any) -> str:
    from perfmodel.units import ms

    lines = [
        f"{p.model}, workload {p.workload}, {p.rate_per_s:g} req/s, p{p.slo.percentile * 100:g} "
        f"TTFT <= {ms(p.slo.ttft_s):g} ms and TPOT <= {ms(p.slo.tpot_s):g} ms; KV over {p.link}",
        "",
    ]
    rows = [
        [a.phase, a.config.label, a.instances, a.gpus, a.goodput_per_instance_per_s, a.limiter]
        for a in (*p.prefill, *p.decode)
    ]
    lines.append(table(rows, ["phase", "config", "instances", "GPUs", "goodput/inst", "limiter"]))
    lines += [
        "",
        f"P:D = {p.prefill_instances}:{p.decode_instances} instances "
        f"({p.gpu_ratio:.2f} prefill GPUs per decode GPU); {p.gpus} GPUs, cost {p.cost:g} "
        f"{p.cost_unit}",
        f"goodput {p.capacity_rate_per_s:.3g} req/s = {p.goodput_per_gpu:.3g} req/s per GPU; "
        f"binding: {p.binding}",
        "",
        table(
            [
                [c.name, c.required, c.provided, f"{c.slack:+.1%}", "*" if c.binding else ""]
                for c in p.constraints
            ],
            ["constraint", "required", "provided", "slack", "binding"],
        ),
        "",
        p.verdict,
    ]
    if p.colocated is not None:
        c = p.colocated
        lines.append(
            f"colocated baseline: {c.note}"
            + (f"; it needs {p.colocated_gpus} GPUs for this rate" if p.colocated_gpus else "")
        )
    lines.append(f"solver {p.solver} ({p.status}), {p.solve_s:.2f} s")
    return "\n".join(lines)


@app.command("plan")
@handle_errors
def plan_cmd(
    model: po.ModelOpt = DEFAULT_MODEL,
    hardware: HwOpt = "h100-sxm",
    decode_hardware: DecHwOpt = None,
    workload: WorkloadOpt = DEFAULT_WORKLOAD,
    trace: TraceOpt = None,
    rate_per_s: Annotated[float, typer.Option(help="Arrival rate, requests/s.")] = 10.0,
    ttft_slo_ms: po.TtftSloOpt = DEFAULT_TTFT_SLO_MS,
    tpot_slo_ms: po.TpotSloOpt = DEFAULT_TPOT_SLO_MS,
    slo_percentile: SloPercentileOpt = DEFAULT_SLO_PERCENTILE,
    max_gpus: Annotated[int | None, typer.Option(help="Most GPUs the plan may use.")] = None,
    price_per_hour_usd: Annotated[
        float | None, typer.Option(help="Price of a --hardware GPU; minimize $/h instead.")
    ] = None,
    decode_price_per_hour_usd: Annotated[
        float | None, typer.Option(help="Price of a --decode-hardware GPU.")
    ] = None,
    kv_link: KvOpt = "auto",
    dtype: DtypeOpt = "bf16",
    baseline: Annotated[bool, typer.Option(help="Compare with colocated serving.")] = True,
    prefill_profile: PrefillProfOpt = None,
    decode_profile: DecodeProfOpt = None,
    decode_kv_capacity_tokens: KvCapOpt = None,
    ep: po.EpOpt = 1,
    dp: po.DpOpt = 1,
    engine: po.EngineOpt = po.DEFAULT_ENGINE,
    json_out: bool = JsonOpt,
) -> None:
    """Least-cost prefill/decode plan for a rate under TTFT and TPOT SLOs."""
    from hardware.device import load_device
    from perfmodel.model import load_model
    from solvers.pd.plan import plan_pd

    w = _workload(workload, trace)
    slo = _slo(ttft_slo_ms, tpot_slo_ms, slo_percentile)
    m = load_model(model)
    pdev = load_device(hardware)
    ddev = load_device(decode_hardware) if decode_hardware else pdev
    prices = None
    if price_per_hour_usd is not None or decode_price_per_hour_usd is not None:
        prices = {}
        for dev, price in ((pdev, price_per_hour_usd), (ddev, decode_price_per_hour_usd)):
            if price is not None:
                if not price > 0:
                    raise fail("prices per hour must be positive")
                prices[dev.id] = price
    profiles = _phase_profiles(
        prefill_profile,
        decode_profile,
        model_id=m.id,
        prefill_device=pdev.id,
        decode_device=ddev.id,
        dtype=dtype,
    )
    p = plan_pd(
        m,
        w,
        slo,
        rate_per_s,
        prefill_devices=[pdev],
        decode_devices=[ddev],
        dtype=dtype,
        kv_dtype=dtype,
        placement=kv_link,
        max_gpus=max_gpus,
        prices=prices,
        baseline=baseline,
        profiles=profiles,
        kv_capacity_tokens=_kv_capacities(decode_kv_capacity_tokens, ddev.id),
        ep=ep,
        dp=dp,
        engine=engine,
    )
    eng_json, eng_lines = po.engines_for([pdev, ddev], dtype, engine)
    if json_out:
        from reports.written import Engined

        echo_json(Engined(p, eng_json))
        return
    typer.echo("\n".join(eng_lines))
    typer.echo(_plan_text(p))
    if profiles and p.colocated is not None:
        typer.echo(
            "note: the disaggregated plan is costed by the given profiles, the colocated "
            "baseline by the roofline (the queueing layer takes no calibrated profile)"
        )


@app.command("phase")
@handle_errors
def phase_cmd(
    out: Annotated[Path, typer.Option(help="Output HTML file.")],
    model: po.ModelOpt = DEFAULT_MODEL,
    hardware: HwOpt = "h100-sxm",
    decode_hardware: DecHwOpt = None,
    workload: WorkloadOpt = DEFAULT_WORKLOAD,
    trace: TraceOpt = None,
    ttft_slo_ms: po.TtftSloOpt = DEFAULT_TTFT_SLO_MS,
    tpot_slo_ms: po.TpotSloOpt = DEFAULT_TPOT_SLO_MS,
    slo_percentile: SloPercentileOpt = DEFAULT_SLO_PERCENTILE,
    inputs: Annotated[str, typer.Option(help="Input lengths (tokens), comma-separated.")] = (
        "128,512,2048,8192"
    ),
    outputs: Annotated[str, typer.Option(help="Output lengths (tokens), comma-separated.")] = (
        "32,128,512,2048"
    ),
    slo_scales: Annotated[
        str, typer.Option(help="Multipliers of both SLO targets for the SLO sweep.")
    ] = "0.25,0.5,1,2,4",
    grid: Annotated[
        int | None,
        typer.Option(
            help="Points per axis of both panels, geometric from the least to the greatest "
            "of --inputs, --outputs and --slo-scales (20: 20 x 20 cells each)."
        ),
    ] = None,
    dtype: DtypeOpt = "bf16",
    force: Annotated[bool, typer.Option(help="Overwrite --out.")] = False,
    engine: po.EngineOpt = po.DEFAULT_ENGINE,
    workers: po.WorkersOpt = None,
    scheduler: po.SchedulerOpt = None,
    json_out: bool = JsonOpt,
) -> None:
    """Phase diagrams of the P:D ratio and disaggregation gain (lengths and SLO sweeps)."""
    from cli.validate import geometric_axis, parse_list
    from hardware.device import load_device
    from perfmodel.model import load_model
    from reports.pd_figure import phase_figure_html
    from reports.pd_phase_run import phase_sweeps

    if out.exists() and not force:
        raise fail(f"{out} exists; pass --force to overwrite it")
    w = _workload(workload, trace)
    slo = _slo(ttft_slo_ms, tpot_slo_ms, slo_percentile)
    axes = {k: parse_list(k, v) for k, v in (("inputs", inputs), ("outputs", outputs),
                                            ("slo_scales", slo_scales))}  # fmt: skip
    if grid is not None:
        axes = {k: geometric_axis(k, v, grid) for k, v in axes.items()}
    ins, outs = [int(v) for v in axes["inputs"]], [int(v) for v in axes["outputs"]]
    scales = axes["slo_scales"]
    m = load_model(model)
    pdev = load_device(hardware)
    ddev = [load_device(decode_hardware)] if decode_hardware else None
    total = len(ins) * len(outs) + len(scales) ** 2
    with progress(total, "sweeping") as tick:
        sweeps = phase_sweeps(
            m,
            [pdev],
            slo,
            w,
            inputs=ins,
            outputs=outs,
            slo_scales=scales,
            decode_devices=ddev,
            dtype=dtype,
            kv_dtype=dtype,
            progress=tick,
            engine=engine,
            workers=workers,
            scheduler=scheduler,
        )
    lens, slos = sweeps.lengths, sweeps.slo
    write_atomic(out, phase_figure_html([lens, slos]), force=force)
    eng_json, eng_lines = po.engines_for([pdev, *(ddev or [])], dtype, engine)
    if json_out:
        from reports.written import Engined, Written

        echo_json(Engined(Written(out, sweeps), eng_json))
        return
    typer.echo("\n".join(eng_lines))
    for d in (lens, slos):
        typer.echo(
            f"\n{d.model} on {d.device}: {d.y_label} (rows) x {d.x_label} (cols), {d.context}"
        )
        if len(d.xs) > TABLE_MAX_COLUMNS:  # a table of cells would not fit a terminal
            typer.echo("\n".join(d.regime_map()))
            typer.echo(d.summary(gains=len(d.ys) <= TABLE_MAX_COLUMNS))
            continue
        rows = []
        for y in d.ys:
            row: list[Any] = [d.shown(y)]
            for x in d.xs:
                c = d.cell(x, y)
                row.append(
                    f"{c.regime[:5]} {c.gain:.2f}x P:D {c.gpu_ratio:.2f}"
                    if c.gain and c.gpu_ratio is not None
                    else c.regime
                )
            rows.append(row)
        heads = [d.shown(x) for x in d.xs]
        typer.echo(table(rows, [d.y_label + " \\ " + d.x_label, *heads]))
        typer.echo(d.summary())
    typer.echo(f"\nwrote {out}")
