"""Figures of a max-affine profile against the measurements it was fitted to.

Pure functions from arrays and profiles to plotly figures (plotly imported lazily);
:func:`reports.html.figure_html` turns a figure into a self-contained HTML page that
works offline (plotly.js embedded).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike

from hardware.maxaffine import MaxAffine
from perfmodel.units import US_PER_S

if TYPE_CHECKING:
    import plotly.graph_objects as go

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf")


@dataclass(frozen=True)
class PlotSummary:
    """What a profile figure shows: the expert block's n* (and its 95 % interval), or
    the number of measured points of a profile-mode slice."""

    n_star: float | None = None
    interval_95: tuple[float, float] | None = None
    points: int | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {}
        if self.n_star is not None:
            d["n_star"] = self.n_star
        if self.interval_95 is not None:
            d["interval_95"] = list(self.interval_95)
        if self.points is not None:
            d["points"] = self.points
        return d


def _name(profile: MaxAffine, k: int) -> str:
    return profile.piece_names[k] if profile.piece_names else f"piece {k}"


def _ax_x(x: float, log_x: bool) -> float:
    """An annotation's x: plotly places annotations on a log axis in log10 units (shapes in
    data units), so a data-unit x there lands at 10**x and stretches the axis to it."""
    return float(np.log10(x)) if log_x else float(x)


def band(
    fig: go.Figure, x0: float, x1: float, *, text: str, color: str, log_x: bool, right: bool = False
) -> None:
    """A translucent x-band with its label inside the top edge (log-axis safe)."""
    fig.add_vrect(x0=x0, x1=x1, fillcolor=color, opacity=0.08, line_width=0)
    fig.add_annotation(
        x=_ax_x(x1 if right else x0, log_x), xref="x", y=1.0, yref="paper", text=text,
        showarrow=False, xanchor="right" if right else "left", yanchor="top",
        font={"size": 11},
    )  # fmt: skip


def vline(fig: go.Figure, x: float, *, text: str, log_x: bool, dash: str = "dot") -> None:
    """A vertical line with a label just below the top of the plot (log-axis safe)."""
    fig.add_vline(x=x, line_dash=dash)
    fig.add_annotation(
        x=_ax_x(x, log_x), xref="x", y=0.93, yref="paper", text=text, showarrow=False,
        xanchor="left", yanchor="top", bgcolor="rgba(255,255,255,0.8)",
    )  # fmt: skip


def _shade_regimes(
    fig: go.Figure, x: np.ndarray, active: np.ndarray, profile: MaxAffine, *, log_x: bool
) -> None:
    """One translucent band per run of consecutive points with the same active piece."""
    start = 0
    for i in range(1, len(x) + 1):
        if i == len(x) or active[i] != active[start]:
            lo = x[start] if start == 0 else 0.5 * (x[start - 1] + x[start])
            hi = x[i - 1] if i == len(x) else 0.5 * (x[i - 1] + x[i])
            k = int(active[start])
            band(
                fig, float(lo), float(hi), text=_name(profile, k),
                color=PALETTE[k % len(PALETTE)], log_x=log_x,
            )  # fmt: skip
            start = i


def profile_figure(
    profile: MaxAffine,
    X: ArrayLike,
    y_s: ArrayLike,
    x: ArrayLike,
    *,
    x_label: str,
    title: str = "",
    crossover_x: float | None = None,
    log_x: bool = True,
) -> go.Figure:
    """Measured times and the profile along a 1-D slice ``x`` of the feature space.

    ``X`` holds the features of each measured point, ``x`` the value plotted on the axis
    (e.g. the GEMM's m at fixed n, k). Each piece is drawn where it was evaluated, the
    profile (their max) as a thick line, and the x-range where each piece is active is
    shaded. A profile with a residual surface also gets its corrected prediction (dotted).
    """
    import plotly.graph_objects as go

    Xa = np.asarray(X, dtype=np.float64)
    xa = np.asarray(x, dtype=np.float64)
    ya = np.asarray(y_s, dtype=np.float64)
    order = np.argsort(xa, kind="stable")
    xa, Xa, ya = xa[order], Xa[order], ya[order]
    pieces = profile.piece_times(Xa)
    fit = pieces.max(axis=-1)
    fig = go.Figure()
    fig.add_trace(go.Scatter(
        x=xa, y=ya * US_PER_S, mode="markers", name="measured",
        marker={"color": "black", "size": 6},
    ))  # fmt: skip
    for k in range(profile.pieces):
        fig.add_trace(go.Scatter(
            x=xa, y=pieces[:, k] * US_PER_S, mode="lines", name=_name(profile, k),
            line={"dash": "dash", "color": PALETTE[k % len(PALETTE)]},
        ))  # fmt: skip
    fig.add_trace(go.Scatter(
        x=xa, y=fit * US_PER_S, mode="lines", name="profile (max)",
        line={"width": 3, "color": "#444"},
    ))  # fmt: skip
    if profile.residual is not None:
        fig.add_trace(go.Scatter(
            x=xa, y=profile(Xa) * US_PER_S, mode="lines+markers",
            name="profile × measured residual", line={"dash": "dot", "color": "#c0392b"},
        ))  # fmt: skip
    _shade_regimes(fig, xa, pieces.argmax(axis=-1), profile, log_x=log_x)
    if crossover_x is not None and np.isfinite(crossover_x):
        vline(fig, crossover_x, text=f"n* = {crossover_x:.0f}", log_x=log_x)
    p = profile.provenance
    fig.update_layout(
        title=title or f"{p.op} on {p.device} ({p.source})",
        xaxis_title=x_label,
        yaxis_title="time (µs)",
        template="plotly_white",
    )
    if log_x:
        fig.update_xaxes(type="log", range=data_range(xa, log=True))
    else:
        fig.update_xaxes(range=data_range(xa, log=False))
    fig.update_yaxes(type="log")
    return fig


def data_range(x: np.ndarray, *, log: bool, pad: float = 0.04) -> list[float]:
    """An axis range spanning the data with a small margin (log10 units on a log axis)."""
    v = np.asarray(x, dtype=np.float64)
    v = v[np.isfinite(v) & (v > 0)] if log else v[np.isfinite(v)]
    if v.size == 0:
        return [0.0, 1.0]
    lo, hi = (np.log10(v.min()), np.log10(v.max())) if log else (v.min(), v.max())
    span = hi - lo if hi > lo else (abs(lo) or 1.0)
    return [float(lo - pad * span), float(hi + pad * span)]


def expert_block_figure(
    profile: MaxAffine,
    G: ArrayLike,
    N: ArrayLike,
    tokens_per_expert: ArrayLike,
    t_s: ArrayLike,
    *,
    n_star: float,
    interval: tuple[float, float] | None = None,
    title: str = "",
) -> go.Figure:
    """Expert-block time per activated expert vs tokens per expert, one colour per G.

    The weights regime (below n*) and the tokens regime (above) are shaded; n* and its
    interval are marked.
    """
    import plotly.graph_objects as go

    Ga, Na = np.asarray(G, float), np.asarray(N, float)
    na, ta = np.asarray(tokens_per_expert, float), np.asarray(t_s, float)
    fig = go.Figure()
    for j, g in enumerate(np.unique(Ga)):
        s = Ga == g
        o = np.argsort(na[s])
        X = np.stack([Ga[s][o], Na[s][o]], axis=-1)
        c = PALETTE[j % len(PALETTE)]
        fig.add_trace(go.Scatter(
            x=na[s][o], y=ta[s][o] * US_PER_S, mode="markers", name=f"measured, G={g:g}",
            marker={"color": c, "size": 6},
        ))  # fmt: skip
        fig.add_trace(go.Scatter(
            x=na[s][o], y=profile(X) * US_PER_S, mode="lines", name=f"profile, G={g:g}",
            line={"color": c},
        ))  # fmt: skip
        for k in range(profile.pieces):
            fig.add_trace(go.Scatter(
                x=na[s][o], y=profile.piece_times(X)[:, k] * US_PER_S, mode="lines",
                name=f"{_name(profile, k)}, G={g:g}", line={"color": c, "dash": "dot"},
                showlegend=j == 0,
            ))  # fmt: skip
    lo_x, hi_x = float(na.min()), float(na.max())
    if np.isfinite(n_star):
        band(fig, lo_x, n_star, text="weights regime", color=PALETTE[0], log_x=True)
        band(fig, n_star, hi_x, text="tokens regime", color=PALETTE[1], log_x=True, right=True)
        label = f"n* = {n_star:.0f}"
        if interval is not None:
            label += f" [{interval[0]:.0f}, {interval[1]:.0f}]"
        vline(fig, n_star, text=label, log_x=True, dash="dash")
    p = profile.provenance
    fig.update_layout(
        title=title or f"expert block {p.op} on {p.device}",
        xaxis_title="tokens per activated expert",
        yaxis_title="block time (µs)",
        template="plotly_white",
    )
    fig.update_xaxes(type="log", range=data_range(np.asarray(na), log=True))
    fig.update_yaxes(type="log")
    return fig
