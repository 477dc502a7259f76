"""Jobs on ``dask.distributed``: a ``LocalCluster`` of worker processes started here, or a
running cluster given by its scheduler's address (the sweep's chunks, the PD phase
diagram's rows).

Dask is optional (``pip install 'perfmodel[dask]'``): :func:`dask_available` says whether
it is installed, and a scheduler asked for without it is one clear error. A stopped run
(the command's time limit, Ctrl-C, a job's exception) kills the ``LocalCluster``'s worker
processes with the jobs they are running, instead of waiting for them; a remote
cluster's workers are not touched.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from perfmodel.errors import SpecError

T = TypeVar("T")

#: seconds a scheduler address is given to answer
CONNECT_TIMEOUT_S = 10

#: what ``--scheduler`` takes, besides the forked processes some commands default to
SCHEDULER_HELP = "serial, local (a LocalCluster, one worker process per core) or tcp://host:8786"


#: freed heap a sweep's or a cluster's processes keep mapped (glibc's ``M_TOP_PAD``; 128 KiB)
HEAP_PAD_BYTES = 64 << 20

#: arrays up to this size come from the heap (glibc's ``M_MMAP_THRESHOLD``, its maximum)
HEAP_ARRAY_BYTES = 32 << 20


def keep_freed_heap() -> None:
    """Keep freed heap mapped in this process and in the worker processes a
    ``LocalCluster`` starts (glibc reads ``MALLOC_TOP_PAD_`` and ``MALLOC_MMAP_THRESHOLD_``
    at a process's start; a user's own settings are kept, here too).

    A sweep chunk's step-time arrays (tens of MB of temporaries) were otherwise returned
    to the kernel when freed and page-faulted in again by the next chunk: a third of a
    chunk's time was the kernel's (0.54 of 1.89 s for ten chunks; 0.02 s with a 64 MiB
    pad, 0.42 s with 32 MiB), and two worker processes contended on it; a PD phase
    diagram's rows on a 2-worker ``LocalCluster`` spent 9 s of 48 s of CPU in the kernel
    (0.6 s with the pad; forked workers inherit this process's warmed-up heap). Setting
    the pad by ``mallopt`` also freezes glibc's mmap threshold where it stands, so the
    threshold is set with it: arrays up to 32 MiB come from the heap whatever ran before.
    Not done for every command: the pad stays resident (``predict gemm`` on 10⁶ shapes:
    192 MB peak instead of 165 MB). Elsewhere than glibc on Linux: the environment only."""
    settings = {  # mallopt parameter (malloc.h) -> environment variable, value
        -2: ("MALLOC_TOP_PAD_", HEAP_PAD_BYTES),  # M_TOP_PAD
        -3: ("MALLOC_MMAP_THRESHOLD_", HEAP_ARRAY_BYTES),  # M_MMAP_THRESHOLD
    }
    for name, value in settings.values():
        os.environ.setdefault(name, str(value))
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError):  # a libc without mallopt
        return
    for param, (name, value) in settings.items():
        with contextlib.suppress(ValueError):
            value = int(os.environ[name])
        mallopt(param, value)


#: forked processes a phase command uses by default at most (the grids are CPU-bound:
#: more than the CPUs only adds contention)
MAX_FORKED_WORKERS = 2


def default_workers() -> int:
    """Forked processes for a phase command's grid: the CPUs this process may use, at most
    :data:`MAX_FORKED_WORKERS`."""
    return min(len(os.sched_getaffinity(0)), MAX_FORKED_WORKERS)


def dask_available() -> bool:
    try:
        import dask.distributed  # noqa: F401
    except ImportError:
        return False
    return True


def check_scheduler(scheduler: str) -> None:
    """A clear error for a scheduler that is none of ``serial``, ``local`` and an address,
    or one that needs dask where it is not installed."""
    if scheduler not in ("serial", "local") and "://" not in scheduler:
        raise SpecError(f"--scheduler must be serial, local or tcp://host:port, got {scheduler!r}")
    if scheduler != "serial" and not dask_available():
        raise SpecError(
            f"--scheduler {scheduler} needs dask.distributed: pip install 'perfmodel[dask]' "
            "(or --scheduler serial)"
        )


def open_client(scheduler: str, workers: int | None) -> tuple[Any, Any, int]:
    """(client, cluster or None, workers) for ``local`` (a ``LocalCluster`` of ``workers``
    processes, default one per core) or a scheduler address."""
    check_scheduler(scheduler)
    from dask.distributed import Client, LocalCluster

    if scheduler == "local":
        keep_freed_heap()  # before the workers start: they read it from the environment
        n = workers or os.cpu_count() or 1
        cluster = None
        try:
            cluster = LocalCluster(
                n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None
            )
            return Client(cluster), cluster, n
        except BaseException:  # stopped while starting (a time limit): no worker left behind
            if cluster is not None:
                kill_workers(cluster)
                cluster.close()
            raise
    try:
        client = Client(scheduler, timeout=f"{CONNECT_TIMEOUT_S}s")
    except (OSError, TimeoutError) as e:
        raise SpecError(
            f"no Dask scheduler answers at {scheduler} within {CONNECT_TIMEOUT_S} s ({e}); "
            "start one (dask scheduler) or pass its address"
        ) from None
    except ValueError as e:  # not an address dask knows (a scheme, a port)
        raise SpecError(f"--scheduler {scheduler} is not a scheduler address ({e}); "
                        "pass tcp://host:port") from None  # fmt: skip
    return client, None, max(len(client.scheduler_info().get("workers", {})), 1)


def kill_workers(cluster: Any) -> None:
    """Kill a ``LocalCluster``'s worker processes with the jobs they are running (a
    graceful close waits for each running job: seconds past a time limit)."""
    for nanny in list(getattr(cluster, "workers", {}).values()):
        pid = getattr(nanny, "pid", None)
        if isinstance(pid, int) and pid > 0:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def connected(scheduler: str, workers: int | None) -> Iterator[tuple[Any, int]]:
    """``(client, workers)`` for the block; closed after it, the ``LocalCluster``'s workers
    killed first if the block did not end normally."""
    client, cluster, n = open_client(scheduler, workers)
    ended = False
    try:
        yield client, n
        ended = True
    finally:
        if not ended and cluster is not None:
            kill_workers(cluster)
        client.close()
        if cluster is not None:
            cluster.close()


class _Jobs:
    """The jobs of one :func:`cluster_map`, sent to each worker once (a scattered object,
    not a list: each job's own objects — a 262,144-atom workload, 13 MB — would otherwise
    travel with each task, and the jobs that share them would send them again)."""

    def __init__(self, jobs: Sequence[Callable[[], Any]]) -> None:
        self.jobs = list(jobs)


def _call(jobs: _Jobs, i: int) -> Any:
    return jobs.jobs[i]()


def cluster_map(
    jobs: Sequence[Callable[[], T]],
    scheduler: str,
    workers: int | None = None,
    *,
    on_result: Callable[[int], None] | None = None,
) -> list[T]:
    """Every job's value, computed on the cluster, in the order of ``jobs``;
    ``on_result(i)`` is called here as job ``i`` ends. A job's exception propagates."""
    from dask.distributed import as_completed

    out: list[Any] = [None] * len(jobs)
    run = uuid.uuid4().hex  # keys unique on a shared scheduler, across runs
    with connected(scheduler, workers) as (client, _):
        shared = client.scatter(_Jobs(jobs), broadcast=True)
        futures = {
            client.submit(_call, shared, i, pure=False, key=f"perfmodel-{run}-{i}"): i
            for i in range(len(jobs))
        }
        for fut in as_completed(list(futures)):
            i = futures[fut]
            out[i] = fut.result()
            if on_result is not None:
                on_result(i)
    return out


def map_jobs(
    jobs: Sequence[Callable[[], T]],
    *,
    workers: int | None,
    scheduler: str | None = None,
    on_result: Callable[[int], None] | None = None,
) -> list[T]:
    """Every job's value, in the order of ``jobs``: on the Dask cluster ``scheduler``
    (``local`` or an address: :func:`cluster_map`); else in ``workers`` processes forked
    here (:func:`perfmodel.forked.fork_map`); else — ``serial``, one worker, or no pool
    to be had — here, one after another. ``on_result(i)`` as job ``i`` ends."""
    if scheduler not in (None, "serial"):
        return cluster_map(jobs, scheduler, workers, on_result=on_result)
    if scheduler is None and (workers or 1) > 1 and len(jobs) > 1:
        from perfmodel.forked import fork_map

        out = fork_map(jobs, workers or 1, on_result=on_result)
        if out is not None:
            return out
    values = []
    for i, job in enumerate(jobs):
        values.append(job())
        if on_result is not None:
            on_result(i)
    return values
