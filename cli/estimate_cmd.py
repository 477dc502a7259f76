"""``perfmodel estimate``: TTFT, TPOT, throughput and memory for one static batch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli import options as po
from cli.common import JsonOpt, echo_json, fail, handle_errors, table
from cli.options import DEFAULT_HARDWARE, DEFAULT_MODEL
from cli.plan_options import build_plan, plan_label
from perfmodel.units import GiB, ms

if TYPE_CHECKING:  # the library imports numpy: loaded when the command runs
    from hardware.device import Device
    from perfmodel.plan import ParallelPlan
    from perfmodel.step.instance import Instance


def _link_notes(plan: ParallelPlan, d: Device) -> list[str]:
    """Which link the collectives of the plan use (FPGAs: a NIC or host PCIe)."""
    from hardware.comm import link_summary

    pairs = (("TP all-reduce", plan.tp), ("EP all-to-all", plan.ep))
    return [f"{what} over {link_summary(d, g)}" for what, g in pairs if g > 1]


def _positive(name: str, v: int) -> None:
    if v <= 0:
        raise fail(f"{name} must be a positive integer, got {v}")


def _offline(inst: Instance, input_len: int, output_len: int, json_out: bool) -> None:
    from perfmodel.serving.offline import OfflineReport, offline_throughput

    m, d, plan, eng = inst.model, inst.device, inst.plan, inst.engine
    r = offline_throughput(m, d, plan, input_len=input_len, output_len=output_len, engine=eng)
    if json_out:
        echo_json(OfflineReport(inst, r))
        return
    label = inst.engine_accuracy
    typer.echo(
        f"engine: {label}\n{m.id} on {plan.devices}x {d.id}, all requests queued, "
        f"{input_len} in / {output_len} out"
    )
    typer.echo(
        f"  throughput {r.output_tokens_per_s:,.0f} output tokens/s "
        f"({r.output_tokens_per_s / plan.devices:,.0f} per device), "
        f"{r.requests_per_s:.3g} requests/s"
    )
    typer.echo(
        f"  batch {r.batch} in flight (bound by {r.binding}); KV {r.kv_capacity_tokens:,} "
        f"tokens; mean iteration {ms(r.iteration_s):.2f} ms, {100 * r.prefill_share:.0f} % "
        "of it prompt work"
    )


def _render_fit(f: Any, m: Any, d: Any, *, tp: int, pp: int, batch: int, context_len: int) -> None:
    """Feasibility first: fits (and how much KV), or DOES NOT FIT with what would."""
    from perfmodel.memory import describe_shortfall

    if f.fits:
        typer.echo(
            f"  memory: fits; {f.weight_bytes / GiB:.1f} GiB weights/device"
            f"{f' (stage {f.stage})' if pp > 1 else ''}, KV capacity "
            f"{f.kv_capacity_tokens:,} tokens = {f.max_batch(context_len)} "
            f"requests of {context_len} tokens"
        )
        if f.max_batch(context_len) < batch:
            typer.echo(
                f"  DOES NOT FIT: the KV cache holds {f.max_batch(context_len)} of "
                f"the batch's {batch} requests; lower --batch or raise --tp"
            )
    else:
        typer.echo("  DOES NOT FIT: " + describe_shortfall(f, m, d, tp))
        typer.echo("  (the times below are what it would take if it fit; not achievable)")


@handle_errors
def estimate_cmd(
    model: Annotated[str, typer.Option(help="Model id or config.json path.")] = DEFAULT_MODEL,
    hardware: Annotated[str, typer.Option(help="Device id or TOML path.")] = DEFAULT_HARDWARE,
    tp: Annotated[int, typer.Option(help="Tensor-parallel degree.")] = 1,
    pp: Annotated[
        int, typer.Option(help="Pipeline-parallel stages (devices = tp x pp; 1 = none).")
    ] = 1,
    batch: Annotated[int, typer.Option(help="Concurrent requests in the batch.")] = 64,
    input_len: Annotated[int, typer.Option(help="Prompt tokens per request.")] = 1024,
    output_len: Annotated[int, typer.Option(help="Generated tokens per request.")] = 128,
    dtype: po.DtypeOpt = None,
    act_dtype: po.ActDtypeOpt = None,
    kv_dtype: po.KvDtypeOpt = None,
    expert_dtype: po.ExpertDtypeOpt = None,
    attn_dtype: po.AttnDtypeOpt = None,
    ep: po.EpOpt = 1,
    dp: po.DpOpt = 1,
    engine: po.EngineOpt = po.DEFAULT_ENGINE,
    offline: Annotated[
        bool,
        typer.Option(
            help="Offline saturation throughput (all requests queued, fixed lengths) under "
            "the engine's batch caps, instead of one static batch."
        ),
    ] = False,
    json_out: bool = JsonOpt,
) -> None:
    """Estimate TTFT, TPOT, throughput and memory fit for one static batch."""
    from hardware.device import load_device
    from perfmodel.estimate import EstimateReport, estimate
    from perfmodel.model import load_model
    from perfmodel.step.instance import Instance

    for name, v in (
        ("--tp", tp),
        ("--pp", pp),
        ("--batch", batch),
        ("--input-len", input_len),
        ("--output-len", output_len),
        ("--ep", ep),
        ("--dp", dp),
    ):
        _positive(name, v)
    m = load_model(model)
    d = load_device(hardware)
    plan, prec = build_plan(
        m, d, tp=tp, pp=pp, ep=ep, dp=dp, dtype=dtype, act_dtype=act_dtype,
        kv_dtype=kv_dtype, expert_dtype=expert_dtype, attn_dtype=attn_dtype,
    )  # fmt: skip
    eng = po.resolve_engine(engine, d)
    inst = Instance(m, d, plan, engine=eng, engine_spec=engine)
    if offline:
        _offline(inst, input_len, output_len, json_out)
        return
    e = estimate(inst, batch=batch, input_len=input_len, output_len=output_len)
    if json_out:
        echo_json(EstimateReport(inst, e, prec))
        return
    label = inst.engine_accuracy
    typer.echo(f"engine: {label}")
    f = e.memory
    where = f"{tp}x {d.id}" if pp == 1 else f"{plan.devices}x {d.id} (TP{tp} x PP{pp})"
    if plan.dp > 1 or plan.ep > 1:
        where = plan_label(plan, d.id)
    typer.echo(
        f"{m.id} on {where} (weights {plan.weights.describe()}, math {plan.act_dtype}, "
        f"KV {plan.kv_dtype}); batch {batch}, {input_len} in / {output_len} out"
    )
    _render_fit(f, m, d, tp=tp, pp=pp, batch=batch, context_len=input_len + output_len)
    for note in (*prec.notes, *m.warnings, *_link_notes(plan, d)):
        typer.echo(f"  note: {note}")
    if pp > 1:
        typer.echo(
            f"  pipeline: {pp} stages of {tp} devices; {pp} virtual engines of up to "
            f"{e.micro_batch} requests each; times are one virtual engine's iterations"
        )
    typer.echo(f"  TTFT  {ms(e.ttft_s):10.1f} ms   (prefill of the whole batch)")
    typer.echo(f"  TPOT  {ms(e.tpot_s):10.2f} ms   (mean decode step)")
    typer.echo(f"  E2E   {ms(e.e2e_s):10.1f} ms")
    typer.echo(
        f"  throughput {e.output_tokens_per_s:,.0f} output tokens/s "
        f"({e.output_tokens_per_s / plan.devices:,.0f} per device)"
    )
    bound = e.decode_mid.by_bound()
    tot = float(e.decode_mid.total_s)
    typer.echo(
        f"  decode step: {100 * float(bound['memory']) / tot:.0f}% memory-bound ops, "
        f"{100 * float(bound['compute']) / tot:.0f}% compute-bound, "
        f"{100 * float(bound['comm']) / tot:.0f}% communication; arithmetic intensity "
        f"{e.decode_arith_intensity:.0f} FLOP/B vs ridge {e.ridge_flop_per_byte:.0f}"
    )
    from perfmodel.estimate import op_breakdown

    rows = [
        [o["op"], o["count"], f"{o['total_ms']:.3f}", o["bound"]]
        for o in op_breakdown(e.decode_mid)
    ]
    typer.echo(
        "\ndecode step breakdown (middle of generation)"
        + (":" if pp == 1 else f", one device of the slowest stage over {pp} micro-batches:")
    )
    typer.echo(table(rows, ["op", "x", "ms", "bound"]))
