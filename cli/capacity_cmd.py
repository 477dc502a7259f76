"""``perfmodel capacity`` and ``perfmodel simulate``: stability, latency, goodput, sizing."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from cli import options as po
from cli.common import JsonOpt, echo_json, fail, handle_errors, table
from cli.options import (
    DEFAULT_ENGINE,
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
    EngineOpt,
    GoalOpt,
    HardwareOpt,
    KvCapacityOpt,
    MaxBatchedTokensOpt,
    ModelOpt,
    OptionalRateOpt,
    PpOpt,
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
from cli.plan_options import plan_label
from perfmodel.units import MS_PER_S

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
    hardware: HardwareOpt = DEFAULT_HARDWARE,
    tp: TpOpt = 1,
    pp: PpOpt = 1,
    workload: WorkloadOpt = DEFAULT_WORKLOAD,
    trace: TraceOpt = None,
    rate_per_s: OptionalRateOpt = None,
    arrival_cv: ArrivalCvOpt = 1.0,
    ttft_slo_ms: TtftSloOpt = DEFAULT_TTFT_SLO_MS,
    tpot_slo_ms: TpotSloOpt = DEFAULT_TPOT_SLO_MS,
    slo_percentile: SloPercentileOpt = DEFAULT_SLO_PERCENTILE,
    goal: GoalOpt = DEFAULT_GOAL,
    target_utilization: Annotated[float, typer.Option(help="Sizing headroom: λ/(N·μ).")] = 0.8,
    kv_capacity_tokens: KvCapacityOpt = None,
    max_batched_tokens: MaxBatchedTokensOpt = DEFAULT_MAX_BATCHED_TOKENS,
    chunk_size: ChunkSizeOpt = None,
    dtype: po.DtypeOpt = None,
    act_dtype: po.ActDtypeOpt = None,
    kv_dtype: po.KvDtypeOpt = None,
    expert_dtype: po.ExpertDtypeOpt = None,
    attn_dtype: po.AttnDtypeOpt = None,
    ep: po.EpOpt = 1,
    dp: po.DpOpt = 1,
    trace_model: po.TraceModelOpt = None,
    engine: EngineOpt = DEFAULT_ENGINE,
    json_out: bool = JsonOpt,
) -> None:
    """Service rate μ and its binding bound, stability, latency, goodput, instances needed."""
    from perfmodel.serving.capacity import capacity
    from perfmodel.serving.service import EngineLimits

    rep = capacity(
        build_instance(
            model,
            hardware,
            tp,
            pp,
            dtype=dtype,
            act_dtype=act_dtype,
            kv_dtype=kv_dtype,
            expert_dtype=expert_dtype,
            attn_dtype=attn_dtype,
            ep=ep,
            dp=dp,
            engine=engine,
        ),
        build_workload(workload, trace, arrival_cv, trace_model),
        build_slo(ttft_slo_ms, tpot_slo_ms, slo_percentile, goal),
        rate_per_s=rate_per_s,
        target_utilization=target_utilization,
        limits=EngineLimits(kv_capacity_tokens, max_batched_tokens, chunk_size),
    )
    if json_out:
        echo_json(rep)
        return
    typer.echo(f"engine: {rep.instance.engine_accuracy}")
    _render_capacity(rep)


def _render_capacity(rep: Any) -> None:
    m, d, plan, w = rep.instance.model, rep.instance.device, rep.instance.plan, rep.workload
    sr, st, lat, gp, size, rate = (
        rep.service, rep.stability, rep.latency, rep.goodput, rep.sizing, rep.rate_per_s
    )  # fmt: skip
    tp, pp, slo = plan.tp, plan.pp, rep.slo
    where = f"{plan.tp}x {d.id}" if plan.pp == 1 else f"{plan.devices}x {d.id} (TP{tp} x PP{pp})"
    if plan.dp > 1 or plan.ep > 1:
        where = plan_label(plan, d.id)
    typer.echo(
        f"{m.id} on {where}, workload {w.name} (mean {sr.moments.input_tokens:.0f} in / "
        f"{sr.moments.decode_steps + 1:.0f} out), budget {sr.max_batched_tokens} tokens, "
        f"KV {sr.kv_capacity_tokens:,} tokens ({sr.effective_kv_tokens:,.0f} usable under FIFO "
        "admission)"
    )
    if not rep.slo_feasible:
        v = rep.slo_verdict
        typer.echo(f"  SLO {v[:10].upper()}{v[10:]}")
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
        f"  SLO p{slo.percentile * 100:g} TTFT ≤ {_ms(slo.ttft_s):g} ms, "
        f"TPOT ≤ {_ms(slo.tpot_s):g} ms, goal {slo.goal:.0%}: {gp.explanation}"
    )
    if not rep.slo_feasible:
        typer.echo(
            f"  instances for {rate:.3g} req/s: none meets the SLO on this configuration "
            f"(at least {size.necessary_instances} for stability alone)"
        )
        return
    typer.echo(
        f"  instances for {rate:.3g} req/s: {size.instances} ({size.devices} devices, "
        f"utilization {size.utilization:.0%}, limited by "
        f"{rep.limited_by}); at least {size.necessary_instances} for stability"
    )


@handle_errors
def simulate_cmd(
    model: ModelOpt = DEFAULT_MODEL,
    hardware: HardwareOpt = DEFAULT_HARDWARE,
    tp: TpOpt = 1,
    pp: PpOpt = 1,
    workload: WorkloadOpt = DEFAULT_WORKLOAD,
    trace: TraceOpt = None,
    rate_per_s: OptionalRateOpt = None,
    arrival_cv: ArrivalCvOpt = 1.0,
    time_scale: Annotated[
        float, typer.Option(help="Trace replay speed-up (2 = twice the rate).")
    ] = 1.0,
    requests: Annotated[int, typer.Option(help="Requests to simulate (presets).")] = 20000,
    seed: SeedOpt = 0,
    kv_capacity_tokens: KvCapacityOpt = None,
    max_batched_tokens: MaxBatchedTokensOpt = DEFAULT_MAX_BATCHED_TOKENS,
    chunk_size: ChunkSizeOpt = None,
    dtype: po.DtypeOpt = None,
    act_dtype: po.ActDtypeOpt = None,
    kv_dtype: po.KvDtypeOpt = None,
    expert_dtype: po.ExpertDtypeOpt = None,
    attn_dtype: po.AttnDtypeOpt = None,
    ep: po.EpOpt = 1,
    dp: po.DpOpt = 1,
    trace_model: po.TraceModelOpt = None,
    engine: EngineOpt = DEFAULT_ENGINE,
    json_out: bool = JsonOpt,
) -> None:
    """Discrete-event simulation: TTFT/TPOT/E2E distributions, throughput, queue growth."""
    from perfmodel.serving.service import EngineLimits
    from perfmodel.sim.report import simulate_instance

    if requests < 1:
        raise fail(f"--requests must be >= 1, got {requests}")
    if trace is None and time_scale != 1.0:
        raise fail("--time-scale speeds up a --trace replay; without --trace use --rate-per-s")
    inst = build_instance(
        model,
        hardware,
        tp,
        pp,
        dtype=dtype,
        act_dtype=act_dtype,
        kv_dtype=kv_dtype,
        expert_dtype=expert_dtype,
        attn_dtype=attn_dtype,
        ep=ep,
        dp=dp,
        engine=engine,
    )
    w = build_workload(workload, trace, arrival_cv, trace_model)
    n_sim = w.trace.n if w.trace is not None and rate_per_s is None else requests
    _check_sim_work(n_sim, w.lengths, max_batched_tokens)
    rep = simulate_instance(
        inst,
        w,
        rate_per_s=rate_per_s,
        time_scale=time_scale,
        requests=requests,
        seed=seed,
        limits=EngineLimits(kv_capacity_tokens, max_batched_tokens, chunk_size),
    )
    if json_out:
        echo_json(rep)
        return
    typer.echo(f"engine: {inst.engine_accuracy}")
    _render_simulation(rep.to_dict())


def _render_simulation(out: dict[str, Any]) -> None:
    pp = out["pp"]
    typer.echo(
        f"simulated {out['requests']} requests of {out['workload']} at {out['rate_per_s']:.3g} "
        f"req/s on {out['model']} {out['tp']}x {out['hardware']}"
        + (f" x PP{pp} ({pp} virtual engines)" if pp > 1 else "")
        + f" (predicted μ {out['predicted_service_rate_per_s']:.3g} req/s)"
    )
    cols = ("mean_ms", "p50_ms", "p90_ms", "p99_ms")
    rows = [[k.upper(), *(out[k][c] for c in cols)] for k in ("ttft", "tpot", "e2e")]
    typer.echo(table(rows, ["ms", "mean", "p50", "p90", "p99"]))
    typer.echo(
        f"  completed {out['completed']}, rejected {out['rejected']}, preemptions "
        f"{out['preemptions']}, throughput {out['throughput_per_s']:.3g} req/s, queue growth "
        f"{out['queue_growth_per_s']:.3g} req/s (max {out['max_queue']} waiting)"
    )
