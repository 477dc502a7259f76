"""Stability phase diagrams of one serving instance, analytic grid checked by the simulator.

Two panels for one model on ``plan.tp`` devices and one workload:

* **output**: arrival rate × mean output length. Row ``y`` serves the workload with every
  output length scaled by ``y / E[o]`` (:func:`scale_output_lengths`), at the KV capacity
  of the instance;
* **kv**: arrival rate × KV capacity (tokens), the workload as given.

For each row the boundary comes from the formulas of :mod:`perfmodel.queueing`: the
service rate ``μ = min(μ_compute, μ_memory)`` (:func:`perfmodel.queueing.service_rate`)
and the goodput, the largest rate meeting the SLO goal
(:func:`perfmodel.queueing.goodput`). Each cell ``(λ, y)`` carries its regime —
``slo-feasible`` (``λ ≤`` goodput), ``stable`` (``λ < μ``) or ``unstable`` — the margin
``1 − λ/μ``, the utilization and which bound binds.

Simulated points (:mod:`perfmodel.simulate`, ``sim_requests`` arrivals each) sit on a
few rows at rates ``sim_loads × μ``. The queue (requests waiting or running) grows at
``λ −`` the completion rate over the second half of the arrival period
(:meth:`perfmodel.simulate.SimResult.window_throughput_per_s`, after the warm-up); a
point is *unstable* when that exceeds ``QUEUE_GROWTH_UNSTABLE`` of ``λ``: more than one
arrival in ten is left unserved. Backlogged, the engine completes requests at its
saturation rate with little noise; stable, it completes the arrivals, whose count in
the window has a relative noise of ``√(2/sim_requests)`` (3 % at 2,000), so the verdict
is reliable away from the boundary, not within a few percent of it.

:func:`stability_figure` is a pure function of the result; :func:`stability_html` wraps
it as self-contained offline HTML.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hardware.device import Device
from perfmodel.errors import SpecError
from perfmodel.memory import DEFAULT_MAX_BATCHED_TOKENS
from perfmodel.model import ModelSpec
from perfmodel.plan import ParallelPlan
from perfmodel.serving import goodput as q_goodput
from perfmodel.serving import service as q
from perfmodel.sim.simulate import SimSetup, simulate_workload
from perfmodel.step.instance import Instance
from perfmodel.step.table import build_step_table
from perfmodel.workload.lengths import LengthDistribution
from perfmodel.workload.presets import Workload
from perfmodel.workload.slo import SLO

REGIMES = ("slo-feasible", "stable", "unstable")


QUEUE_GROWTH_UNSTABLE = 0.10


DEFAULT_OUTPUT_SCALES = (0.25, 0.4, 0.63, 1.0, 1.6, 2.5, 4.0)


DEFAULT_KV_POINTS = 7


DEFAULT_RATES = 16


DEFAULT_SIM_LOADS = (0.6, 0.8, 1.2, 1.5)


@dataclass(frozen=True)
class PhaseRow:
    """One value of the panel's y axis and its analytic boundary."""

    y: float  # mean output tokens, or KV capacity tokens
    mean_output_tokens: float
    kv_capacity_tokens: int
    service_rate_per_s: float  # μ: the stability boundary
    compute_rate_per_s: float
    memory_rate_per_s: float
    binding: str
    guaranteed_rate_per_s: float  # μ(1 − δ)
    largest_request_fits: bool  # δ < 1; otherwise no rate is stable
    goodput_per_s: float  # 0 when no rate meets the SLO
    slo_feasible: bool


@dataclass(frozen=True)
class PhaseCell:
    """One (arrival rate, y) cell of the analytic grid."""

    rate_per_s: float
    y: float
    regime: str  # slo-feasible | stable | unstable
    margin: float  # 1 − λ/μ (negative when unstable)
    utilization: float  # λ/μ
    binding: str  # the bound that sets μ on this row


@dataclass(frozen=True)
class SimPoint:
    """A simulated (arrival rate, y) point and its verdict against the formula's."""

    rate_per_s: float
    y: float
    utilization: float  # λ/μ predicted
    analytic_stable: bool
    simulated_stable: bool
    queue_growth_per_s: float
    throughput_per_s: float
    requests: int
    preemptions: int

    @property
    def agrees(self) -> bool:
        return self.analytic_stable == self.simulated_stable


@dataclass(frozen=True)
class PhasePanel:
    """A sweep over arrival rate × one y axis."""

    kind: str  # "output" | "kv"
    y_label: str
    rates_per_s: tuple[float, ...]
    rows: tuple[PhaseRow, ...]
    cells: tuple[PhaseCell, ...] = field(repr=False)
    points: tuple[SimPoint, ...] = ()

    def cell(self, row: int, col: int) -> PhaseCell:
        return self.cells[row * len(self.rates_per_s) + col]

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "y_label": self.y_label,
            "rates_per_s": list(self.rates_per_s),
            "rows": [dict(vars(r)) for r in self.rows],
            "cells": [dict(vars(c)) for c in self.cells],
            "points": [{**vars(p), "agrees": p.agrees} for p in self.points],
        }


@dataclass(frozen=True)
class StabilityPhase:
    model: str
    device: str
    tp: int
    workload: str
    slo: SLO
    max_batched_tokens: int
    chunk_size: int
    panels: tuple[PhasePanel, ...]

    def panel(self, kind: str) -> PhasePanel:
        for p in self.panels:
            if p.kind == kind:
                return p
        raise KeyError(kind)

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in vars(self).items() if k not in ("panels", "slo")}
        d["slo"] = dict(vars(self.slo))
        d["panels"] = [p.to_dict() for p in self.panels]
        return d


def scale_output_lengths(
    lengths: LengthDistribution, mean_output_tokens: float
) -> LengthDistribution:
    """``lengths`` with every output ``o`` replaced by ``max(1, round(o·k))``, ``k = y/E[o]``.

    The mean of the result is ``mean_output_tokens`` up to the rounding of short outputs.
    """
    if not (math.isfinite(mean_output_tokens) and mean_output_tokens >= 1):
        raise SpecError(f"mean output length must be >= 1 token, got {mean_output_tokens}")
    k = mean_output_tokens / lengths.mean_output_tokens
    o = np.maximum(1, np.rint(lengths.output_tokens * k)).astype(np.int64)
    return LengthDistribution(
        f"{lengths.name} (outputs ×{k:.3g})", lengths.input_tokens, o, lengths.weights
    )


def _row(sr: q.ServiceRate, y: float, slo: SLO) -> PhaseRow:
    gp = q_goodput.goodput(sr, slo, rel_tol=1e-2)
    return PhaseRow(
        y=y,
        mean_output_tokens=sr.moments.decode_steps + 1,
        kv_capacity_tokens=sr.kv_capacity_tokens,
        service_rate_per_s=sr.rate_per_s,
        compute_rate_per_s=sr.compute_rate_per_s,
        memory_rate_per_s=sr.memory_rate_per_s,
        binding=sr.binding,
        guaranteed_rate_per_s=sr.guaranteed_rate_per_s,
        largest_request_fits=sr.largest_request_fits,
        goodput_per_s=gp.rate_per_s,
        slo_feasible=gp.feasible,
    )


def _cells(row: PhaseRow, sr: q.ServiceRate, rates: Sequence[float]) -> list[PhaseCell]:
    out = []
    for lam in rates:
        st = q.stability(sr, lam)
        if not st.stable:
            regime = "unstable"
        elif row.slo_feasible and lam <= row.goodput_per_s:
            regime = "slo-feasible"
        else:
            regime = "stable"
        out.append(PhaseCell(lam, row.y, regime, st.margin, st.utilization, sr.binding))
    return out


def _rate_grid(rows: Sequence[PhaseRow], n: int) -> tuple[float, ...]:
    mus = [r.service_rate_per_s for r in rows]
    lo, hi = 0.25 * min(mus), 1.6 * max(mus)
    return tuple(float(x) for x in np.geomspace(lo, hi, n))


def _pick(n: int, k: int) -> list[int]:
    """``k`` evenly spread indices out of ``n`` (first and last included)."""
    if k >= n:
        return list(range(n))
    return sorted({round(i * (n - 1) / max(k - 1, 1)) for i in range(k)})


def _sim_point(
    setup: SimSetup, sr: q.ServiceRate, w: Workload, y: float, u: float, n: int, seed: int
) -> SimPoint:
    """Simulate ``n`` requests at ``u·μ``: unstable when the queue grows by > 10 % of λ."""
    lam = u * sr.rate_per_s
    res = simulate_workload(setup, w.lengths, w.arrivals(lam), n_requests=n, seed=seed)
    growth = lam - res.window_throughput_per_s()
    return SimPoint(
        rate_per_s=lam,
        y=y,
        utilization=u,
        analytic_stable=q.stability(sr, lam).stable,
        simulated_stable=growth <= QUEUE_GROWTH_UNSTABLE * lam,
        queue_growth_per_s=growth,
        throughput_per_s=res.throughput_per_s,
        requests=n,
        preemptions=res.preemptions,
    )


def stability_phase(
    model: ModelSpec,
    device: Device,
    plan: ParallelPlan,
    workload: Workload,
    *,
    slo: SLO,
    mean_output_tokens: Sequence[float] | None = None,
    kv_capacities_tokens: Sequence[int] | None = None,
    kv_capacity_tokens: int | None = None,
    max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS,
    chunk_size: int | None = None,
    rates: int = DEFAULT_RATES,
    sim_rows: int = 3,
    sim_loads: Sequence[float] = DEFAULT_SIM_LOADS,
    sim_requests: int = 2000,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
) -> StabilityPhase:
    """Sweep both panels; ``progress(1)`` after each row and each simulated point.

    Defaults: output rows at ``DEFAULT_OUTPUT_SCALES × E[o]``; KV rows geometric from
    ``max(1.2·max(s+o), M₀/16)`` to ``M₀`` (``M₀`` = ``kv_capacity_tokens`` or the memory
    model's capacity); ``rates`` arrival rates geometric from ``0.25·min μ`` to
    ``1.6·max μ`` of the panel. ``sim_rows = 0`` or ``sim_requests = 0`` skips the
    simulator.
    """
    if rates < 2:
        raise SpecError(f"need at least 2 arrival rates, got {rates}")
    if sim_rows < 0 or sim_requests < 0:
        raise SpecError("simulated rows and requests must be >= 0")
    if any(not (math.isfinite(u) and u > 0) for u in sim_loads):
        raise SpecError("simulated loads must be positive multiples of μ")
    tick = progress or (lambda _n: None)
    lengths = workload.lengths
    inst = Instance(model, device, plan)

    def rate_of(w: Workload, kv: int | None) -> q.ServiceRate:
        return q.service_rate(
            inst,
            w,
            kv_capacity_tokens=kv,
            max_batched_tokens=max_batched_tokens,
            chunk_size=chunk_size,
        )

    base = rate_of(workload, kv_capacity_tokens)
    m0 = base.kv_capacity_tokens
    outs = (
        [float(x) for x in mean_output_tokens]
        if mean_output_tokens is not None
        else [s * lengths.mean_output_tokens for s in DEFAULT_OUTPUT_SCALES]
    )
    if kv_capacities_tokens is not None:
        kvs = [int(x) for x in kv_capacities_tokens]
    else:
        lo = max(int(1.2 * lengths.max_total_tokens), m0 // 16)
        kvs = sorted({int(x) for x in np.geomspace(min(lo, m0), m0, DEFAULT_KV_POINTS)})
    if not outs or not kvs:
        raise SpecError("each panel needs at least one row")
    if any(k < 1 for k in kvs):
        raise SpecError(f"KV capacities must be >= 1 token, got {min(kvs)}")

    table = build_step_table(inst, max_batched_tokens)
    n_sim = [0]

    def sim_seed() -> int:
        n_sim[0] += 1
        return int(np.random.SeedSequence([seed, n_sim[0]]).generate_state(1)[0])

    def panel(kind: str, label: str, specs: list[tuple[float, Workload, int]]) -> PhasePanel:
        srs, rows = [], []
        for y, w, kv in specs:
            sr = rate_of(w, kv)
            srs.append(sr)
            rows.append(_row(sr, y, slo))
            tick(1)
        grid = _rate_grid(rows, rates)
        cells = [c for r, sr in zip(rows, srs, strict=True) for c in _cells(r, sr, grid)]
        points = []
        if sim_requests and sim_rows:
            for i in _pick(len(rows), sim_rows):
                sr, (y, w, kv) = srs[i], specs[i]
                setup = SimSetup(table, sr.kv_capacity_tokens, sr.max_batched_tokens, sr.chunk_size)
                for u in sim_loads:
                    points.append(_sim_point(setup, sr, w, y, u, sim_requests, sim_seed()))
                    tick(1)
        return PhasePanel(kind, label, grid, tuple(rows), tuple(cells), tuple(points))

    out_specs = []
    for y in outs:
        ls = scale_output_lengths(lengths, y)
        out_specs.append((y, Workload(ls.name, ls, workload.arrival_cv), m0))
    kv_specs = [(float(k), workload, k) for k in kvs]
    return StabilityPhase(
        model=model.id,
        device=device.id,
        tp=plan.tp,
        workload=workload.name,
        slo=slo,
        max_batched_tokens=base.max_batched_tokens,
        chunk_size=base.chunk_size,
        panels=(
            panel("output", "mean output tokens", out_specs),
            panel("kv", "KV capacity (tokens)", kv_specs),
        ),
    )


def sweep_steps(
    *,
    output_rows: int,
    kv_rows: int,
    sim_rows: int,
    sim_loads: int,
    sim_requests: int,
) -> int:
    """Number of ``progress`` ticks :func:`stability_phase` will make."""
    sims = 0 if not sim_requests else min(sim_rows, output_rows) + min(sim_rows, kv_rows)
    return output_rows + kv_rows + sims * sim_loads
