"""The stability phase diagram as a plotly figure and self-contained HTML (from a sweep)."""

from __future__ import annotations

from typing import Any

from reports.html import figure_html
from reports.stability_result import StabilityPhase

REGIMES = ("slo-feasible", "stable", "unstable")

LABELLED_COLUMNS = 40  # at most this many rates per panel: each cell shows its margin

# green / amber / red: told apart by hue and lightness (not two greens)
_COLORS = {"slo-feasible": "#1a9850", "stable": "#fdd65c", "unstable": "#d73027"}


def _add_sim_points(fig: Any, p: Any, col: int) -> None:
    """Simulated points, open circles where the simulator found the rate stable, open
    squares where not; black where it agrees with the formula (legend on panel 1)."""
    import plotly.graph_objects as go

    show = col == 1
    # open symbols: the cell's margin label stays readable inside the marker
    for stable_sim, symbol, label in (
        (True, "circle-open", "stable"),
        (False, "square-open", "unstable"),
    ):
        pts = [pt for pt in p.points if pt.simulated_stable == stable_sim]
        fig.add_trace(
            go.Scatter(
                x=[pt.rate_per_s for pt in pts],
                y=[pt.y for pt in pts],
                mode="markers",
                marker={
                    "symbol": symbol,
                    "size": 22,
                    "color": ["black" if pt.agrees else "magenta" for pt in pts],
                    "line": {"width": 2},
                },
                name=f"simulated: {label} (magenta: disagrees with the formula)",
                legendgroup=f"sim-{label}",
                showlegend=show,
                customdata=[
                    [pt.utilization, pt.queue_growth_per_s, pt.throughput_per_s] for pt in pts
                ],
                hovertemplate="simulated λ = %{x:.3g} req/s (ρ = %{customdata[0]:.2f})"
                "<br>queue growth %{customdata[1]:.3g} req/s<br>throughput "
                "%{customdata[2]:.3g} req/s<extra></extra>",
            ),
            row=1,
            col=col,
        )


def stability_figure(phase: StabilityPhase) -> Any:
    """Plotly figure: one heatmap per panel (regime colour, margin in each cell), the
    boundary ``μ`` and the goodput as lines, simulated points as markers."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(
        rows=1,
        cols=len(phase.panels),
        subplot_titles=[f"arrival rate × {p.y_label}" for p in phase.panels],
        horizontal_spacing=0.08,
    )
    code = {r: i for i, r in enumerate(REGIMES)}
    scale = []
    for i, r in enumerate(REGIMES):
        scale += [[i / len(REGIMES), _COLORS[r]], [(i + 1) / len(REGIMES), _COLORS[r]]]
    for col, p in enumerate(phase.panels, start=1):
        ys = [r.y for r in p.rows]
        nx = len(p.rates_per_s)
        z = [[code[p.cell(i, j).regime] for j in range(nx)] for i in range(len(ys))]
        detail = [
            [
                f"{p.cell(i, j).regime}<br>margin {p.cell(i, j).margin:+.0%}<br>"
                f"ρ = {p.cell(i, j).utilization:.2f}<br>{p.cell(i, j).binding}-bound"
                for j in range(nx)
            ]
            for i in range(len(ys))
        ]
        fig.add_trace(
            go.Heatmap(
                x=list(p.rates_per_s),
                y=ys,
                z=z,
                zmin=-0.5,
                zmax=len(REGIMES) - 0.5,
                colorscale=scale,
                showscale=False,
                opacity=0.85,
                # the regime is the colour; the label is the margin to the edge (on a
                # coarse grid only: a fine one has no room, the hover gives it)
                text=[[f"{p.cell(i, j).margin:+.0%}" for j in range(nx)] for i in range(len(ys))]
                if nx <= LABELLED_COLUMNS
                else None,
                texttemplate="%{text}" if nx <= LABELLED_COLUMNS else None,
                textfont={"size": 9},
                customdata=detail,
                hovertemplate="λ = %{x:.3g} req/s<br>y = %{y:.4g}<br>%{customdata}<extra></extra>",
            ),
            row=1,
            col=col,
        )
        show = col == 1
        fig.add_trace(
            go.Scatter(
                x=[r.service_rate_per_s for r in p.rows],
                y=ys,
                mode="lines",  # no markers: they would cover the cell labels
                line={"color": "black", "width": 2.5},
                name="μ = min(compute, memory): stability boundary",
                legendgroup="mu",
                showlegend=show,
                customdata=[[r.binding, r.compute_rate_per_s, r.memory_rate_per_s] for r in p.rows],
                hovertemplate="μ = %{x:.3g} req/s (%{customdata[0]}-bound; compute "
                "%{customdata[1]:.3g}, memory %{customdata[2]:.3g})<extra></extra>",
            ),
            row=1,
            col=col,
        )
        feas = [r for r in p.rows if r.slo_feasible]
        fig.add_trace(
            go.Scatter(
                x=[r.goodput_per_s for r in feas],
                y=[r.y for r in feas],
                mode="lines",
                line={"color": "#08519c", "dash": "dash", "width": 2},
                name=f"goodput (SLO p{phase.slo.percentile * 100:g}, goal {phase.slo.goal:.0%})",
                legendgroup="goodput",
                showlegend=show,
                hovertemplate="goodput %{x:.3g} req/s<extra></extra>",
            ),
            row=1,
            col=col,
        )
        _add_sim_points(fig, p, col)
        fig.update_xaxes(title_text="arrival rate (req/s)", type="log", row=1, col=col)
        fig.update_yaxes(title_text=p.y_label, type="log", row=1, col=col)
    fig.update_layout(
        title=f"Stability of {phase.model} on {phase.tp}x {phase.device}, workload "
        f"{phase.workload}, engine {phase.engine}<br><sup>green = meets the SLO, amber = "
        "stable but misses the SLO, red = unstable (cell text: margin 1 − λ/μ)</sup>",
        height=640,
        width=1350,
        margin={"t": 110},
        legend={"orientation": "h", "y": -0.15},
    )
    return fig


def stability_html(phase: StabilityPhase) -> str:
    """Self-contained offline HTML of :func:`stability_figure`."""
    return figure_html(stability_figure(phase))
