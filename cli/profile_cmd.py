"""``perfmodel profile``: fit, show, crossover and plot max-affine cost profiles."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer

from cli.common import JsonOpt, echo_json, fail, handle_errors, progress, table, write_atomic
from perfmodel.errors import SpecError
from perfmodel.units import US_PER_S

app = typer.Typer(
    help="Max-affine cost profiles: fit to measurements, show, regime crossover, plot.",
    no_args_is_help=True,
)

GEMM_PRESET = "gemm"
MOE_PRESET = "moe"
#: Columns of a fused-MoE measurement CSV (aiconfigurator ``*__moe.csv``) used by the
#: ``moe`` feature preset.
MOE_COLUMNS = (
    "num_tokens", "hidden_size", "inter_size", "topk", "num_experts", "moe_tp_size",
    "moe_ep_size",
)  # fmt: skip


def _where(items: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for it in items or []:
        if "=" not in it:
            raise SpecError(f"--where takes column=value, got {it!r}")
        k, v = it.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def _features(data: Any, spec: str) -> tuple[tuple[str, ...], Any]:
    from hardware.maxaffine import GEMM_FEATURES, gemm_features
    from hardware.measurements import feature_matrix

    if spec.strip() == GEMM_PRESET:
        m, n, k = (data.numeric(c) for c in ("m", "n", "k"))
        return GEMM_FEATURES, gemm_features(m, n, k)
    if spec.strip() == MOE_PRESET:
        import numpy as np

        from perfmodel.moe.expert import MOE_LAYER_FEATURES, moe_layer_features

        c = {x: data.numeric(x) for x in MOE_COLUMNS}
        if "distribution" not in data.columns:
            raise SpecError("--features moe needs a 'distribution' column (routing)")
        src = data.columns.get("kernel_source")
        mats = (
            np.full(len(data), 3.0)
            if src is None
            else np.where(src == "moe_torch_flow_nongated", 2.0, 3.0)
        )
        X = moe_layer_features(
            c["num_tokens"], c["hidden_size"], c["inter_size"], c["topk"], c["num_experts"],
            c["moe_tp_size"], c["moe_ep_size"], data.columns["distribution"], mats=mats,
        )  # fmt: skip
        return MOE_LAYER_FEATURES, X
    exprs = [e.strip() for e in spec.split(",") if e.strip()]
    if not exprs:
        raise SpecError("--features needs at least one column or expression")
    return tuple(exprs), feature_matrix(data, exprs)


@app.command("fit")
@handle_errors
def fit_cmd(
    data: Annotated[Path, typer.Option(help="Measurements CSV.")],
    features: Annotated[
        str,
        typer.Option(
            help="Comma-separated columns or expressions (pad(m)*n*k, m*(n+k), log2(k)), "
            "'gemm' for the GEMM features from columns m, n, k, or 'moe' for the fused "
            "MoE-layer features (per-GPU expert loads rebuilt from the routing columns)."
        ),
    ],
    time_col: Annotated[str, typer.Option(help="Time column (unit from its suffix).")],
    hardware: Annotated[str, typer.Option(help="Device id or TOML the data were measured on.")],
    out: Annotated[Path, typer.Option(help="Profile TOML to write.")],
    pieces: Annotated[
        int | None, typer.Option(help="Number of pieces (default: chosen by held-out error).")
    ] = None,
    where: Annotated[
        list[str] | None, typer.Option(help="Keep rows with column=value (repeatable).")
    ] = None,
    group_cols: Annotated[
        str, typer.Option(help="Columns whose values define a held-out group (e.g. n,k).")
    ] = "",
    time_unit: Annotated[str | None, typer.Option(help="s, ms, us or ns.")] = None,
    op: Annotated[str, typer.Option(help="Op name stored in the profile.")] = "op",
    dtype: Annotated[str, typer.Option(help="Math dtype of the measurements.")] = "bf16",
    seed: Annotated[int, typer.Option(help="Seed of the restarts and folds.")] = 0,
    residual: Annotated[
        bool,
        typer.Option(
            help="Also store the measured residual surface: predictions near the measured "
            "rows are corrected by their nearest neighbours' log-ratio (the file then holds "
            "one row per measurement; pieces and crossovers are unchanged)."
        ),
    ] = False,
    force: Annotated[bool, typer.Option(help="Overwrite --out.")] = False,
    json_out: bool = JsonOpt,
) -> None:
    """Fit a max-affine profile to a CSV and write it as TOML with provenance."""
    import numpy as np

    from hardware.device import load_device
    from hardware.fit import fit_profile
    from hardware.folds import fit_steps
    from hardware.measurements import check_one_dtype, read_measurements
    from hardware.profile_io import profile_to_toml

    if pieces is not None and pieces < 1:
        raise fail(f"--pieces must be >= 1, got {pieces}")
    dev = load_device(hardware)
    meas = read_measurements(str(data), time_col=time_col, time_unit=time_unit, where=_where(where))
    check_one_dtype(meas)
    names, X = _features(meas, features)
    groups = None
    if group_cols:
        cols = [c.strip() for c in group_cols.split(",") if c.strip()]
        missing = [c for c in cols if c not in meas.columns]
        if missing:
            raise SpecError(f"--group-cols: no column(s) {missing} in {data}")
        groups = np.array(["|".join(v) for v in zip(*(meas.columns[c] for c in cols), strict=True)])
    with progress(fit_steps(pieces=pieces, residual=residual), "fitting") as step:
        res = fit_profile(
            X, meas.time_s, features=names, groups=groups, pieces=pieces, seed=seed,
            device=dev.id, op=op, dtype=dtype, source=data.name, progress=step,
            residual=residual,
        )  # fmt: skip
    write_atomic(out, profile_to_toml(res.profile), force=force)
    if json_out:
        from reports.written import Written

        echo_json(Written(out, res))
        return
    held = "n/a" if res.heldout_mdape_pct is None else f"{res.heldout_mdape_pct:.2f}%"
    typer.echo(
        f"fitted {res.pieces} piece(s) to {res.rows} rows ({res.groups} groups) on {dev.id}: "
        f"train MdAPE {res.train_mdape_pct:.2f}%, held-out {held}; wrote {out}"
    )
    if res.residual_heldout_mdape_pct is not None:
        typer.echo(
            f"with the residual surface ({res.profile.residual.rows if res.profile.residual else 0}"
            f" rows): train MdAPE {res.residual_train_mdape_pct:.2f}%, held-out "
            f"{res.residual_heldout_mdape_pct:.2f}%"
        )
        if (
            res.heldout_mdape_pct is not None
            and res.residual_heldout_mdape_pct >= res.heldout_mdape_pct
        ):
            typer.echo(
                "note: the residual surface does not lower the held-out error here (the "
                "max-affine form already fits, or the rows are too sparse for neighbours "
                "to agree); fit without --residual"
            )


@app.command("show")
@handle_errors
def show_cmd(
    profile: Annotated[str, typer.Argument(help="Profile TOML path or <device>:<op>.")],
    hardware: Annotated[
        str | None, typer.Option(help="Check that the profile is for this device.")
    ] = None,
    json_out: bool = JsonOpt,
) -> None:
    """Print a profile's pieces and provenance."""
    from hardware.profile_io import load_profile

    dev_id = None
    if hardware is not None:
        from hardware.device import load_device

        dev_id = load_device(hardware).id
    prof = load_profile(profile, device=dev_id)
    if json_out:
        echo_json(prof)
        return
    p = prof.provenance
    typer.echo(f"{p.op} on {p.device} ({p.dtype}); source {p.source}, {p.rows} rows")
    if p.train_mape is not None:
        held = "n/a" if p.heldout_mape is None else f"{p.heldout_mape:.2f}%"
        typer.echo(f"MdAPE train {p.train_mape:.2f}%, held-out {held}")
    if prof.residual is not None:
        rh = "n/a" if p.residual_heldout_mape is None else f"{p.residual_heldout_mape:.2f}%"
        typer.echo(
            f"residual surface: {prof.residual.rows} measured rows, {prof.residual.neighbours} "
            f"neighbours; full within {prof.residual.radius:.3g} of a measured row, none "
            f"beyond {2 * prof.residual.radius:.3g} (standardized log-feature units); "
            f"held-out MdAPE with it {rh}"
        )
    rows = [
        [prof.piece_names[k] if prof.piece_names else str(k), prof.intercepts_s[k] * US_PER_S]
        + [float(v) for v in prof.slopes[k]]
        for k in range(prof.pieces)
    ]
    typer.echo(table(rows, ["piece", "intercept_us", *(f"s/{f}" for f in prof.features)]))


def _gemm_data(path: Path) -> Any:
    from hardware.measurements import read_measurements

    meas = read_measurements(str(path), time_col="latency_ms", where={"gemm_dtype": "bfloat16"})
    return tuple(meas.numeric(c) for c in ("m", "n", "k")), meas.time_s


@app.command("crossover")
@handle_errors
def crossover_cmd(
    hardware: Annotated[str, typer.Option(help="Device id or TOML.")],
    model: Annotated[str, typer.Option(help="MoE model id or config.json (expert shape).")],
    tp: Annotated[int, typer.Option(help="Tensor-parallel split of each expert.")] = 1,
    data: Annotated[
        Path | None,
        typer.Option(help="bf16 GEMM CSV measured on --hardware (columns m,n,k,latency_ms)."),
    ] = None,
    padded: Annotated[bool, typer.Option(help="N counts 128-row tiles.")] = True,
    boots: Annotated[int, typer.Option(help="Bootstrap resamples for the interval.")] = 200,
    seed: Annotated[int, typer.Option(help="Bootstrap seed.")] = 0,
    out: Annotated[
        Path | None,
        typer.Option(help="Write the fitted expert-block profile (TOML; needs --data)."),
    ] = None,
    force: Annotated[bool, typer.Option(help="Overwrite --out.")] = False,
    json_out: bool = JsonOpt,
) -> None:
    """n*: tokens per activated expert where weight streaming and compute cost meet.

    With ``--data``, the block ``max(a + b·G, c + β·N)`` is fitted to the GEMM rows of
    the expert's two GEMMs; 25 % of the token counts are held out whole to report its
    held-out error, and n* gets a bootstrap interval.
    """
    from hardware.device import load_device
    from perfmodel.model import load_model
    from perfmodel.moe.expert import (
        crossover_interval,
        crossover_tokens,
        derived_expert_profile,
        expert_block_provenance,
        expert_shape,
        gemm_block_rows,
    )
    from perfmodel.moe.report import CrossoverReport

    if tp < 1 or boots < 0:
        raise fail("--tp must be >= 1 and --boots >= 0")
    if out is not None and data is None:
        raise fail("--out writes the fitted profile: give --data too")
    if out is not None and out.exists() and not force:
        raise FileExistsError(f"{out} exists; pass --force to overwrite it")
    dev = load_device(hardware)
    m = load_model(model)
    h, inter, mats = expert_shape(m, tp)
    derived = derived_expert_profile(dev, h, inter, mats=mats)
    rep = CrossoverReport(dev.id, m.id, h, inter, mats, crossover_tokens(derived))
    if data is not None:
        (gm, gn, gk), t = _gemm_data(data)
        G, N, per, ts = gemm_block_rows(
            gm, gn, gk, t, hidden=h, inter=inter, mats=mats, padded=padded
        )
        prov = expert_block_provenance(
            G, N, per, ts, device=dev.id, op=f"moe_expert_{h}x{inter}x{mats}",
            source=data.name, seed=seed, padded=padded,
        )  # fmt: skip
        with progress(boots, "bootstrap") as step:
            c = crossover_interval(G, N, ts, boots=boots, seed=seed, provenance=prov, progress=step)
        if out is not None:
            from hardware.profile_io import profile_to_toml

            write_atomic(out, profile_to_toml(c.profile), force=force)
        rep = replace(rep, fitted=c, provenance=prov, padded=padded, out=out)
    if json_out:
        echo_json(rep)
        return
    typer.echo(
        f"{m.id} expert {h}x{inter} ({mats} matrices) on {dev.id}: derived n* = "
        f"{rep.derived_n_star:.0f} tokens/expert (roofline)"
    )
    if data is not None and rep.fitted is not None:
        c = rep.fitted
        typer.echo(
            f"fitted to {data.name}: n* = {c.n_star:.0f} [{c.lo:.0f}, {c.hi:.0f}] "
            f"(95% bootstrap, {c.boots} resamples; N {'padded' if padded else 'raw'})"
        )


@app.command("plot")
@handle_errors
def plot_cmd(
    data: Annotated[Path, typer.Option(help="Measurements CSV.")],
    out: Annotated[Path, typer.Option(help="HTML file to write.")],
    hardware: Annotated[str | None, typer.Option(help="Device id (expert mode).")] = None,
    model: Annotated[str | None, typer.Option(help="MoE model: plot its expert block.")] = None,
    profile: Annotated[str | None, typer.Option(help="Profile TOML or <device>:<op>.")] = None,
    features: Annotated[str, typer.Option(help="Features as in `profile fit`.")] = GEMM_PRESET,
    time_col: Annotated[str, typer.Option(help="Time column.")] = "latency_ms",
    x_col: Annotated[str, typer.Option(help="Column on the x axis.")] = "m",
    where: Annotated[list[str] | None, typer.Option(help="Row filter column=value.")] = None,
    force: Annotated[bool, typer.Option(help="Overwrite --out.")] = False,
    json_out: bool = JsonOpt,
) -> None:
    """Measurements vs fitted pieces, regimes shaded, as a self-contained HTML file.

    Expert mode (``--hardware --model``, GEMM CSV): the expert block and its n*.
    Profile mode (``--profile``): a slice of the data (``--where``) along ``--x-col``.
    """
    from reports.html import figure_html
    from reports.profile_plot import PlotSummary, expert_block_figure, profile_figure

    if out.exists() and not force:
        raise FileExistsError(f"{out} exists; pass --force to overwrite it")
    if model is not None:
        if hardware is None:
            raise fail("expert mode needs --hardware with --model")
        from hardware.device import load_device
        from perfmodel.model import load_model
        from perfmodel.moe.expert import (
            crossover_interval,
            expert_block_provenance,
            expert_shape,
            gemm_block_rows,
        )

        dev = load_device(hardware)
        h, inter, mats = expert_shape(load_model(model))
        boots = 100
        with progress(boots + 2, "fitting") as step:
            (gm, gn, gk), t = _gemm_data(data)
            G, N, per, ts = gemm_block_rows(gm, gn, gk, t, hidden=h, inter=inter, mats=mats)
            step(1)
            prov = expert_block_provenance(
                G, N, per, ts, device=dev.id, op=f"moe_expert_{h}x{inter}x{mats}",
                source=data.name,
            )  # fmt: skip
            step(1)
            c = crossover_interval(G, N, ts, boots=boots, provenance=prov, progress=step)
        fig = expert_block_figure(c.profile, G, N, per, ts, n_star=c.n_star, interval=(c.lo, c.hi))
        summary = PlotSummary(n_star=c.n_star, interval_95=(c.lo, c.hi))
    else:
        if profile is None:
            raise fail("give --profile (profile mode) or --hardware and --model (expert mode)")
        from hardware.measurements import read_measurements
        from hardware.profile_io import load_profile

        prof = load_profile(profile)
        with progress(2, "plotting") as step:
            meas = read_measurements(str(data), time_col=time_col, where=_where(where))
            names, X = _features(meas, features)
            step(1)
            if tuple(names) != tuple(prof.features):
                raise fail(f"--features give {names}, the profile uses {prof.features}")
            fig = profile_figure(prof, X, meas.time_s, meas.numeric(x_col), x_label=x_col)
            step(1)
        summary = PlotSummary(points=len(meas))
    write_atomic(out, figure_html(fig), force=force)
    if json_out:
        from reports.written import Written

        echo_json(Written(out, summary))
    else:
        typer.echo(f"wrote {out}")
