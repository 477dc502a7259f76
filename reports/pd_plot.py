"""PD phase diagrams: the optimal P:D ratio and the disaggregation gain over a grid.

Two sweeps for one model on one device:

* **lengths**: every request has input ``s`` and output ``o`` tokens (a grid of
  ``fixed_lengths`` workloads) at fixed SLOs;
* **SLO tightness**: one workload, TTFT and TPOT targets on a grid.

Each cell holds the rate-free optimum of ``solvers.pd.fluid.fluid_optimum`` (best
prefill/decode configuration pair with fractional instance counts: DistServe's
``n : m = g_d : g_p``), the P:D GPU and instance ratios, the best colocated
chunked-prefill goodput per GPU (``solvers.pd_plan.colocated_baseline``), and the
gain = disaggregated / colocated goodput per GPU. The regime says who wins, or which
side cannot meet the SLOs at all; :meth:`PDPhaseDiagram.boundary` gives, per column,
the largest y (output length, or TPOT target) up to which disaggregation wins, drawn as
a line on the gain map.

What the model finds (OPT-13B on A100, ShareGPT stand-in; Llama-3.1-70B on H100, chat):
loose TPOT -> colocated chunked prefill wins (its decode tokens ride in the prefill
iterations); tight TPOT -> disaggregation wins, *unless* TTFT is tight too: then both
sides run prefill at TP4-TP8 at low utilization, the colocated instance's decode steps
are short and cheap next to its prefill work, and the disaggregated plan pays for its
separate decode GPUs. The TPOT boundary rises with the TTFT target.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hardware.device import Device
from hardware.engine import engine_for
from perfmodel.errors import InfeasibleError, SpecError
from perfmodel.model import ModelSpec
from perfmodel.units import MS_PER_S
from perfmodel.workload.lengths import fixed_lengths
from perfmodel.workload.presets import Workload
from perfmodel.workload.slo import SLO
from solvers.pd.colocated import LOW_FRACTION, ColocatedMemo, Hints
from solvers.pd.enumerate import EngineSpec, one_blas_thread, profile_options
from solvers.pd.fluid import fluid_best
from solvers.pd.plan import colocated_baseline

DEFAULT_INPUTS = (128, 512, 2048, 8192)
DEFAULT_OUTPUTS = (32, 128, 512, 2048)
DEFAULT_SLO_SCALES = (0.5, 1.0, 2.0, 4.0, 8.0)


#: a cell's regime as one character of :meth:`PDPhaseDiagram.regime_map`
REGIME_SYMBOLS = {
    "disaggregated": "D",
    "colocated": "c",
    "disaggregated-only": "d",
    "colocated-only": "o",
    "infeasible": ".",
}


@dataclass(frozen=True)
class PDCell:
    """One grid cell."""

    x: float  # input tokens, or TTFT target (s)
    y: float  # output tokens, or TPOT target (s)
    regime: str  # disaggregated | colocated | disaggregated-only | colocated-only | infeasible
    disagg_per_gpu: float  # 0 when infeasible
    colocated_per_gpu: float
    gain: float | None  # disagg / colocated; None unless both are feasible
    gpu_ratio: float | None  # prefill : decode GPUs
    instance_ratio: float | None
    prefill: str
    decode: str
    note: str

    @property
    def margin(self) -> float | None:
        """Distance to the boundary: ``gain − 1`` (> 0: disaggregation serves more per GPU);
        None unless both sides are feasible."""
        return None if self.gain is None else self.gain - 1.0

    def to_dict(self) -> dict[str, Any]:
        return {**vars(self), "margin": self.margin}


@dataclass(frozen=True)
class PDPhaseDiagram:
    model: str
    device: str
    kind: str  # "lengths" | "slo"
    x_label: str
    y_label: str
    xs: tuple[float, ...]
    ys: tuple[float, ...]
    context: str
    cells: tuple[PDCell, ...] = field(repr=False)

    def cell(self, x: float, y: float) -> PDCell:
        for c in self.cells:
            if c.x == x and c.y == y:
                return c
        raise KeyError((x, y))

    def boundary(self) -> tuple[tuple[float, float | None], ...]:
        """Per column ``x``, the largest ``y`` up to which disaggregation wins at every
        smaller ``y`` of the grid (None: it does not win at the smallest ``y``).

        On an SLO diagram (x = TTFT, y = TPOT target) this is the TPOT boundary: below
        it disaggregation wins, above it colocated serving does.
        """
        wins = ("disaggregated", "disaggregated-only")
        out = []
        for x in self.xs:
            top = None
            for y in sorted(self.ys):
                if self.cell(x, y).regime not in wins:
                    break
                top = y
            out.append((x, top))
        return tuple(out)

    def shown(self, v: float) -> str:
        """An axis value as printed and drawn: ms on an SLO diagram, tokens else."""
        return f"{v * MS_PER_S:g}" if self.kind == "slo" else f"{v:g}"

    def regime_map(self) -> list[str]:
        """The regimes as a character map, for a grid too wide for a table of cells: a
        header, one line per ``y`` (its value, then a :data:`REGIME_SYMBOLS` symbol per
        ``x``, in the order of ``xs``) and the legend."""
        ys = [self.shown(y) for y in self.ys]
        width = max(len(self.y_label), *(len(y) for y in ys))
        span = f"{self.shown(self.xs[0])} … {self.shown(self.xs[-1])} ({len(self.xs)})"
        lines = [f"{self.y_label:<{width}}  {self.x_label} {span}"]
        for y, label in zip(self.ys, ys, strict=True):
            row = "".join(REGIME_SYMBOLS[self.cell(x, y).regime] for x in self.xs)
            lines.append(f"{label:>{width}}  {row}")
        lines.append("  ".join(f"{v} {k}" for k, v in REGIME_SYMBOLS.items()))
        return lines

    def summary(self, *, gains: bool = True) -> str:
        """One line per column: where disaggregation stops winning, with the gains (each
        cell's with ``gains``, else their range: for a tall grid)."""
        lines = []
        for x, top in self.boundary():
            col = sorted((c for c in self.cells if c.x == x), key=lambda c: c.y)
            both = [c.gain for c in col if c.gain]
            if gains:
                each = ", ".join(
                    f"{self.shown(c.y)}: {c.gain:.2f}x"
                    if c.gain
                    else f"{self.shown(c.y)}: {c.regime}"
                    for c in col
                )
                told = f"gain by {self.y_label}: {each}"
            elif both:
                told = f"gains {min(both):.2f}x to {max(both):.2f}x"
            else:
                told = "no cell where both meet the SLO"
            where = (
                "colocated wins at every " + self.y_label
                if top is None
                else f"disaggregation wins up to {self.y_label} {self.shown(top)}"
            )
            lines.append(f"{self.x_label} {self.shown(x)}: {where} ({told})")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in vars(self).items() if k != "cells"}
        d["cells"] = [c.to_dict() for c in self.cells]
        d["boundary"] = [list(b) for b in self.boundary()]
        return d


def _cell(
    model: ModelSpec,
    devices: Sequence[Device],
    decode_devices: Sequence[Device],
    workload: Workload,
    slo: SLO,
    x: float,
    y: float,
    dtype: str,
    kv_dtype: str,
    engine: EngineSpec = None,
    memos: tuple[dict[tuple[Any, ...], Any], ColocatedMemo] | None = None,
    hints: Hints | None = None,
) -> PDCell:
    """One cell; ``memos``: the phase-options memo (shareable by any cells:
    :func:`profile_options`, :func:`fluid_best`) and the colocated estimates (shared by
    the cells of one workload: an SLO sweep); ``hints``: the colocated search's starting points
    (:func:`solvers.pd.colocated.colocated_baseline`), a neighbouring cell's."""
    note = ""
    opts_memo, colo_memo = memos or ({}, ColocatedMemo())
    try:
        opts = profile_options(
            model,
            workload.lengths,
            prefill_devices=devices,
            decode_devices=decode_devices,
            dtype=dtype,
            kv_dtype=kv_dtype,
            memo=opts_memo,
            engine=engine,
        )
        f = fluid_best(opts, slo, model=model, memo=opts_memo)
        dis, gr, ir = f.per_gpu_rate_per_s, f.gpu_ratio, f.instance_ratio
        pl, dl = f.prefill.config.label, f.decode.config.label
    except InfeasibleError as e:
        dis, gr, ir, pl, dl, note = 0.0, None, None, "", "", str(e)
    colo = colocated_baseline(
        model,
        workload,
        slo,
        devices=devices,
        dtype=dtype,
        kv_dtype=kv_dtype,
        memo=colo_memo,
        engine=engine,
        hints=hints,
    )
    c = colo.per_gpu_rate_per_s if colo.feasible else 0.0
    if dis > 0 and c > 0:
        regime = "disaggregated" if dis > c else "colocated"
        gain: float | None = dis / c
    else:
        regime = {(True, False): "disaggregated-only", (False, True): "colocated-only"}.get(
            (dis > 0, c > 0), "infeasible"
        )
        gain = None
        note = note or colo.note
    return PDCell(x, y, regime, dis, c, gain, gr, ir, pl, dl, note)


def _engine_name(engine: EngineSpec, devices: Sequence[Device]) -> str:
    """The engine id(s) the diagram was costed with (``none``: the engine-less roofline)."""
    ids = dict.fromkeys((e.id if e else "none") for e in (engine_for(engine, d) for d in devices))
    return "/".join(ids)


@dataclass(frozen=True)
class PDPhaseSweeps:
    """``perfmodel pd phase``'s two diagrams: over the lengths and over the SLO."""

    lengths: PDPhaseDiagram
    slo: PDPhaseDiagram

    def to_dict(self) -> dict[str, Any]:
        return {"lengths": self.lengths.to_dict(), "slo": self.slo.to_dict()}


def _next_hints(prev: Hints | None, prev2: Hints | None, above: Hints | None) -> Hints:
    """A cell's colocated hints (:func:`colocated_baseline`'s, each configuration's
    expected goodput as a fraction of its μ): those the previous cell of the row left,
    moved on by their step from the cell before it (a row's goodput fraction drifts with
    the length: the first estimate lands in the right bracket more often), clipped to the
    bisection's ``[LOW_FRACTION, 1]``; the first cell of a row takes the cell above's (a
    copy). Only where the estimates go depends on them."""
    if not prev:
        return dict(above or {})
    return {
        k: min(max(2 * h - prev2[k], LOW_FRACTION), 1.0) if prev2 and k in prev2 else h
        for k, h in prev.items()
    }


@one_blas_thread()
def _sweep(
    model: ModelSpec,
    devices: Sequence[Device],
    decode_devices: Sequence[Device] | None,
    axes: tuple[str, str, str],  # kind, y label, x label
    ys: Sequence[float],
    xs: Sequence[float],
    point: Callable[[float, float], tuple[Workload, SLO]],
    context: str,
    dtypes: tuple[str, str],
    progress: Callable[[int], None] | None,
    engine: EngineSpec,
    one_workload: bool = False,
) -> PDPhaseDiagram:
    """The diagram of one cell per ``(y, x)``, each at the workload and SLO ``point(y, x)``.

    The phase-options memo (:func:`profile_options`) is shared by the cells of a row (a
    length sweep's row has one prompt length: its prefill goodputs serve every cell of
    it); ``one_workload`` (an SLO sweep): it and the colocated estimates are shared by
    every cell."""
    cells = []
    hints: dict[tuple[int, int], Hints] = {}
    memos: tuple[dict[tuple[Any, ...], Any], ColocatedMemo] | None = (
        ({}, ColocatedMemo()) if one_workload else None
    )
    for i, y in enumerate(ys):
        row_memo: dict[tuple[Any, ...], Any] = {}
        for j, x in enumerate(xs):
            w, slo = point(y, x)
            # the colocated search starts from the row's trend (or the cell above)
            hints[i, j] = _next_hints(
                hints.get((i, j - 1)), hints.get((i, j - 2)), hints.get((i - 1, j))
            )
            cells.append(
                _cell(
                    model, devices, decode_devices or devices, w, slo, y, x, *dtypes, engine,
                    memos or (row_memo, ColocatedMemo()), hints[i, j],
                )
            )  # fmt: skip
            if progress:
                progress(1)
    kind, y_label, x_label = axes
    return PDPhaseDiagram(
        model.id, devices[0].id, kind, y_label, x_label,
        tuple(float(y) for y in ys), tuple(float(x) for x in xs),
        f"{context}, engine {_engine_name(engine, devices)}", tuple(cells),
    )  # fmt: skip


def length_sweep(
    model: ModelSpec,
    devices: Sequence[Device],
    slo: SLO,
    *,
    inputs: Sequence[int] = DEFAULT_INPUTS,
    outputs: Sequence[int] = DEFAULT_OUTPUTS,
    decode_devices: Sequence[Device] | None = None,
    dtype: str = "bf16",
    kv_dtype: str = "bf16",
    progress: Callable[[int], None] | None = None,
    engine: EngineSpec = None,
) -> PDPhaseDiagram:
    """Optimal ratio and gain over input × output length (fixed lengths per cell)."""
    if not inputs or not outputs or min(inputs) < 1 or min(outputs) < 2:
        raise SpecError("need input lengths >= 1 and output lengths >= 2 tokens")

    def point(s: float, o: float) -> tuple[Workload, SLO]:
        return Workload(f"fixed-{s}-{o}", fixed_lengths(int(s), int(o))), slo

    context = (
        f"TTFT {slo.ttft_s * MS_PER_S:g} ms / TPOT {slo.tpot_s * MS_PER_S:g} ms "
        f"at p{slo.percentile * 100:g}"
    )
    axes = ("lengths", "input tokens", "output tokens")
    return _sweep(
        model, devices, decode_devices, axes, inputs, outputs, point, context,
        (dtype, kv_dtype), progress, engine,
    )  # fmt: skip


def slo_sweep(
    model: ModelSpec,
    devices: Sequence[Device],
    workload: Workload,
    *,
    ttft_s: Sequence[float],
    tpot_s: Sequence[float],
    percentile: float = 0.9,
    decode_devices: Sequence[Device] | None = None,
    dtype: str = "bf16",
    kv_dtype: str = "bf16",
    progress: Callable[[int], None] | None = None,
    engine: EngineSpec = None,
) -> PDPhaseDiagram:
    """Optimal ratio and gain over TTFT × TPOT targets for one workload."""
    if not ttft_s or not tpot_s:
        raise SpecError("need at least one TTFT and one TPOT target")

    def point(a: float, b: float) -> tuple[Workload, SLO]:
        return workload, SLO(float(a), float(b), percentile=percentile)

    axes = ("slo", "TTFT target (ms)", "TPOT target (ms)")
    return _sweep(
        model, devices, decode_devices, axes, ttft_s, tpot_s, point,
        f"workload {workload.name}, p{percentile * 100:g}", (dtype, kv_dtype), progress,
        engine, one_workload=True,
    )  # fmt: skip
