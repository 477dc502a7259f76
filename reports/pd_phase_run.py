"""``perfmodel pd phase``'s two diagrams, computed in parallel processes.

The cells are independent but for the work they share (:func:`reports.pd_plot._sweep`):
a length sweep's row shares its phase-options memo, an SLO sweep shares everything. So
the jobs are the SLO sweep (one job) and the length sweep's rows (one job each, longest
prompts first: they cost most); they run in ``workers`` forked processes — or on a Dask
cluster (``scheduler``: ``local``, a ``LocalCluster``, or a scheduler's address:
:mod:`reports.cluster`) — each job serially inside, and the rows are joined into one
diagram. Every cell equals the cell of the serial sweep (a row's first cell starts its
colocated search without the hint of the row above: the same answer, maybe another
estimate). Serial when ``scheduler`` is ``serial``, one worker is asked for or one CPU is
available (the rows one after another if no pool of forked processes can be had:
:func:`reports.cluster.map_jobs`).
"""

from __future__ import annotations

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


def _join_rows(rows: Sequence[PDPhaseDiagram]) -> PDPhaseDiagram:
    """One length diagram of single-input-row diagrams (same outputs, in input order)."""
    first = rows[0]
    return replace(
        first,
        xs=tuple(r.xs[0] for r in rows),
        cells=tuple(c for r in rows for c in r.cells),
    )


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
    times ``slo_scales`` (see the module docstring). ``scheduler``: None (forked
    processes), ``serial``, ``local`` or a scheduler address; ``workers`` default: the
    CPUs, at most two (:func:`reports.cluster.default_workers`), a ``LocalCluster``'s one
    per core, a remote cluster its own."""
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
        from reports.cluster import default_workers

        workers = default_workers()
    if scheduler is not None or (workers or 1) > 1:  # the SLO job beside even one row
        order = sorted(range(len(inputs)), key=lambda i: -inputs[i])  # long prompts first
        rows = [
            partial(length_sweep, model, devices, slo, inputs=[inputs[i]], outputs=outputs,
                    **common)
            for i in order
        ]  # fmt: skip
        sizes = [len(slo_scales) ** 2] + [len(outputs)] * len(rows)
        from reports.cluster import map_jobs

        def done(i: int) -> None:
            if progress:
                progress(sizes[i])

        pool = workers if workers is None else min(workers, 1 + len(rows))
        out = map_jobs([slo_job, *rows], workers=pool, scheduler=scheduler, on_result=done)
        by_input = dict(zip(order, out[1:], strict=True))
        return PDPhaseSweeps(_join_rows([by_input[i] for i in range(len(inputs))]), out[0])
    lens = length_sweep(
        model, devices, slo, inputs=inputs, outputs=outputs, progress=progress, **common
    )
    return PDPhaseSweeps(lens, slo_job(progress=progress))
