"""``perfmodel pd phase``'s two diagrams, computed in parallel processes.

The cells are independent but for the work they share (:func:`reports.pd_plot._sweep`):
a length sweep's row shares its phase-options memo, an SLO sweep shares everything. So
the jobs are the SLO sweep (one job) and the length sweep's rows (one job each, longest
prompts first: they cost most); they run in ``workers`` forked processes — or on a Dask
cluster (``scheduler``: ``local``, a ``LocalCluster``, or a scheduler's address:
:mod:`reports.cluster`) — each job serially inside, and the rows are joined into one
diagram. Every cell equals the cell of the serial sweep (a row's first cell starts its
colocated search without the hint of the row above: the same answer, maybe another
estimate). Serial when ``scheduler`` is ``serial``, one worker is asked for, one CPU is
available, or no pool of forked processes can be had.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

from hardware.device import Device
from perfmodel.model import ModelSpec
from perfmodel.workload.presets import Workload
from perfmodel.workload.slo import SLO
from reports.pd_plot import PDPhaseDiagram, PDPhaseSweeps, length_sweep, slo_sweep
from solvers.pd.enumerate import EngineSpec

#: Processes at most (the sweeps are CPU-bound; more than the CPUs only adds contention).
MAX_WORKERS = 2


def _join_rows(rows: Sequence[PDPhaseDiagram]) -> PDPhaseDiagram:
    """One length diagram of single-input-row diagrams (same outputs, in input order)."""
    first = rows[0]
    return replace(
        first,
        xs=tuple(r.xs[0] for r in rows),
        cells=tuple(c for r in rows for c in r.cells),
    )


def _in_pool(
    jobs: Sequence[Callable[[], PDPhaseDiagram]],
    sizes: Sequence[int],
    workers: int | None,
    progress: Callable[[int], None] | None,
    scheduler: str | None,
) -> list[PDPhaseDiagram] | None:
    """Every job's diagram from ``workers`` forked processes (None if no pool can be had)
    or from the Dask cluster ``scheduler``."""

    def done(i: int) -> None:
        if progress:
            progress(sizes[i])

    if scheduler is not None:
        from reports.cluster import cluster_map

        return cluster_map(jobs, scheduler, workers, on_result=done)
    from perfmodel.forked import fork_map

    return fork_map(jobs, workers or 1, on_result=done)


def phase_sweeps(
    model: ModelSpec,
    devices: Sequence[Device],
    slo: SLO,
    workload: Workload,
    *,
    inputs: Sequence[int],
    outputs: Sequence[int],
    slo_scales: Sequence[float],
    decode_devices: Sequence[Device] | None = None,
    dtype: str = "bf16",
    kv_dtype: str = "bf16",
    progress: Callable[[int], None] | None = None,
    engine: EngineSpec = None,
    workers: int | None = None,
    scheduler: str | None = None,
) -> PDPhaseSweeps:
    """The length sweep at ``slo`` and the SLO sweep of ``workload`` over both targets
    times ``slo_scales`` (see the module docstring); ``workers`` default: the CPUs this
    process may use, at most :data:`MAX_WORKERS` (a ``LocalCluster``: one per core; a
    remote cluster: its own). ``scheduler``: None (forked processes), ``serial``,
    ``local`` or a scheduler address."""
    if scheduler is not None:
        from reports.cluster import check_scheduler

        check_scheduler(scheduler)
    common: dict[str, Any] = {
        "decode_devices": decode_devices, "dtype": dtype, "kv_dtype": kv_dtype, "engine": engine,
    }  # fmt: skip
    slo_job = partial(
        slo_sweep, model, devices, workload,
        ttft_s=[slo.ttft_s * k for k in slo_scales], tpot_s=[slo.tpot_s * k for k in slo_scales],
        percentile=slo.percentile, **common,
    )  # fmt: skip
    if scheduler == "serial":
        workers, scheduler = 1, None
    elif workers is None and scheduler is None:
        workers = min(len(os.sched_getaffinity(0)), MAX_WORKERS)
    if (scheduler is not None or (workers or 1) > 1) and len(inputs) > 1:
        order = sorted(range(len(inputs)), key=lambda i: -inputs[i])  # long prompts first
        rows = [
            partial(length_sweep, model, devices, slo, inputs=[inputs[i]], outputs=outputs,
                    **common)
            for i in order
        ]  # fmt: skip
        sizes = [len(slo_scales) ** 2] + [len(outputs)] * len(rows)
        pool = workers if workers is None else min(workers, 1 + len(rows))
        done = _in_pool([slo_job, *rows], sizes, pool, progress, scheduler)
        if done is not None:
            by_input = dict(zip(order, done[1:], strict=True))
            return PDPhaseSweeps(_join_rows([by_input[i] for i in range(len(inputs))]), done[0])
    lens = length_sweep(
        model, devices, slo, inputs=inputs, outputs=outputs, progress=progress, **common
    )
    return PDPhaseSweeps(lens, slo_job(progress=progress))
