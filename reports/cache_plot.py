"""Cache-budget figures: objective over the split grid and hit rate vs cache size.

Pure functions from results to a self-contained offline HTML page (plotly imported
lazily, ``include_plotlyjs=True``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from perfmodel.units import GiB
from solvers.cache.budget import CachePlan


@dataclass(frozen=True)
class HitCurve:
    """Hit ratio against cache size (objects) for one popularity and policy."""

    label: str
    sizes: np.ndarray
    hit_ratio: np.ndarray
    simulated: np.ndarray | None = None  # exact-simulation points at the same sizes


def _split_table(plan: CachePlan) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """Best objective per (KV, expert-or-adapter) cell over the remaining pool."""
    shape = tuple(len(s) for s in plan.grid_sizes)
    kv = plan.grid_sizes[0] / GiB
    second = plan.grid_sizes[1] if len(shape) > 1 else np.array([0.0])
    z = np.full((len(kv), len(second)), np.nan)
    for flat, ev in enumerate(plan.grid_evals):
        if ev is None or not ev.stable:
            continue
        idx = np.unravel_index(flat, shape)
        j = int(idx[1]) if len(shape) > 1 else 0
        v = ev.objective(plan.objective_kind)
        if plan.objective_kind == "tpot":
            v = -v * 1e3
        cur = z[int(idx[0]), j]
        better = v > cur if plan.objective_kind == "goodput" else v < cur
        if math.isnan(cur) or better:
            z[int(idx[0]), j] = v
    names = [plan.grid_pools[1] if len(shape) > 1 else "-"]
    return kv, second, z, names


def cache_figure(plan: CachePlan, curves: Sequence[HitCurve]) -> Any:
    """Two panels: objective over (KV GiB × second pool level); hit ratio vs size."""
    from plotly.subplots import make_subplots

    kv, second, z, names = _split_table(plan)
    title = "SLO goodput (req/s)" if plan.objective_kind == "goodput" else "mean TPOT (ms)"
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=(f"{title} by split (blank = unstable or over budget)", "hit ratio"),
    )
    fig.add_heatmap(
        x=[f"{v:g}" for v in second],
        y=[f"{v:.1f}" for v in kv],
        z=z,
        colorbar={"title": title, "x": 0.45},
        row=1,
        col=1,
    )
    fig.update_xaxes(title_text=f"{names[0]} level", row=1, col=1)
    fig.update_yaxes(title_text="KV cache (GiB)", row=1, col=1)
    for c in curves:
        fig.add_scatter(x=c.sizes, y=c.hit_ratio, mode="lines", name=c.label, row=1, col=2)
        if c.simulated is not None:
            fig.add_scatter(
                x=c.sizes,
                y=c.simulated,
                mode="markers",
                name=f"{c.label} (exact sim)",
                row=1,
                col=2,
            )
    fig.update_xaxes(title_text="cache size (objects per layer / adapters)", row=1, col=2)
    fig.update_yaxes(title_text="hit ratio", range=[0, 1], row=1, col=2)
    fig.update_layout(title="perfmodel cache curve", height=520, width=1200)
    return fig


def figure_html(fig: Any) -> str:
    """Self-contained offline HTML (plotly.js inlined)."""
    return str(fig.to_html(include_plotlyjs=True, full_html=True))
