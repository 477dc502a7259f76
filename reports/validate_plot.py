"""Predicted vs measured scatter per device, with the identity line (``validate --out``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from perfmodel.validate.predict import RowResult
from reports.html import figure_html


def validation_figure(results: Sequence[RowResult]) -> Any:
    """One log-log panel per device: a point per representable row, coloured by metric."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    ok = [r for r in results if r.predicted is not None]
    devices = sorted({r.measurement.device for r in ok})
    fig = make_subplots(rows=1, cols=max(len(devices), 1), subplot_titles=devices or ["no rows"])
    metrics = sorted({r.measurement.metric for r in ok})
    for col, dev in enumerate(devices, start=1):
        rows = [r for r in ok if r.measurement.device == dev]
        lo = min(min(r.measurement.value, r.predicted or 0) for r in rows)
        hi = max(max(r.measurement.value, r.predicted or 0) for r in rows)
        for met in metrics:
            sel = [r for r in rows if r.measurement.metric == met]
            if not sel:
                continue
            fig.add_trace(
                go.Scatter(
                    x=[r.measurement.value for r in sel],
                    y=[r.predicted for r in sel],
                    mode="markers",
                    name=f"{dev} {met}",
                    text=[
                        f"{r.measurement.model} {r.measurement.engine} tp{r.measurement.tp} "
                        f"{r.measurement.isl}/{r.measurement.osl} b={r.measurement.batch_size}"
                        for r in sel
                    ],
                ),
                row=1,
                col=col,
            )
        fig.add_trace(
            go.Scatter(
                x=[lo, hi],
                y=[lo, hi],
                mode="lines",
                name="identity",
                showlegend=col == 1,
                line={"dash": "dash", "color": "gray"},
            ),
            row=1,
            col=col,
        )
        fig.update_xaxes(type="log", title_text="measured", row=1, col=col)
        fig.update_yaxes(type="log", title_text="predicted", row=1, col=col)
    fig.update_layout(
        title="perfmodel validate: predicted vs measured",
        height=520,
        width=420 * max(len(devices), 1),
    )
    return fig


def validation_html(results: Sequence[RowResult]) -> str:
    """Self-contained offline HTML (plotly.js inlined)."""
    return figure_html(validation_figure(results))
