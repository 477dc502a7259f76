"""Phase diagram of makespan-aware expert dispatch over tokens per GPU × routing skew.

For one model on one device with expert parallelism over ``num_gpus`` GPUs (inside a
node: the scale-up link; across nodes: the scale-out NIC), each cell draws seeded
Zipf batches (``perfmodel.routing``), places experts with EPLB from the expected load
(``solvers.eplb``; ``redundant_per_gpu`` extra slots per GPU), and dispatches each
batch with the three proxies and the heuristic (``solvers.dispatch``; it starts from
each proxy too, so it is never worse than the best of them). Times:

* expert block: the max-affine profile (derived from the roofline unless given);
* communication: all-to-all dispatch + combine (``hardware.comm`` via
  ``solvers.ep_comm.ep_comm``), independent of the dispatcher (senders balanced);
* shared expert (if the model has one): the same profile family at G = 1, N = the
  GPU's tokens (tile-padded), identical on every GPU.

MoE layer time = dispatch + max_g expert block + shared expert + combine (attention and
the dense part of the layer are not included). Each cell carries the regime, the gain
of the heuristic over the best proxy (block and layer), which proxy won, the spread
between proxies and the share of layer time spent communicating.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from hardware.device import Device
from hardware.maxaffine import MaxAffine, Provenance
from hardware.roofline import GEMM_M_TILE
from perfmodel.dtypes import get_dtype
from perfmodel.errors import SpecError
from perfmodel.model import ModelSpec
from perfmodel.moe.ep_comm import ep_comm, ep_link
from perfmodel.moe.expert import crossover_tokens, derived_expert_profile, expert_shape
from perfmodel.moe.routing import expert_popularity, sample_counts
from reports.html import figure_html
from solvers.dispatch.solve import PROXIES, DispatchProblem, Placement, dispatch, dispatch_heuristic
from solvers.placement.eplb import rebalance_experts

DEFAULT_TOKENS_PER_GPU = (16, 32, 64, 128, 256, 512, 1024, 2048)
DEFAULT_SKEWS = (0.0, 0.5, 1.0, 1.5)
COMM_DOMINATED_SHARE = 0.5


@dataclass(frozen=True)
class PhaseCell:
    """One (tokens per GPU, skew) cell, averaged over the samples."""

    tokens_per_gpu: int
    skew: float
    regime: str  # comm-dominated | weights | tokens | mixed
    hot_expert_share: float  # activated experts with load >= n*
    proxy_block_s: dict[str, float]
    best_proxy: str
    heuristic_block_s: float
    block_gain: float  # 1 − heuristic / best proxy (expert block)
    proxy_spread: float  # slowest / fastest proxy (expert block)
    comm_s: float
    shared_s: float
    layer_best_proxy_s: float
    layer_heuristic_s: float
    layer_gain: float
    comm_share: float  # comm / heuristic layer time

    @property
    def margin(self) -> float:
        """Signed distance to the comm-dominated boundary, ``comm_share − 0.5`` (> 0: the
        all-to-all takes at least half the layer time)."""
        return self.comm_share - COMM_DOMINATED_SHARE

    def to_dict(self) -> dict[str, Any]:
        return {**vars(self), "margin": self.margin}


@dataclass(frozen=True)
class PhaseDiagram:
    model: str
    device: str
    num_gpus: int
    gpus_per_node: int
    link: str
    slots_per_gpu: int
    n_star_tokens: float
    dispatch_dtype: str
    tokens_per_gpu: tuple[int, ...]
    skews: tuple[float, ...]
    cells: tuple[PhaseCell, ...] = field(repr=False)
    #: the expert-block profile the cells were costed with
    profile: Provenance | None = None

    def cell(self, tokens_per_gpu: int, skew: float) -> PhaseCell:
        for c in self.cells:
            if c.tokens_per_gpu == tokens_per_gpu and abs(c.skew - skew) < 1e-12:
                return c
        raise KeyError((tokens_per_gpu, skew))

    @property
    def max_layer_gain(self) -> float:
        return max(c.layer_gain for c in self.cells)

    @property
    def min_layer_gain(self) -> float:
        return min(c.layer_gain for c in self.cells)

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in vars(self).items() if k not in ("cells", "profile")}
        d["cells"] = [c.to_dict() for c in self.cells]
        d["profile"] = None if self.profile is None else self.profile.summary()
        return d


def _regime(comm_share: float, hot_share: float) -> str:
    if comm_share >= COMM_DOMINATED_SHARE:
        return "comm-dominated"
    if hot_share <= 0.0:
        return "weights"
    if hot_share >= 1.0:
        return "tokens"
    return "mixed"


def _mean_blocks(
    counts: NDArray[np.int64], pl: Placement, prof: MaxAffine, tile_rows: int, n_star: float
) -> tuple[dict[str, float], float, float]:
    """Mean expert-block makespan per proxy and of the heuristic over the load samples,
    and the mean share of activated experts past the crossover ``n*``."""
    blocks: dict[str, list[float]] = {m: [] for m in (*PROXIES, "heuristic")}
    hot = []
    for c in counts:
        prob = DispatchProblem(c.astype(np.float64), pl, prof, tile_rows)
        res = {m: dispatch(prob, m) for m in PROXIES}
        res["heuristic"] = dispatch_heuristic(prob)
        for m in blocks:
            blocks[m].append(res[m].makespan_s)
        act = c[c > 0]
        hot.append(float(np.mean(act >= n_star)) if len(act) else 0.0)
    pb = {m: float(np.mean(blocks[m])) for m in PROXIES}
    return pb, float(np.mean(blocks["heuristic"])), float(np.mean(hot))


def phase_diagram(
    model: ModelSpec,
    device: Device,
    *,
    num_gpus: int,
    gpus_per_node: int = 8,
    redundant_per_gpu: int = 2,
    tokens_per_gpu: Sequence[int] = DEFAULT_TOKENS_PER_GPU,
    skews: Sequence[float] = DEFAULT_SKEWS,
    samples: int = 2,
    seed: int = 0,
    profile: MaxAffine | None = None,
    tile_rows: int = GEMM_M_TILE,
    dispatch_dtype: str = "bf16",
    combine_dtype: str = "bf16",
    progress: Callable[[int], None] | None = None,
) -> PhaseDiagram:
    """Sweep the grid; ``progress(1)`` is called after each cell."""
    if model.moe is None:
        raise SpecError(f"{model.id} is not a mixture-of-experts model")
    E, k = model.moe.num_experts, model.moe.top_k
    if num_gpus < 2 or E % num_gpus:
        raise SpecError(f"--gpus must be >= 2 and divide the {E} experts of {model.id}")
    if samples < 1 or redundant_per_gpu < 0:
        raise SpecError("need samples >= 1 and redundant slots per GPU >= 0")
    if num_gpus > gpus_per_node and num_gpus % gpus_per_node:
        raise SpecError(f"{num_gpus} GPUs are not whole nodes of {gpus_per_node}")
    hidden, inter, mats = expert_shape(model)
    prof = profile or derived_expert_profile(device, hidden, inter, mats=mats)
    n_star = crossover_tokens(prof)
    link, link_name = ep_link(device, num_gpus, gpus_per_node)
    nodes = max(1, num_gpus // gpus_per_node)
    groups = int(model.raw.get("n_group") or 1)
    if groups % nodes:
        groups = 1  # EPLB falls back to its global policy
    slots = E // num_gpus + redundant_per_gpu
    shared_prof = (
        derived_expert_profile(device, hidden, model.moe.shared_intermediate, mats=mats)
        if model.moe.shared_intermediate
        else None
    )
    de, ce = get_dtype(dispatch_dtype).bytes, get_dtype(combine_dtype).bytes
    cells = []
    for tpg in tokens_per_gpu:
        if tpg < 1:
            raise SpecError(f"tokens per GPU must be >= 1, got {tpg}")
        comm = ep_comm(
            tokens_per_gpu=tpg,
            experts_per_token=k,
            hidden=hidden,
            group=num_gpus,
            link=link,
            link_name=link_name,
            dispatch_elem_bytes=de,
            combine_elem_bytes=ce,
        )
        pad_t = float(np.ceil(tpg / tile_rows) * tile_rows)
        shared_s = float(shared_prof(G=1.0, N=pad_t)) if shared_prof is not None else 0.0
        for skew in skews:
            rng = np.random.default_rng([seed, tpg, round(skew * 1000)])
            pop = expert_popularity(E, exponent=skew, seed=rng)
            r = rebalance_experts(
                pop * tpg * num_gpus * k, num_gpus * slots, groups, nodes, num_gpus
            )
            pl = Placement.from_slots(
                r.phy2log[0],
                r.slot_gpu(),
                num_experts=E,
                num_gpus=num_gpus,
                gpus_per_node=gpus_per_node,
            )
            counts = sample_counts(pop, tpg * num_gpus, k, layers=samples, seed=rng)
            pb, hb, hot_share = _mean_blocks(counts, pl, prof, tile_rows, n_star)
            best = min(pb, key=lambda m: pb[m])
            base = comm.total_s + shared_s
            lay_p, lay_h = pb[best] + base, hb + base
            share = comm.total_s / lay_h
            cells.append(
                PhaseCell(
                    tokens_per_gpu=int(tpg),
                    skew=float(skew),
                    regime=_regime(share, hot_share),
                    hot_expert_share=hot_share,
                    proxy_block_s=pb,
                    best_proxy=best,
                    heuristic_block_s=hb,
                    block_gain=1.0 - hb / pb[best],
                    proxy_spread=max(pb.values()) / min(pb.values()),
                    comm_s=comm.total_s,
                    shared_s=shared_s,
                    layer_best_proxy_s=lay_p,
                    layer_heuristic_s=lay_h,
                    layer_gain=1.0 - lay_h / lay_p,
                    comm_share=share,
                )
            )
            if progress is not None:
                progress(1)
    return PhaseDiagram(
        model=model.id,
        device=device.id,
        num_gpus=num_gpus,
        gpus_per_node=gpus_per_node,
        link=link_name,
        slots_per_gpu=slots,
        n_star_tokens=n_star,
        dispatch_dtype=dispatch_dtype,
        tokens_per_gpu=tuple(int(t) for t in tokens_per_gpu),
        skews=tuple(float(s) for s in skews),
        cells=tuple(cells),
        profile=prof.provenance,
    )


def phase_figure(diagrams: Sequence[PhaseDiagram]) -> Any:
    """One heatmap of layer gain per diagram, each cell annotated with its regime, winning
    proxy and communication share; a panel whose gain is the same everywhere says so."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    n = len(diagrams)
    short = {"comm-dominated": "COMM", "weights": "W", "tokens": "T", "mixed": "MIX"}
    zs = [
        np.array([[100 * d.cell(t, s).layer_gain for t in d.tokens_per_gpu] for s in d.skews])
        for d in diagrams
    ]
    titles = []
    for d, z in zip(diagrams, zs, strict=True):
        t = f"{d.model} on {d.num_gpus}x {d.device} (EP over {d.link}; n*={d.n_star_tokens:.0f})"
        if np.ptp(z) == 0:
            t += f" — constant: {z.flat[0]:.1f}% gain in every cell"
        titles.append(t)
    gap = 0.16 if n > 1 else 0.0
    fig = make_subplots(rows=n, cols=1, subplot_titles=titles, vertical_spacing=gap)
    panel = (1.0 - gap * (n - 1)) / n
    for row, (d, z) in enumerate(zip(diagrams, zs, strict=True), start=1):
        text = [
            [
                f"{100 * d.cell(t, s).layer_gain:.1f}%<br>{short[d.cell(t, s).regime]} "
                f"{d.cell(t, s).best_proxy}<br>comm {100 * d.cell(t, s).comm_share:.0f}%"
                for t in d.tokens_per_gpu
            ]
            for s in d.skews
        ]
        top = 1.0 - (row - 1) * (panel + gap)
        fig.add_trace(
            go.Heatmap(
                z=z,
                x=[str(t) for t in d.tokens_per_gpu],
                y=[f"{s:g}" for s in d.skews],
                text=text,
                texttemplate="%{text}",
                colorscale="Viridis",
                zmin=0,
                zmax=max(float(z.max()), 1e-9),
                colorbar={
                    "title": {"text": "gain %"},
                    "len": panel,
                    "lenmode": "fraction",
                    "y": top - panel / 2,
                    "x": 1.02,
                    "thickness": 18,
                },
                hovertemplate="tokens/GPU %{x}<br>skew %{y}<br>%{text}<extra></extra>",
            ),
            row=row,
            col=1,
        )
        fig.update_xaxes(title_text="tokens per GPU", type="category", row=row, col=1)
        fig.update_yaxes(title_text="Zipf skew", type="category", row=row, col=1)
    fig.update_layout(
        height=440 * n + 80,
        width=1100,
        margin={"t": 120, "r": 120},
        title={
            "text": "Makespan-aware dispatch: MoE-layer time gain over the best proxy<br>"
            "<sup>W = weight-bound, T = token-bound, MIX = both regimes, "
            "COMM = >50% all-to-all</sup>",
            "x": 0.02,
            "xanchor": "left",
        },
    )
    return fig


def phase_figure_html(diagrams: Sequence[PhaseDiagram]) -> str:
    """Self-contained HTML of :func:`phase_figure` (plotly.js embedded: works offline)."""
    return figure_html(phase_figure(diagrams))
