"""The PD phase diagrams' figure: per diagram a gain heatmap with the regime, the P:D
ratio and the boundary (:mod:`reports.pd_plot` computes the diagrams)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from reports.html import figure_html
from reports.pd_plot import PDPhaseDiagram

_SHORT = {
    "disaggregated": "PD",
    "colocated": "CO",
    "disaggregated-only": "PD only",
    "colocated-only": "CO only",
    "infeasible": "none",
}


def _panel_note(z: list[list[float | None]]) -> str:
    """' — empty: ...' or ' — constant: ...' for a panel that has nothing to compare."""
    vals = [v for r in z for v in r if v is not None]
    if not vals:
        return " — empty: no cell has a value (neither side meets the SLOs)"
    if max(vals) == min(vals):
        return f" — constant: {vals[0]:.2f} in every cell"
    return ""


#: Past this many columns a gain cell shows only its gain (the regime is its colour and
#: the boundary; the hover text has both): a 20-column grid has no room for more.
TERSE_COLUMNS = 8


def phase_figure(diagrams: Sequence[PDPhaseDiagram]) -> Any:
    """Per diagram, a heatmap of the gain (log2) annotated with the regime and the P:D GPU
    ratio (the gain only on wide grids), and a heatmap of the P:D GPU ratio. Cells sit
    at integer positions so that the boundary runs along cell edges, never through a
    cell's text."""
    import math

    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    n = len(diagrams)
    grids = []
    for d in diagrams:
        gz, rz, text, shown = [], [], [], []
        terse = len(d.xs) > TERSE_COLUMNS
        for y in d.ys:
            g_row, r_row, t_row, s_row = [], [], [], []
            for x in d.xs:
                c = d.cell(x, y)
                g_row.append(math.log2(c.gain) if c.gain else None)
                r_row.append(c.gpu_ratio)
                ratio = f"P:D {c.gpu_ratio:.2f}" if c.gpu_ratio is not None else ""
                gain = f"{c.gain:.2f}x" if c.gain else ""
                t_row.append(f"{_SHORT[c.regime]} {gain}<br>{ratio}")
                s_row.append((f"{c.gain:.2f}" if c.gain else _SHORT[c.regime]) if terse else "")
            gz.append(g_row)
            rz.append(r_row)
            text.append(t_row)
            shown.append(s_row)
        grids.append((gz, rz, shown if terse else text, text))
    titles = []
    for d, (gz, rz, _, _) in zip(diagrams, grids, strict=True):
        titles += [
            f"{d.model} on {d.device}: disaggregation gain<br>({d.context}){_panel_note(gz)}",
            f"optimal prefill:decode GPU ratio{_panel_note(rz)}",
        ]
    fig = make_subplots(
        rows=n, cols=2, subplot_titles=titles, horizontal_spacing=0.2, vertical_spacing=0.2
    )
    dom1 = fig.layout.xaxis.domain[1]
    gap = 0.2 if n > 1 else 0.0
    panel = (1.0 - gap * (n - 1)) / n
    for row, (d, (gz, rz, text, hover)) in enumerate(zip(diagrams, grids, strict=True), start=1):
        xi, yi = list(range(len(d.xs))), list(range(len(d.ys)))
        mid = 1.0 - (row - 1) * (panel + gap) - panel / 2
        bar = {"len": panel * 0.9, "y": mid, "thickness": 14}
        fig.add_trace(
            go.Heatmap(
                z=gz, x=xi, y=yi, text=text, texttemplate="%{text}", colorscale="RdBu",
                zmid=0, colorbar={**bar, "title": {"text": "log2 gain"}, "x": dom1 + 0.01},
                customdata=hover, hovertemplate="%{customdata}<extra></extra>",
            ),
            row=row, col=1,
        )  # fmt: skip
        fig.add_trace(
            go.Heatmap(
                z=rz, x=xi, y=yi, text=[[f"{v:.2f}" if v else "" for v in r] for r in rz],
                texttemplate="%{text}", colorscale="Viridis",
                colorbar={**bar, "title": {"text": "P:D GPUs"}, "x": 1.01},
            ),
            row=row, col=2,
        )  # fmt: skip
        bx: list[float | None] = []
        by: list[float | None] = []
        for (_x, top), i in zip(d.boundary(), xi, strict=True):
            if top is None:
                bx.append(None)
                by.append(None)
                continue
            j = list(d.ys).index(top) + 0.5  # the top edge of the last cell PD wins
            bx += [i - 0.5, i + 0.5]
            by += [j, j]
        if any(v is not None for v in bx):
            fig.add_trace(
                go.Scatter(
                    x=bx, y=by, mode="lines", line={"color": "black", "width": 3},
                    name="PD wins up to here", hoverinfo="skip",
                ),
                row=row, col=1,
            )  # fmt: skip
        for col in (1, 2):
            fig.update_xaxes(
                title_text=d.x_label, tickvals=xi, ticktext=[d.shown(x) for x in d.xs],
                range=[-0.5, len(xi) - 0.5], row=row, col=col,
            )  # fmt: skip
            fig.update_yaxes(
                title_text=d.y_label, tickvals=yi, ticktext=[d.shown(y) for y in d.ys],
                range=[-0.5, len(yi) - 0.5], row=row, col=col,
            )  # fmt: skip
    fig.update_layout(
        height=500 * n + 100,
        width=1300,
        margin={"t": 140, "r": 110},
        showlegend=False,  # the title says what the black line is
        title={
            "text": "Prefill/decode disaggregation vs colocated chunked prefill: goodput per "
            "GPU<br><sup>PD = disaggregation wins, CO = colocated wins; black line: the "
            "largest y at which disaggregation still wins, per column</sup>",
            "x": 0.02,
            "xanchor": "left",
        },
    )
    return fig


def phase_figure_html(diagrams: Sequence[PDPhaseDiagram]) -> str:
    """Self-contained HTML of :func:`phase_figure` (plotly.js embedded: works offline)."""
    return figure_html(phase_figure(diagrams))
