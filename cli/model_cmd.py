"""``perfmodel model``: the model catalog and config.json inspection."""

from __future__ import annotations

import typer

from cli.common import JsonOpt, echo_json, handle_errors, table
from perfmodel.model import load_model, model_ids
from perfmodel.modelcfg.summary import WEIGHT_DTYPES, attention_kind, layer_mix
from perfmodel.units import GIGA, GiB

app = typer.Typer(
    help="Model catalog: list models, show one (or a config.json).", no_args_is_help=True
)


@app.command("list")
@handle_errors
def list_cmd(json_out: bool = JsonOpt) -> None:
    """List the built-in models."""
    models = [load_model(i) for i in model_ids()]
    if json_out:
        echo_json(models)
        return
    rows = [
        [
            m.id,
            "MLA" if m.mla else "GQA",
            f"{m.params / GIGA:.1f}",
            f"{m.active_params / GIGA:.1f}",
            f"{m.moe.num_experts}x top-{m.moe.top_k}" if m.moe else "-",
            f"{m.kv_bytes_per_token():,.0f}",
        ]
        for m in models
    ]
    typer.echo(table(rows, ["id", "attn", "params B", "active B", "experts", "KV B/token (bf16)"]))


@app.command("show")
@handle_errors
def show_cmd(
    model: str = typer.Argument(..., help="Model id or path to a Hugging Face config.json."),
    json_out: bool = JsonOpt,
) -> None:
    """Show parameters, active parameters, weight bytes and KV bytes per token."""
    m = load_model(model)
    if json_out:
        echo_json(m)
        return
    typer.echo(
        f"{m.name} ({m.id}): {attention_kind(m)}, {m.layers} layers, hidden {m.hidden}, "
        f"{m.heads} heads / {m.kv_heads} KV heads x {m.head_dim}"
    )
    if m.moe:
        typer.echo(
            f"MoE: {m.moe.num_experts} experts, top-{m.moe.top_k}, expert width "
            f"{m.moe.expert_intermediate}, shared width {m.moe.shared_intermediate}, "
            f"{m.n_moe_layers} MoE layers"
        )
    typer.echo(
        f"parameters: {m.params / GIGA:.2f} B total, {m.active_params / GIGA:.2f} B "
        "active per token"
    )
    rows = [
        [dt, f"{m.weight_bytes(dt) / GiB:.1f}", f"{m.weight_bytes(dt) / GIGA:.1f}"]
        for dt in WEIGHT_DTYPES
    ]
    typer.echo(table(rows, ["weights", "GiB", "GB"]))
    typer.echo(
        f"KV cache per token: {m.kv_bytes_per_token('bf16'):,.0f} B (bf16), "
        f"{m.kv_bytes_per_token('fp8'):,.0f} B (fp8)"
        + (" on the layers whose cache grows with the context" if m.layer_specs else "")
    )
    if m.layer_specs:
        mix = ", ".join(f"{n} {k}" for k, n in layer_mix(m.layer_plan).items())
        typer.echo(f"layers: {mix}")
        per_seq = ", ".join(
            f"{n:,} tokens {m.kv_bytes_per_sequence(n) / GiB:.3f} GiB" for n in (8192, 131072)
        )
        typer.echo(f"cache per sequence (bf16, windows and recurrent state included): {per_seq}")
    if m.linear_attn:
        typer.echo(
            f"recurrent state per sequence: {m.state_bytes_per_sequence('bf16'):,.0f} B "
            f"({m.linear_attn.kind}; read and written every step)"
        )
    if m.sparse_attn:
        typer.echo(f"sparse attention: each query attends {m.sparse_attn.top_k} selected tokens")
    if m.mtp_layers:
        typer.echo(
            f"MTP: {m.mtp_layers} module(s), {m.mtp_params / GIGA:.2f} B parameters in the "
            "checkpoint (not in the serving memory unless speculative decoding is modeled: "
            "it is not)"
        )
    if m.quantization:
        typer.echo(f"checkpoint quantization: {m.quantization.describe()}")
    for w in m.warnings:
        typer.echo(f"warning: {w}")
