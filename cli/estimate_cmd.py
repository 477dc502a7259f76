"""``perfmodel estimate``: TTFT, TPOT, throughput and memory for one static batch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from cli.common import JsonOpt, echo_json, fail, handle_errors, table
from cli.options import DEFAULT_HARDWARE, DEFAULT_MODEL
from perfmodel.units import GiB, ms

if TYPE_CHECKING:  # the library imports numpy: loaded when the command runs
    from perfmodel.estimate import Estimate
    from perfmodel.step.time import StepTime


def _breakdown(step: StepTime) -> list[dict[str, object]]:
    return [
        {
            "op": o.name,
            "count": o.count,
            "compute_ms": ms(float(o.compute_s)),
            "memory_ms": ms(float(o.memory_s)),
            "comm_ms": ms(float(o.comm_s)),
            "total_ms": ms(float(o.total_s)),
            "bound": str(o.bound),
        }
        for o in step.ops
    ]


def estimate_dict(e: Estimate) -> dict[str, object]:
    f = e.memory
    return {
        "fits": f.fits,
        "model": e.model.id,
        "hardware": e.device.id,
        "tp": e.plan.tp,
        "pp": e.plan.pp,
        "devices": e.plan.devices,
        "micro_batch": e.micro_batch,
        "dtypes": {"weight": e.plan.weight_dtype, "act": e.plan.act_dtype, "kv": e.plan.kv_dtype},
        "batch": e.batch,
        "input_len": e.input_len,
        "output_len": e.output_len,
        "ttft_ms": ms(e.ttft_s),
        "tpot_ms": ms(e.tpot_s),
        "e2e_ms": ms(e.e2e_s),
        "output_tokens_per_s": e.output_tokens_per_s,
        "decode_arith_intensity_flop_per_byte": e.decode_arith_intensity,
        "ridge_flop_per_byte": e.ridge_flop_per_byte,
        "decode_bound_s": {k: float(v) for k, v in e.decode_mid.by_bound().items()},
        "prefill_bound_s": {k: float(v) for k, v in e.prefill.by_bound().items()},
        "memory": {
            "fits": f.fits,
            "capacity_bytes": f.capacity_bytes,
            "usable_bytes": f.usable_bytes,
            "weight_bytes_per_device": f.weight_bytes,
            "activation_reserve_bytes": f.reserve_bytes,
            "kv_bytes_per_token_per_device": f.kv_bytes_per_token,
            "kv_capacity_tokens": f.kv_capacity_tokens,
            "max_batch_at_context": f.max_batch(e.input_len + e.output_len),
            "shortfall_bytes": f.shortfall_bytes,
            "min_tp": f.min_tp,
            "min_pp": f.min_pp,
            "binding_stage": f.stage,
        },
        "decode_breakdown": _breakdown(e.decode_mid),
        "prefill_breakdown": _breakdown(e.prefill),
    }


def _positive(name: str, v: int) -> None:
    if v <= 0:
        raise fail(f"{name} must be a positive integer, got {v}")


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
    dtype: Annotated[str, typer.Option(help="Weight dtype (bf16, fp8, int8, int4).")] = "bf16",
    act_dtype: Annotated[str, typer.Option(help="Math/activation dtype.")] = "bf16",
    kv_dtype: Annotated[str, typer.Option(help="KV-cache dtype.")] = "bf16",
    json_out: bool = JsonOpt,
) -> None:
    """Estimate TTFT, TPOT, throughput and memory fit for one static batch."""
    from hardware.device import load_device
    from perfmodel.estimate import estimate
    from perfmodel.memory import describe_shortfall
    from perfmodel.model import load_model
    from perfmodel.plan import ParallelPlan
    from perfmodel.step.instance import Instance

    for name, v in (
        ("--tp", tp),
        ("--pp", pp),
        ("--batch", batch),
        ("--input-len", input_len),
        ("--output-len", output_len),
    ):
        _positive(name, v)
    m = load_model(model)
    d = load_device(hardware)
    plan = ParallelPlan(tp=tp, weight_dtype=dtype, act_dtype=act_dtype, kv_dtype=kv_dtype, pp=pp)
    e = estimate(Instance(m, d, plan), batch=batch, input_len=input_len, output_len=output_len)
    if json_out:
        echo_json(estimate_dict(e))
        return
    f = e.memory
    where = f"{tp}x {d.id}" if pp == 1 else f"{plan.devices}x {d.id} (TP{tp} x PP{pp})"
    typer.echo(
        f"{m.id} on {where} (weights {plan.weight_dtype}, math {plan.act_dtype}, "
        f"KV {plan.kv_dtype}); batch {batch}, {input_len} in / {output_len} out"
    )
    if f.fits:
        typer.echo(
            f"  memory: fits; {f.weight_bytes / GiB:.1f} GiB weights/device"
            f"{f' (stage {f.stage})' if pp > 1 else ''}, KV capacity "
            f"{f.kv_capacity_tokens:,} tokens = {f.max_batch(input_len + output_len)} "
            f"requests of {input_len + output_len} tokens"
        )
        if f.max_batch(input_len + output_len) < batch:
            typer.echo(
                f"  DOES NOT FIT: the KV cache holds {f.max_batch(input_len + output_len)} of "
                f"the batch's {batch} requests; lower --batch or raise --tp"
            )
    else:
        typer.echo("  DOES NOT FIT: " + describe_shortfall(f, m, d, tp))
        typer.echo("  (the times below are what it would take if it fit; not achievable)")
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
    rows = [
        [o["op"], o["count"], f"{o['total_ms']:.3f}", o["bound"]] for o in _breakdown(e.decode_mid)
    ]
    typer.echo(
        "\ndecode step breakdown (middle of generation)"
        + (":" if pp == 1 else f", one device of the slowest stage over {pp} micro-batches:")
    )
    typer.echo(table(rows, ["op", "x", "ms", "bound"]))
