"""``perfmodel validate`` and ``perfmodel calibrate``: end-to-end error against measurements."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cli.common import JsonOpt, echo_json, handle_errors, table, write_atomic

EngineOpt = Annotated[
    str | None,
    typer.Option(
        "--engine",
        help="Engine id (trtllm, vllm, sglang, optionally @version), a TOML path, or 'none' "
        "for the engine-less model. Default: each row's own engine column.",
    ),
]


@handle_errors
def validate_cmd(
    data: Annotated[Path, typer.Option("--data", help="Measurements in the long CSV format.")],
    engine: EngineOpt = None,
    by: Annotated[
        str, typer.Option(help="Comma-separated summary keys (device, engine, model, metric).")
    ] = "device,engine,model,metric",
    out: Annotated[Path | None, typer.Option(help="Write a predicted-vs-measured HTML.")] = None,
    force: Annotated[bool, typer.Option(help="Overwrite --out.")] = False,
    json_out: bool = JsonOpt,
) -> None:
    """Predict every row of a measurement file and report the errors."""
    from perfmodel.validate.data import read_measurements
    from perfmodel.validate.predict import predict_rows
    from perfmodel.validate.summary import validation_report

    rows = read_measurements(data)
    res = predict_rows(rows, engine=engine)
    keys = [k.strip() for k in by.split(",") if k.strip()]
    rep = validation_report(res, by=keys, engine=engine)
    if out is not None:
        from reports.validate_plot import validation_html

        write_atomic(out, validation_html(res), force=force)
    if json_out:
        echo_json(rep)
        return
    groups, total = rep.groups, rep.total
    typer.echo(f"engine: {engine or 'per row (engine column)'}; {len(rows)} rows from {data}")
    typer.echo(
        table(
            [
                [
                    *g.group,
                    g.n,
                    100 * g.median_abs,
                    100 * g.p90_abs,
                    100 * g.signed_median,
                    g.unrepresentable,
                ]
                for g in groups
            ],
            [*keys, "n", "median |err| %", "p90 %", "signed median %", "unrepresentable"],
        )
    )
    typer.echo(
        f"all: n={total.n} median |err| {100 * total.median_abs:.1f} %, p90 "
        f"{100 * total.p90_abs:.1f} %, signed median {100 * total.signed_median:+.1f} %, "
        f"{total.unrepresentable} unrepresentable"
    )
    reasons: dict[str, int] = {}
    for r in res:
        if r.status != "ok":
            reasons[r.reason] = reasons.get(r.reason, 0) + 1
    for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
        typer.echo(f"unrepresentable ({n}): {reason}")


@handle_errors
def calibrate_cmd(
    data: Annotated[Path, typer.Option("--data", help="Measurements in the long CSV format.")],
    engine: Annotated[str, typer.Option("--engine", help="Engine id[@version] or TOML path.")],
    out: Annotated[Path, typer.Option("--out", help="Calibrated engine TOML to write.")],
    max_evals: Annotated[int, typer.Option(help="Optimizer evaluations per fit.")] = 15,
    max_rows: Annotated[int, typer.Option(help="Rows used per fit (even stride).")] = 120,
    cv: Annotated[bool, typer.Option(help="Leave-one-model/device-out error.")] = True,
    force: Annotated[bool, typer.Option(help="Overwrite --out.")] = False,
    json_out: bool = JsonOpt,
) -> None:
    """Fit an engine's free parameters to measurements; store the held-out error."""
    import tomli_w

    from hardware.engine import load_engine
    from perfmodel.datafile import read_data_file
    from perfmodel.errors import SpecError
    from perfmodel.validate.calibrate import calibrate, engine_toml_table, rows_for
    from perfmodel.validate.data import read_measurements

    start = load_engine(engine)
    rows = [m for m in rows_for(start, read_measurements(data)) if m.request_rate_per_s is None]
    if not rows:
        raise SpecError(f"{data}: no rows for engine {start.id}; check the engine column")
    cal = calibrate(start, rows, max_evals=max_evals, max_rows=max_rows, cv=cv)
    default = bool(read_data_file(start.path, what="engine").get("default", False))
    doc = engine_toml_table(cal, data=Path(data).name, default=default)
    header = (
        f"# {start.name}: calibrated by `perfmodel calibrate --engine {engine}` on "
        f"{Path(data).name} ({cal.rows} rows).\n"
    )
    write_atomic(out, header + tomli_w.dumps(doc), force=force)
    if json_out:
        echo_json(cal)
        return
    d = cal.to_dict()
    typer.echo(f"{start.id}: {cal.rows} rows -> {out}")
    typer.echo(
        table(
            [[k, v, *d["param_spread_over_folds"].get(k, ["", ""])] for k, v in cal.params.items()],
            ["parameter", "fitted", "fold min", "fold max"],
        )
    )
    for name in ("fit", "leave_one_model_out", "leave_one_device_out"):
        s = d[name]
        typer.echo(
            f"{name}: n={s['rows']} median |err| {s['median_abs_error_pct']:.1f} %, p90 "
            f"{s['p90_abs_error_pct']:.1f} %, signed {s['signed_median_error_pct']:+.1f} %"
        )
