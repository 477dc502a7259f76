"""``perfmodel hardware``: the device catalog."""

from __future__ import annotations

import typer

from cli.common import JsonOpt, echo_json, handle_errors, table
from hardware.device import Device, catalog_ids, load_device
from perfmodel.dtypes import DTYPE_NAMES
from perfmodel.units import GIGA, MEGA, TERA, US_PER_S, GiB

app = typer.Typer(
    help="Device catalog: list devices, show one with its ridge points.", no_args_is_help=True
)


def _main_dtype(d: Device) -> str:
    for k in ("bf16", "fp16", "int8"):
        if k in d.peak_flops_per_s:
            return k
    return next(iter(d.peak_flops_per_s))


@app.command("list")
@handle_errors
def list_cmd(json_out: bool = JsonOpt) -> None:
    """List the built-in devices."""
    devs = [load_device(i) for i in catalog_ids()]
    if json_out:
        echo_json(devs)
        return
    rows = []
    for d in devs:
        k = _main_dtype(d)
        rows.append(
            [
                d.id,
                d.name,
                f"{d.peak(k) / TERA:.1f} ({k})",
                f"{d.hbm_bw_bytes_per_s / TERA:.3g}",
                f"{d.hbm_bytes / GiB:.0f}",
                f"{d.ridge_flop_per_byte(k):.0f}",
                d.scale_up.topology,
            ]
        )
    typer.echo(table(rows, ["id", "name", "dense TFLOP/s", "HBM TB/s", "GiB", "ridge", "scale-up"]))


@app.command("show")
@handle_errors
def show_cmd(
    device: str = typer.Argument(..., help="Device id or path to a device TOML file."),
    json_out: bool = JsonOpt,
) -> None:
    """Show one device: peaks, memory, links and the ridge point per dtype."""
    d = load_device(device)
    if json_out:
        echo_json(d)
        return
    typer.echo(f"{d.name} ({d.id}), {d.vendor} {d.kind}")
    typer.echo(
        f"memory: {d.hbm_bytes / GiB:.1f} GiB {d.memory_type}, "
        f"{d.hbm_bw_bytes_per_s / TERA:.3g} TB/s; on-chip {d.sram_bytes / MEGA:.0f} MB"
    )
    rows = [
        [k, f"{d.peak_flops_per_s[k] / TERA:.1f}", f"{d.ridge_flop_per_byte(k):.0f}"]
        for k in DTYPE_NAMES
        if k in d.peak_flops_per_s
    ]
    typer.echo(table(rows, ["dtype", "dense TFLOP/s", "ridge FLOP/B"]))
    su = d.scale_up
    typer.echo(
        f"scale-up: {su.name or 'none'} ({su.topology}), "
        f"{su.bw_per_direction_bytes_per_s / GIGA:.0f} GB/s per direction, "
        f"{su.peer_bw_per_direction_bytes_per_s / GIGA:.0f} GB/s per peer, {su.peers} peers, "
        f"{su.latency_s * US_PER_S:.4g} µs per hop"
        + (
            f", collective fixed costs x{su.collective_base_latency_scale:g} (fitted to NCCL "
            "measurements; see the catalog file)"
            if su.collective_base_latency_scale != 1.0
            else ""
        )
    )
    typer.echo(
        f"host link: {d.host_link.name}, "
        f"{d.host_link.bw_per_direction_bytes_per_s / GIGA:.0f} GB/s per direction"
    )
    if d.dies_per_package > 1:
        typer.echo(f"package: {d.dies_per_package} dies seen as separate devices")
    if d.notes:
        typer.echo(f"notes: {d.notes}")
