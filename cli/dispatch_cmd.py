"""``perfmodel dispatch solve|place|phase``: expert dispatch, placement and phase diagram."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from cli.common import JsonOpt, echo_json, fail, handle_errors, progress, table, write_atomic

app = typer.Typer(
    help="MoE expert dispatch: per-batch solvers, placement, phase diagram.",
    no_args_is_help=True,
)

DEFAULT_HARDWARE = "h100-sxm"
SOLVE_METHODS = ("milp", "heuristic", "token", "activated", "static", "bound")


ProfileOpt = Annotated[
    str,
    typer.Option(
        help="Expert-block cost profile: 'derived' (roofline) or a fitted max-affine "
        "profile over G, N (TOML path, e.g. from `perfmodel profile crossover --out`, "
        "or <device>:<op>)."
    ),
]


def _setup(model: str | None, hardware: str, profile: str = "derived") -> tuple[Any, Any, Any]:
    from hardware.device import load_device
    from perfmodel.model import load_model
    from perfmodel.moe.expert import derived_expert_profile, expert_shape

    d = load_device(hardware)
    m = load_model(model) if model else None
    if m is None:
        return m, d, None
    h, i, mats = expert_shape(m)
    if profile == "derived":
        return m, d, derived_expert_profile(d, h, i, mats=mats)
    from hardware.profile_io import load_profile

    prof = load_profile(profile, device=d.id)
    if set(prof.features) != {"G", "N"}:
        raise fail(
            f"--profile {profile} is over {', '.join(prof.features)}; dispatch needs an "
            "expert-block profile over G (activated experts) and N (token rows)"
        )
    op = prof.provenance.op
    want = f"moe_expert_{h}x{i}x{mats}"
    if op.startswith("moe_expert_") and op != want:
        raise fail(
            f"--profile {profile} was fitted for {op}, but {m.id}'s expert is {want}; "
            "fit a profile for this expert shape"
        )
    if prof.residual is not None:
        raise fail(
            f"--profile {profile} carries a measured residual surface; the dispatch "
            "optimizer works on the profile's pieces and cannot use it: fit the expert "
            "profile without --residual"
        )
    return m, d, prof


def _counts(
    counts: Path | None, model: Any, tokens: int | None, skew: float, seed: int, layer: int
) -> tuple[Any, str]:
    from perfmodel.moe.routing import batch_for_model, load_counts_csv

    if counts is not None:
        E = model.moe.num_experts if model is not None and model.moe else None
        b = load_counts_csv(counts, num_experts=E)
        if not 0 <= layer < b.layers:
            raise fail(
                f"--row {layer} is out of range; the CSV has {b.layers} rows (0..{b.layers - 1})"
            )
        return b.counts[layer], f"{counts.name} row {layer}"
    if model is None or tokens is None:
        raise fail("give --counts CSV, or --model ID with --tokens N")
    if tokens < 1:
        raise fail(f"--tokens must be >= 1, got {tokens}")
    b = batch_for_model(model, tokens, skew=skew, seed=seed)
    return b.counts[0], b.source


@app.command("solve")
@handle_errors
def solve_cmd(
    gpus: Annotated[int, typer.Option(help="GPUs in the expert-parallel group.")] = 8,
    replicas: Annotated[int, typer.Option(help="Replicas of every expert (round-robin).")] = 2,
    hardware: Annotated[str, typer.Option(help="Device id or TOML path.")] = DEFAULT_HARDWARE,
    model: Annotated[
        str | None, typer.Option(help="MoE model id (expert shape, expert count).")
    ] = None,
    counts: Annotated[
        Path | None, typer.Option(help="CSV of recorded counts (step,layer,e0,...).")
    ] = None,
    row: Annotated[int, typer.Option(help="Row of the counts CSV to dispatch.")] = 0,
    tokens: Annotated[int | None, typer.Option(help="Tokens in a generated batch.")] = None,
    skew: Annotated[float, typer.Option(help="Zipf exponent of a generated batch.")] = 1.0,
    seed: Annotated[int, typer.Option(help="Seed of a generated batch.")] = 0,
    tile_rows: Annotated[int, typer.Option(help="Grouped-GEMM M-tile (1 = none).")] = 128,
    method: Annotated[
        str, typer.Option(help="milp|heuristic|token|activated|static|bound|all")
    ] = "all",
    time_limit_s: Annotated[float, typer.Option(help="MILP time limit, seconds.")] = 10.0,
    profile: ProfileOpt = "derived",
    json_out: bool = JsonOpt,
) -> None:
    """Dispatch one batch over GPUs holding expert replicas; compare the methods."""
    from perfmodel.units import ms
    from solvers.dispatch.solve import (
        DispatchComparison,
        dispatch,
        make_problem,
        round_robin_placement,
    )

    if method != "all" and method not in SOLVE_METHODS:
        raise fail(f"--method must be one of {', '.join(SOLVE_METHODS)}, all; got {method!r}")
    if gpus < 1:
        raise fail(f"--gpus must be >= 1, got {gpus}")
    if not model:
        raise fail("--model is required (it gives the expert shape for the cost profile)")
    m, d, prof = _setup(model, hardware, profile)
    c, source = _counts(counts, m, tokens, skew, seed, row)
    pl = round_robin_placement(len(c), gpus, replicas=replicas)
    p = make_problem(c, pl, prof, tile_rows=tile_rows)
    methods = SOLVE_METHODS if method == "all" else (method,)
    res = tuple(dispatch(p, mm, time_limit_s=time_limit_s) for mm in methods)
    if json_out:
        echo_json(DispatchComparison(m.id, d.id, gpus, replicas, source, prof.provenance, res))
        return
    typer.echo(f"{m.id} experts on {gpus}x {d.id}, {replicas} replica(s) each; batch: {source}")
    typer.echo(f"expert-block profile: {_profile_text(prof)}")
    rows = [
        [
            r.method,
            f"{ms(r.makespan_s):.4f}",
            r.status,
            "" if r.gap is None else f"{100 * r.gap:.2f}%",
            f"{ms(r.solve_time_s):.2f}",
            int(r.activated.max()),
            int(r.gpu_rows.max()),
        ]
        for r in res
    ]
    typer.echo(
        table(rows, ["method", "makespan ms", "status", "gap", "solve ms", "max G", "max rows"])
    )
    for r in res:
        if r.message:
            typer.echo(f"note ({r.method}): {r.message}")


@app.command("place")
@handle_errors
def place_cmd(
    model: Annotated[str, typer.Option(help="MoE model id.")],
    gpus: Annotated[int, typer.Option(help="GPUs in the expert-parallel group.")] = 4,
    slots_per_gpu: Annotated[int, typer.Option(help="Replica slots (memory) per GPU.")] = 0,
    hardware: Annotated[str, typer.Option(help="Device id or TOML path.")] = DEFAULT_HARDWARE,
    counts: Annotated[
        Path | None, typer.Option(help="CSV of recorded counts: the load samples.")
    ] = None,
    tokens: Annotated[int, typer.Option(help="Tokens per generated sample.")] = 1024,
    skew: Annotated[float, typer.Option(help="Zipf exponent of generated samples.")] = 1.0,
    samples: Annotated[int, typer.Option(help="Generated load samples.")] = 1,
    seed: Annotated[int, typer.Option(help="Seed.")] = 0,
    tile_rows: Annotated[int, typer.Option(help="Grouped-GEMM M-tile (1 = none).")] = 128,
    migration_cost_us: Annotated[
        float, typer.Option(help="Makespan-equivalent cost per copied replica, us.")
    ] = 0.0,
    time_limit_s: Annotated[float, typer.Option(help="ILP time limit, seconds.")] = 30.0,
    json_out: bool = JsonOpt,
) -> None:
    """EPLB vs the ILP placement on the expected makespan of the load samples."""
    from perfmodel.moe.routing import batch_for_model, load_counts_csv
    from perfmodel.units import S_PER_US, ms
    from solvers.placement.place import PlacementReport, place_ilp

    m, d, prof = _setup(model, hardware)
    E = m.moe.num_experts
    if gpus < 1:
        raise fail(f"--gpus must be >= 1, got {gpus}")
    slots = slots_per_gpu or -(-E // gpus) + 1
    if counts is not None:
        S = load_counts_csv(counts, num_experts=E).counts
    else:
        S = batch_for_model(m, tokens, skew=skew, layers=samples, seed=seed).counts
    r = place_ilp(
        S,
        prof,
        num_gpus=gpus,
        slots_per_gpu=slots,
        tile_rows=tile_rows,
        migration_cost_s=migration_cost_us * S_PER_US,
        time_limit_s=time_limit_s,
    )
    if json_out:
        echo_json(PlacementReport(m.id, d.id, gpus, slots, r))
        return
    typer.echo(
        f"{m.id}: {E} experts on {gpus}x {d.id}, {slots} slots per GPU, {len(S)} load sample(s)"
    )
    typer.echo(f"  EPLB expected makespan  {ms(r.eplb_expected_makespan_s):.4f} ms")
    typer.echo(
        f"  ILP  expected makespan  {ms(r.expected_makespan_s):.4f} ms "
        f"({100 * r.gain:.1f}% better, {r.status}, {r.solve_time_s:.1f} s)"
    )
    if r.message:
        typer.echo(f"  note: {r.message}")


def _profile_text(prof: Any) -> str:
    pv = prof.provenance
    return f"{pv.source} ({pv.op} on {pv.device})"


@app.command("phase")
@handle_errors
def phase_cmd(
    model: Annotated[str, typer.Option(help="MoE model id.")],
    out: Annotated[Path, typer.Option(help="Output HTML file.")],
    hardware: Annotated[str, typer.Option(help="Device id or TOML path.")] = DEFAULT_HARDWARE,
    gpus: Annotated[int, typer.Option(help="EP group size (> gpus-per-node: across nodes).")] = 8,
    gpus_per_node: Annotated[int, typer.Option(help="GPUs per scale-up node.")] = 8,
    tokens_per_gpu: Annotated[str, typer.Option(help="Comma-separated grid.")] = (
        "16,32,64,128,256,512,1024,2048"
    ),
    skews: Annotated[str, typer.Option(help="Comma-separated Zipf exponents.")] = "0,0.5,1,1.5",
    samples: Annotated[int, typer.Option(help="Batches per cell.")] = 2,
    seed: Annotated[int, typer.Option(help="Seed.")] = 0,
    dispatch_dtype: Annotated[str, typer.Option(help="All-to-all dispatch dtype.")] = "bf16",
    profile: ProfileOpt = "derived",
    force: Annotated[bool, typer.Option(help="Overwrite --out.")] = False,
    json_out: bool = JsonOpt,
) -> None:
    """Phase diagram: gain of makespan-aware dispatch over the best proxy."""
    from cli.validate import parse_list
    from reports.dispatch_phase import phase_diagram, phase_figure_html

    if out.exists() and not force:
        raise fail(f"{out} exists; pass --force to overwrite it")
    tl = [int(v) for v in parse_list("tokens_per_gpu", tokens_per_gpu)]
    sl = parse_list("skews", skews)
    m, d, prof = _setup(model, hardware, profile)
    with progress(len(tl) * len(sl), "cells") as tick:
        diag = phase_diagram(
            m,
            d,
            num_gpus=gpus,
            gpus_per_node=gpus_per_node,
            tokens_per_gpu=tl,
            skews=sl,
            samples=samples,
            seed=seed,
            dispatch_dtype=dispatch_dtype,
            profile=prof,
            progress=tick,
        )
    write_atomic(out, phase_figure_html([diag]), force=force)
    if json_out:
        echo_json(diag)
        return
    typer.echo(f"{m.id} on {gpus}x {d.id} (EP over {diag.link}); wrote {out}")
    typer.echo(f"expert-block profile: {_profile_text(prof)}, n* = {diag.n_star_tokens:.0f}")
    rows = [
        [
            c.tokens_per_gpu,
            f"{c.skew:g}",
            c.regime,
            c.best_proxy,
            f"{c.proxy_spread:.2f}",
            f"{100 * c.block_gain:.1f}%",
            f"{100 * c.layer_gain:.1f}%",
            f"{100 * c.comm_share:.0f}%",
        ]
        for c in diag.cells
    ]
    typer.echo(
        table(
            rows,
            [
                "tokens/GPU",
                "skew",
                "regime",
                "best proxy",
                "spread",
                "block gain",
                "layer gain",
                "comm",
            ],
        )
    )
