"""``perfmodel capacity`` and ``perfmodel simulate``: stability, latency, goodput, sizing."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from cli.common import JsonOpt, echo_json, fail, handle_errors, table
from perfmodel.step.instance import Instance
from perfmodel.units import MS_PER_S, from_ms

DEFAULT_MODEL = "llama-3.1-8b"
DEFAULT_HARDWARE = "h100-sxm"

ModelOpt = Annotated[str, typer.Option(help="Model id or config.json path.")]
HwOpt = Annotated[str, typer.Option(help="Device id or TOML path.")]
TpOpt = Annotated[int, typer.Option(help="Tensor-parallel degree of one instance.")]
PpOpt = Annotated[
    int, typer.Option(help="Pipeline-parallel stages of one instance (devices = tp x pp).")
]
WlOpt = Annotated[str, typer.Option(help="Built-in workload: chat or code.")]
TraceOpt = Annotated[
    Path | None, typer.Option(help="Trace CSV (Azure or input_tokens,output_tokens[,arrival_s]).")
]
RateOpt = Annotated[
    float | None, typer.Option(help="Arrival rate, requests/s (default: the trace's, or 0.7·μ).")
]
CvOpt = Annotated[float, typer.Option(help="Inter-arrival CV (1 = Poisson, >1 bursty).")]
KvOpt = Annotated[
    int | None, typer.Option(help="KV capacity in tokens (default: from the memory model).")
]
BudgetOpt = Annotated[
    int, typer.Option(help="Token budget per iteration (vLLM max_num_batched_tokens).")
]
ChunkOpt = Annotated[
    int | None, typer.Option(help="Largest prefill chunk per request (default: budget).")
]


def _setup(
    model: str,
    hardware: str,
    tp: int,
    workload: str,
    trace: Path | None,
    cv: float,
    pp: int = 1,
) -> tuple[Any, Any, Any, Any]:
    from hardware.device import load_device
    from perfmodel.model import load_model
    from perfmodel.plan import ParallelPlan, check_pp
    from perfmodel.workload.presets import Workload, preset
    from perfmodel.workload.trace import load_trace

    if tp < 1:
        raise fail(f"--tp must be a positive integer, got {tp}")
    if pp < 1:
        raise fail(f"--pp must be a positive integer, got {pp}")
    if trace is not None and cv != 1.0:
        raise fail(
            "--arrival-cv does nothing with --trace (the trace's own arrival times set the "
            "burstiness); drop one of them"
        )
    m = load_model(model)
    d = load_device(hardware)
    check_pp(m, pp)  # pp <= layers (SpecError: exit 2)
    plan = ParallelPlan(tp=tp, pp=pp)
    w = Workload.from_trace(load_trace(trace)) if trace else preset(workload, arrival_cv=cv)
    return m, d, plan, w


#: Most engine iterations a simulation may need before it is refused up front (each costs
#: 20 µs - 1 ms of wall time); ``perfmodel --no-limits`` lifts it.
MAX_SIM_ITERATIONS = 2_000_000


def _check_sim_work(n_requests: int, lengths: Any, max_batched_tokens: int) -> None:
    """Refuse a simulation whose iterations alone (every token passes through an iteration
    of at most ``max_batched_tokens``) are over the limit."""
    from cli.validate import no_limits

    tokens = lengths.mean_input_tokens + lengths.mean_output_tokens
    est = n_requests * tokens / max_batched_tokens
    if est > MAX_SIM_ITERATIONS and not no_limits():
        raise fail(
            f"this simulation needs at least {est:.3g} engine iterations ({n_requests} "
            f"requests x {tokens:.0f} tokens / --max-batched-tokens {max_batched_tokens}), "
            f"over the limit {MAX_SIM_ITERATIONS:,}; raise --max-batched-tokens, lower "
            "--requests, or pass `perfmodel --no-limits ...`"
        )


def _ms(x: float) -> float:
    return x * MS_PER_S


@handle_errors
def capacity_cmd(
    model: ModelOpt = DEFAULT_MODEL,
    hardware: HwOpt = DEFAULT_HARDWARE,
    tp: TpOpt = 1,
    pp: PpOpt = 1,
    workload: WlOpt = "chat",
    trace: TraceOpt = None,
    rate_per_s: RateOpt = None,
    arrival_cv: CvOpt = 1.0,
    ttft_slo_ms: Annotated[float, typer.Option(help="TTFT target, ms.")] = 500.0,
    tpot_slo_ms: Annotated[float, typer.Option(help="TPOT target, ms.")] = 50.0,
    slo_percentile: Annotated[float, typer.Option(help="Percentile the targets apply to.")] = 0.9,
    goal: Annotated[float, typer.Option(help="Fraction of requests that must meet both.")] = 0.9,
    target_utilization: Annotated[float, typer.Option(help="Sizing headroom: λ/(N·μ).")] = 0.8,
    kv_capacity_tokens: KvOpt = None,
    max_batched_tokens: BudgetOpt = 8192,
    chunk_size: ChunkOpt = None,
    json_out: bool = JsonOpt,
) -> None:
    """Service rate μ and its binding bound, stability, latency, goodput, instances needed."""
    from perfmodel.serving import goodput as q_goodput
    from perfmodel.serving import remedy
    from perfmodel.serving import service as q
    from perfmodel.workload.slo import SLO

    m, d, plan, w = _setup(model, hardware, tp, workload, trace, arrival_cv, pp)
    sr = q.service_rate(
        Instance(m, d, plan),
        w,
        kv_capacity_tokens=kv_capacity_tokens,
        max_batched_tokens=max_batched_tokens,
        chunk_size=chunk_size,
    )
    rate = (
        rate_per_s
        if rate_per_s is not None
        else (w.trace.rate_per_s if w.trace is not None else 0.7 * sr.rate_per_s)
    )
    st = q.stability(sr, rate)
    slo = SLO(from_ms(ttft_slo_ms), from_ms(tpot_slo_ms), slo_percentile, goal)
    lat = q.latency(sr, rate)
    gp = q_goodput.goodput(sr, slo)
    size = q_goodput.instances_needed(
        sr,
        rate,
        target_utilization=target_utilization,
        goodput_per_instance_per_s=gp.rate_per_s if gp.feasible else None,
    )
    ok = remedy.practical(gp, sr.rate_per_s)
    change = (
        None
        if ok
        else remedy.cheapest_change(
            m,
            d,
            plan,
            w,
            slo,
            rate,
            max_batched_tokens=sr.max_batched_tokens,
            target_utilization=target_utilization,
        )
    )
    verdict = "feasible" if ok else remedy.explain_infeasible(gp, sr.rate_per_s, change)
    out = {
        "slo_feasible": ok,
        "slo_verdict": verdict,
        "change": change.to_dict() if change else None,
        "model": m.id,
        "hardware": d.id,
        "tp": plan.tp,
        "pp": plan.pp,
        "devices_per_instance": plan.devices,
        "workload": w.name,
        "rate_per_s": rate,
        "service_rate_per_s": sr.rate_per_s,
        "compute_rate_per_s": sr.compute_rate_per_s,
        "memory_rate_per_s": sr.memory_rate_per_s,
        "binding": sr.binding,
        "delta": sr.delta,
        "guaranteed_rate_per_s": sr.guaranteed_rate_per_s,
        "kv_capacity_tokens": sr.kv_capacity_tokens,
        "engine_kv_capacity_tokens": sr.engine_kv_capacity_tokens,
        "effective_kv_tokens": sr.effective_kv_tokens,
        "max_batched_tokens": sr.max_batched_tokens,
        "chunk_size": sr.chunk_size,
        "stable": st.stable,
        "utilization": st.utilization,
        "margin": st.margin,
        "verdict": st.explanation,
        "latency": {
            k: _ms(getattr(lat, f"{k[:-3]}_s"))
            for k in (
                "ttft_mean_ms",
                "ttft_p50_ms",
                "ttft_p90_ms",
                "ttft_p99_ms",
                "tpot_mean_ms",
                "tpot_p50_ms",
                "tpot_p90_ms",
                "tpot_p99_ms",
                "e2e_mean_ms",
            )
        },
        "goodput": {
            "feasible": gp.feasible,
            "rate_per_s": gp.rate_per_s,
            "per_device_rate_per_s": gp.per_device_rate_per_s,
            "explanation": gp.explanation,
        },
        "sizing": {
            "instances": size.instances if ok else None,
            "devices": size.devices if ok else None,
            "necessary_instances": size.necessary_instances,
            "guaranteed_instances": size.guaranteed_instances,
            "utilization": size.utilization if ok else None,
            "limited_by": size.limited_by if ok else "SLO infeasible on this configuration",
        },
    }
    if json_out:
        echo_json(out)
        return
    where = f"{plan.tp}x {d.id}" if plan.pp == 1 else f"{plan.devices}x {d.id} (TP{tp} x PP{pp})"
    typer.echo(
        f"{m.id} on {where}, workload {w.name} (mean {sr.moments.input_tokens:.0f} in / "
        f"{sr.moments.decode_steps + 1:.0f} out), budget {sr.max_batched_tokens} tokens, "
        f"KV {sr.kv_capacity_tokens:,} tokens ({sr.effective_kv_tokens:,.0f} usable under FIFO "
        "admission)"
    )
    if not ok:
        typer.echo(f"  SLO {verdict.upper()[:10]}{verdict[10:]}")
    if plan.pp > 1:
        typer.echo(
            f"  pipeline: {pp} virtual engines, each with budget {sr.max_batched_tokens} "
            f"tokens, {sr.engine_kv_capacity_tokens:,} KV tokens and 1/{pp} of the arrivals; "
            f"full-budget iteration {_ms(sr.full_step_s):.1f} ms"
        )
    typer.echo(
        f"  service rate μ = {sr.rate_per_s:.3g} req/s, {sr.binding}-bound "
        f"(compute {sr.compute_rate_per_s:.3g}, KV memory {sr.memory_rate_per_s:.3g}); "
        f"stable under any work-conserving policy below {sr.guaranteed_rate_per_s:.3g}"
    )
    typer.echo(f"  at {rate:.3g} req/s: {st.explanation}")
    if lat.stable:
        rows = [
            [
                "TTFT",
                _ms(lat.ttft_mean_s),
                _ms(lat.ttft_p50_s),
                _ms(lat.ttft_p90_s),
                _ms(lat.ttft_p99_s),
            ],
            [
                "TPOT",
                _ms(lat.tpot_mean_s),
                _ms(lat.tpot_p50_s),
                _ms(lat.tpot_p90_s),
                _ms(lat.tpot_p99_s),
            ],
        ]
        typer.echo(table(rows, ["ms", "mean", "p50", "p90", "p99"]))
    else:
        typer.echo("  latency: unbounded (the queue grows)")
    typer.echo(
        f"  SLO p{slo_percentile * 100:g} TTFT ≤ {ttft_slo_ms:g} ms, TPOT ≤ {tpot_slo_ms:g} ms, "
        f"goal {goal:.0%}: {gp.explanation}"
    )
    if ok:
        typer.echo(
            f"  instances for {rate:.3g} req/s: {size.instances} ({size.devices} devices, "
            f"utilization {size.utilization:.0%}, limited by "
            f"{out['sizing']['limited_by']}); at least {size.necessary_instances} for stability"
        )
    else:
        typer.echo(
            f"  instances for {rate:.3g} req/s: none meets the SLO on this configuration "
            f"(at least {size.necessary_instances} for stability alone)"
        )


@handle_errors
def simulate_cmd(
    model: ModelOpt = DEFAULT_MODEL,
    hardware: HwOpt = DEFAULT_HARDWARE,
    tp: TpOpt = 1,
    pp: PpOpt = 1,
    workload: WlOpt = "chat",
    trace: TraceOpt = None,
    rate_per_s: RateOpt = None,
    arrival_cv: CvOpt = 1.0,
    time_scale: Annotated[
        float, typer.Option(help="Trace replay speed-up (2 = twice the rate).")
    ] = 1.0,
    requests: Annotated[int, typer.Option(help="Requests to simulate (presets).")] = 20000,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    kv_capacity_tokens: KvOpt = None,
    max_batched_tokens: BudgetOpt = 8192,
    chunk_size: ChunkOpt = None,
    json_out: bool = JsonOpt,
) -> None:
    """Discrete-event simulation: TTFT/TPOT/E2E distributions, throughput, queue growth."""
    from perfmodel.serving import service as q
    from perfmodel.sim.simulate import make_setup, simulate_engines, simulate_workload

    if requests < 1:
        raise fail(f"--requests must be >= 1, got {requests}")
    if trace is None and time_scale != 1.0:
        raise fail("--time-scale speeds up a --trace replay; without --trace use --rate-per-s")
    m, d, plan, w = _setup(model, hardware, tp, workload, trace, arrival_cv, pp)
    n_sim = w.trace.n if w.trace is not None and rate_per_s is None else requests
    _check_sim_work(n_sim, w.lengths, max_batched_tokens)
    sr = q.service_rate(
        Instance(m, d, plan),
        w,
        kv_capacity_tokens=kv_capacity_tokens,
        max_batched_tokens=max_batched_tokens,
        chunk_size=chunk_size,
    )
    setup = make_setup(
        Instance(m, d, plan),
        kv_capacity_tokens=sr.engine_kv_capacity_tokens,  # one virtual engine's share
        max_batched_tokens=sr.max_batched_tokens,
        chunk_size=sr.chunk_size,
    )
    if w.trace is not None and rate_per_s is None:
        tr = w.trace
        res = simulate_engines(
            setup,
            arrival_s=tr.replay_times_s(time_scale),
            input_tokens=tr.input_tokens,
            output_tokens=tr.output_tokens,
            engines=plan.pp,
            seed=seed,
        )
        rate = tr.rate_per_s * time_scale
    else:
        from perfmodel.workload.arrivals import check_rate

        rate = rate_per_s if rate_per_s is not None else 0.7 * sr.rate_per_s
        check_rate(rate)
        res = simulate_workload(
            setup, w.lengths, w.arrivals(rate), n_requests=requests, seed=seed, engines=plan.pp
        )
    dists = {"ttft": res.ttft(), "tpot": res.tpot(), "e2e": res.e2e()}
    out = {
        "model": m.id,
        "hardware": d.id,
        "tp": plan.tp,
        "pp": plan.pp,
        "devices": plan.devices,
        "workload": w.name,
        "rate_per_s": rate,
        "predicted_service_rate_per_s": sr.rate_per_s,
        "requests": int(res.arrival_s.size),
        "completed": int(res.completed.sum()),
        "rejected": res.rejected,
        "preemptions": res.preemptions,
        "iterations": res.iterations,
        "throughput_per_s": res.throughput_per_s,
        "queue_growth_per_s": res.queue_growth_per_s(),
        "max_queue": int(res.queue_len.max(initial=0)),
        **{
            k: {
                "mean_ms": _ms(v.mean_s),
                "p50_ms": _ms(v.p50_s),
                "p90_ms": _ms(v.p90_s),
                "p99_ms": _ms(v.p99_s),
            }
            for k, v in dists.items()
        },
    }
    if json_out:
        echo_json(out)
        return
    typer.echo(
        f"simulated {out['requests']} requests of {w.name} at {rate:.3g} req/s on "
        f"{m.id} {plan.tp}x {d.id}"
        + (f" x PP{plan.pp} ({plan.pp} virtual engines)" if plan.pp > 1 else "")
        + f" (predicted μ {sr.rate_per_s:.3g} req/s)"
    )
    rows = [
        [k.upper(), _ms(v.mean_s), _ms(v.p50_s), _ms(v.p90_s), _ms(v.p99_s)]
        for k, v in dists.items()
    ]
    typer.echo(table(rows, ["ms", "mean", "p50", "p90", "p99"]))
    typer.echo(
        f"  completed {out['completed']}, rejected {res.rejected}, preemptions {res.preemptions}, "
        f"throughput {res.throughput_per_s:.3g} req/s, queue growth "
        f"{out['queue_growth_per_s']:.3g} req/s (max {out['max_queue']} waiting)"
    )
