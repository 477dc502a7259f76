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
point is *unstable* when that exceeds ``QUEUE_GROWTH_UNSTABLE`` (4.5 %) of ``λ``. At
``λ = 1.1·μ`` the queue grows by ``1 − 1/1.1 = 9 %`` of ``λ``; backlogged, the engine
completes requests at its saturation rate with little noise; stable, it completes the
arrivals, whose count in the window has a relative noise of ``√(2/sim_requests)``
(1.6 % at 8,000). The default loads sit on both sides of the boundary within ±10 % of
it (0.9 and 1.1) and far from it (0.6 and 1.5); the verdict is reliable at ±10 %, not
within a few percent of the boundary.

:func:`stability_figure` is a pure function of the result; :func:`stability_html` wraps
it as self-contained offline HTML.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from hardware.device import Device
from hardware.engine import Engine
from perfmodel.errors import SpecError
from perfmodel.memory import DEFAULT_MAX_BATCHED_TOKENS
from perfmodel.model import ModelSpec
from perfmodel.plan import ParallelPlan
from perfmodel.serving import goodput as q_goodput
from perfmodel.serving import service as q
from perfmodel.sim.simulate import SimSetup, simulate_workload
from perfmodel.step.instance import Instance
from perfmodel.step.table import StepTable, build_step_table
from perfmodel.workload.lengths import LengthDistribution
from perfmodel.workload.presets import Workload
from perfmodel.workload.slo import SLO
from reports.cluster import check_scheduler, default_workers, map_jobs
from reports.stability_result import PhaseCell, PhasePanel, PhaseRow, SimPoint, StabilityPhase

REGIMES = ("slo-feasible", "stable", "unstable")

Specs = list[tuple[float, Workload, int]]  # a panel's rows: (y, workload, KV capacity)
Job = Callable[[], Any]

# a simulated point is unstable when its queue grows by more than this fraction of λ:
# half of the 9 % it grows at λ = 1.1·μ (1 − 1/1.1), the nearest load above the boundary
QUEUE_GROWTH_UNSTABLE = 0.045

DEFAULT_OUTPUT_SCALES = (0.25, 0.4, 0.63, 1.0, 1.6, 2.5, 4.0)

DEFAULT_KV_POINTS = 7

# the cells along the rate axis are formulas of the row's μ and goodput (one goodput
# search per row, then vectorised): a fine rate axis costs nothing; 7 × 720 per panel
DEFAULT_RATES = 720

# both sides of the boundary, within ±10 % of it, and far from it
DEFAULT_SIM_LOADS = (0.6, 0.9, 1.1, 1.5)

# simulated arrivals per point by default: the completions of a stable point are noisy by
# about √(2/n) of λ (1.6 % at 8,000), against the 4.5 % threshold
DEFAULT_SIM_REQUESTS = 8000


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
    """The row's cells at once: ``q.stability``'s test and margin over the rate grid."""
    lam = np.asarray(rates, dtype=np.float64)
    util = lam / sr.rate_per_s
    margin = 1.0 - util
    stable = (lam < sr.rate_per_s) & sr.largest_request_fits
    feasible = stable & row.slo_feasible & (lam <= row.goodput_per_s)
    regime = np.where(feasible, "slo-feasible", np.where(stable, "stable", "unstable"))
    return [
        PhaseCell(float(r), row.y, str(g), float(mg), float(u), sr.binding)
        for r, g, mg, u in zip(lam, regime, margin, util, strict=True)
    ]


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


@dataclass(frozen=True)
class _Sims:
    """What the simulated points of a sweep share."""

    table: StepTable
    rows: int  # per panel (0: none)
    loads: tuple[float, ...]
    requests: int
    seed: int

    def seed_of(self, k: int) -> int:
        """The ``k``-th point's seed (``k = 1, 2, …`` over both panels, in order)."""
        return int(np.random.SeedSequence([self.seed, k]).generate_state(1)[0])


def _panel_jobs(
    specs: Specs, srs: list[q.ServiceRate], slo: SLO, sims: _Sims, first_sim: int
) -> list[Job]:
    """A panel's jobs: its rows' goodput searches, then its simulated points (numbered
    from ``first_sim + 1``)."""
    jobs: list[Job] = [partial(_row, sr, y, slo) for sr, (y, _, _) in zip(srs, specs, strict=True)]
    if not sims.rows:
        return jobs
    for i in _pick(len(specs), sims.rows):
        sr, (y, w, _) = srs[i], specs[i]
        eng = sr.instance.engine  # its prefix cache, as the analytic rate has it
        block = eng.kv_block_tokens if eng is not None and eng.prefix_caching else 0
        setup = SimSetup(
            sims.table, sr.kv_capacity_tokens, sr.max_batched_tokens, sr.chunk_size, block
        )
        for u in sims.loads:
            seed = sims.seed_of(first_sim + len(jobs) - len(specs) + 1)
            jobs.append(partial(_sim_point, setup, sr, w, y, u, sims.requests, seed))
    return jobs


def _panel(
    kind: str, label: str, srs: list[q.ServiceRate], done: list[Any], rates: int
) -> PhasePanel:
    """A panel from its jobs' values (:func:`_panel_jobs`: the rows, then the points)."""
    rows, points = done[: len(srs)], done[len(srs) :]
    grid = _rate_grid(rows, rates)
    cells = [c for r, sr in zip(rows, srs, strict=True) for c in _cells(r, sr, grid)]
    return PhasePanel(kind, label, grid, tuple(rows), tuple(cells), tuple(points))


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
    sim_requests: int = DEFAULT_SIM_REQUESTS,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
    engine: Engine | None = None,
    workers: int | None = None,
    scheduler: str | None = None,
) -> StabilityPhase:
    """Sweep both panels; ``progress(1)`` after each row and each simulated point.

    The rows' goodput searches and the simulated points are independent jobs (a point's
    seed is fixed by its place in the panels): in ``workers`` forked processes or on
    the Dask cluster ``scheduler`` (:func:`reports.cluster.map_jobs`), the same answer;
    ``workers`` default: :func:`reports.cluster.default_workers` (a ``LocalCluster``: one
    per core).

    Defaults: output rows at ``DEFAULT_OUTPUT_SCALES × E[o]``; KV rows geometric from
    ``max(1.2·max(s+o), M₀/16)`` to ``M₀`` (``M₀`` = ``kv_capacity_tokens`` or the memory
    model's capacity); ``rates`` arrival rates geometric from ``0.25·min μ`` to
    ``1.6·max μ`` of the panel. ``sim_rows = 0`` or ``sim_requests = 0`` skips the
    simulator. ``engine``: the serving engine every iteration and memory fit is costed
    with (``None``: the engine-less roofline).
    """
    if rates < 2:
        raise SpecError(f"need at least 2 arrival rates, got {rates}")
    if scheduler is not None:
        check_scheduler(scheduler)
    if sim_rows < 0 or sim_requests < 0:
        raise SpecError("simulated rows and requests must be >= 0")
    if any(not (math.isfinite(u) and u > 0) for u in sim_loads):
        raise SpecError("simulated loads must be positive multiples of μ")
    tick = progress or (lambda _n: None)
    lengths = workload.lengths
    inst = Instance(model, device, plan, engine=engine)

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

    out_specs: Specs = []
    for y in outs:
        ls = scale_output_lengths(lengths, y)
        out_specs.append((y, Workload(ls.name, ls, workload.arrival_cv), m0))
    kv_specs: Specs = [(float(k), workload, k) for k in kvs]
    out_srs = [rate_of(w, kv) for _, w, kv in out_specs]
    kv_srs = [rate_of(w, kv) for _, w, kv in kv_specs]
    sims = _Sims(table, sim_rows if sim_requests else 0, tuple(sim_loads), sim_requests, seed)
    out_jobs = _panel_jobs(out_specs, out_srs, slo, sims, 0)
    kv_jobs = _panel_jobs(kv_specs, kv_srs, slo, sims, len(out_jobs) - len(out_specs))
    if workers is None and scheduler is None:
        workers = default_workers()
    done = map_jobs(
        [*out_jobs, *kv_jobs], workers=workers, scheduler=scheduler, on_result=lambda _i: tick(1)
    )
    return StabilityPhase(
        model=model.id,
        device=device.id,
        tp=plan.tp,
        workload=workload.name,
        slo=slo,
        max_batched_tokens=base.max_batched_tokens,
        chunk_size=base.chunk_size,
        panels=(
            _panel("output", "mean output tokens", out_srs, done[: len(out_jobs)], rates),
            _panel("kv", "KV capacity (tokens)", kv_srs, done[len(out_jobs) :], rates),
        ),
        engine=engine.id if engine else "none",
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
