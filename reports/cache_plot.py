"""Cache-budget figures: objective over the split grid and hit rate vs cache size.

Pure functions from results to a self-contained offline HTML page (plotly imported
lazily, ``include_plotlyjs=True``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from perfmodel.cache.hitrate import che_lru, che_lru_steps, static_hit_ratio, step_activation
from perfmodel.units import MS_PER_S, GiB
from perfmodel.workload.popularity import zipf_popularity
from solvers.cache.budget import CacheBudgetSpec, CachePlan


@dataclass(frozen=True)
class HitCurve:
    """Hit ratio against cache size (objects) for one popularity and policy."""

    label: str
    sizes: np.ndarray
    hit_ratio: np.ndarray
    simulated: np.ndarray | None = None  # exact-simulation points at the same sizes


@dataclass(frozen=True)
class CachePlanReport:
    """``perfmodel cache plan``'s answer: the split, and (with a figure) where it went
    and the hit-ratio curves it shows."""

    plan: CachePlan
    out: Path | None = None
    curves: tuple[HitCurve, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d = self.plan.to_dict()
        if self.out is not None:
            d["out"] = str(self.out)
            d["hit_curves"] = [
                {"name": c.label, "cache_size": c.sizes, "hit_ratio": c.hit_ratio}
                for c in self.curves
            ]
        return d


def hit_curves(spec: CacheBudgetSpec) -> list[HitCurve]:
    """Hit ratio vs cache size of the spec's expert cache (LRU by Che's approximation,
    one token per step, and static top-C) and adapter cache (LRU, Zipf popularity)."""
    curves = []
    if spec.offload_experts and spec.expert_activation is not None:
        assert spec.model.moe is not None
        e = spec.model.moe.num_experts
        sizes = np.unique(np.linspace(0, e, min(e, 32) + 1).round())
        a = step_activation(spec.expert_activation, 1.0)
        lru = np.array([che_lru_steps(a, c).hit_ratio for c in sizes])
        curves.append(HitCurve("experts, LRU (Che), 1 token/step", sizes, lru))
        top = np.array([static_hit_ratio(a, c) for c in sizes])
        curves.append(HitCurve("experts, static top-C", sizes, top))
    if spec.adapters:
        p = zipf_popularity(spec.adapters, spec.adapter_zipf)
        sizes = np.unique(np.geomspace(1, spec.adapters, 30).round())
        lru = np.array([che_lru(p, c).hit_ratio for c in sizes])
        curves.append(HitCurve("adapters, LRU (Che)", sizes, lru))
    return curves


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
            v = -v * MS_PER_S
        cur = z[int(idx[0]), j]
        better = v > cur if plan.objective_kind == "goodput" else v < cur
        if math.isnan(cur) or better:
            z[int(idx[0]), j] = v
    names = [plan.grid_pools[1] if len(shape) > 1 else "-"]
    return kv, second, z, names


def _grid_note(z: np.ndarray, plan: CachePlan, rate_per_s: float | None) -> str:
    """Say when the split panel has nothing to compare (empty or one value everywhere)."""
    vals = z[np.isfinite(z)]
    if vals.size == 0:
        return "<br>empty: no split is stable within the memory budget at this rate"
    if np.ptp(vals) <= 1e-9 * max(1.0, float(np.abs(vals).max())):
        capped = (
            plan.objective_kind == "goodput"
            and rate_per_s is not None
            and abs(float(vals[0]) - rate_per_s) <= 1e-6 * rate_per_s
        )
        why = (
            " (goodput is capped at the offered rate; raise --rate-per-s to compare splits)"
            if capped
            else ""
        )
        return f"<br>constant: {float(vals[0]):.3g} in every stable split{why}"
    return ""


def cache_figure(
    plan: CachePlan,
    curves: Sequence[HitCurve],
    *,
    title: str = "cache budget",
    rate_per_s: float | None = None,
) -> Any:
    """Two panels: objective over (KV GiB × second pool level); hit ratio vs size.

    ``title`` should name the model, device and rate; a split panel that is empty or
    constant says so in its title.
    """
    from plotly.subplots import make_subplots

    kv, second, z, names = _split_table(plan)
    what = "SLO goodput (req/s)" if plan.objective_kind == "goodput" else "mean TPOT (ms)"
    fig = make_subplots(
        rows=1,
        cols=2,
        horizontal_spacing=0.18,
        subplot_titles=(
            f"{what} by split (blank = unstable or over budget){_grid_note(z, plan, rate_per_s)}",
            "hit ratio",
        ),
    )
    dom1 = fig.layout.xaxis.domain[1]
    fig.add_heatmap(
        x=[f"{v:g}" for v in second],
        y=[f"{v:.1f}" for v in kv],
        z=z,
        text=[[("" if not np.isfinite(v) else f"{v:.3g}") for v in r] for r in z],
        texttemplate="%{text}",
        colorbar={"title": {"text": what}, "x": dom1 + 0.01, "thickness": 14},
        row=1,
        col=1,
    )
    fig.update_xaxes(title_text=f"{names[0]} level", type="category", row=1, col=1)
    fig.update_yaxes(title_text="KV cache (GiB)", type="category", row=1, col=1)
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
    if not curves:
        fig.add_annotation(
            text="no cached pool (no offloaded experts, no adapters)", showarrow=False,
            xref="x2 domain", yref="y2 domain", x=0.5, y=0.5,
        )  # fmt: skip
    fig.update_xaxes(title_text="cache size (objects per layer / adapters)", row=1, col=2)
    fig.update_yaxes(title_text="hit ratio", range=[0, 1], row=1, col=2)
    fig.update_layout(
        title={"text": title, "x": 0.02, "xanchor": "left"},
        height=560,
        width=1250,
        margin={"t": 120},
        showlegend=True,
        legend={"x": 1.0, "y": 1.0, "xanchor": "right", "bgcolor": "rgba(255,255,255,0.8)"},
    )
    return fig
