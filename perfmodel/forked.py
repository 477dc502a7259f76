"""Jobs in forked worker processes, stopped at once when the caller stops.

The one place the project forks workers (the plan's evaluations, the PD phase sweep's
rows). :func:`fork_map` runs callables in a ``fork`` process pool and returns their
values in order; a callable may take the values of earlier ones (it starts once they
have ended). When the parent is interrupted while it waits — the command's time limit
(SIGALRM), Ctrl-C, a job's exception — the workers are killed before the exception goes
on: a job still running (a long sweep row) must not keep the command alive past its
limit, which ``ProcessPoolExecutor``'s exit (it waits for running jobs) would do.

Part of the base: imports nothing of the project.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


#: the jobs of the running fork_map calls, by call: the workers, forked after a call put
#: its jobs here, find them in their copy of this process (a job is not pickled: one
#: holding a 262,144-atom workload was 13 MB to send)
_INHERITED: dict[int, Sequence[Callable[..., Any]]] = {}
_CALLS = itertools.count()


def _call(call: int, i: int, *args: Any) -> Any:
    return _INHERITED[call][i](*args)


def _kill(ex: Any) -> None:
    """Stop every worker of ``ex`` now (pending jobs cancelled, running ones killed and
    reaped)."""
    procs = list((getattr(ex, "_processes", None) or {}).values())
    kill = getattr(ex, "kill_workers", None)  # Python >= 3.14
    if callable(kill):
        kill()
    else:
        ex.shutdown(wait=False, cancel_futures=True)
        for p in procs:
            p.kill()
    for p in procs:
        p.join()


def fork_map(
    jobs: Sequence[Callable[..., T]],
    workers: int,
    *,
    on_result: Callable[[int], None] | None = None,
    meanwhile: Callable[[], None] | None = None,
    after: Sequence[Sequence[int]] | None = None,
) -> list[T] | None:
    """Every job's value, computed in ``min(workers, len(jobs))`` forked processes, in
    the order of ``jobs``; ``on_result(i)`` is called in the parent as job ``i`` ends.
    ``meanwhile()`` runs in the parent once the workers are forked, before it waits
    (what the caller needs next and the workers do not: imports, say). ``after[i]``: the
    earlier jobs whose values job ``i`` takes as its arguments, in that order; it is
    submitted once they have ended (the others run meanwhile), in index order.

    The workers inherit the jobs (forked after they are known); only the arguments of
    ``after`` and the values travel, pickled.

    None when no pool can be had (no ``fork``, a worker that died): the caller then runs
    the jobs serially. Any other exception — a job's, or one raised in the parent while
    it waits — kills the workers and propagates.
    """
    import gc
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    deps = [tuple(a) for a in after] if after is not None else [()] * len(jobs)
    if len(deps) != len(jobs) or any(j >= i for i, a in enumerate(deps) for j in a):
        raise ValueError("after[i] must name earlier jobs, one entry per job")
    out: list[Any] = [None] * len(jobs)
    ended = [False] * len(jobs)
    waiting = [i for i, a in enumerate(deps) if a]
    gc.freeze()  # the workers' collections then leave the parent's pages shared
    ex: Any = None
    futures: dict[Any, int] = {}

    call = next(_CALLS)
    _INHERITED[call] = jobs

    def submit(i: int) -> Any:
        f = ex.submit(_call, call, i, *(out[j] for j in deps[i]))
        futures[f] = i
        return f

    try:
        ctx = multiprocessing.get_context("fork")
        ex = ProcessPoolExecutor(max(1, min(workers, len(jobs))), mp_context=ctx)
        for i, a in enumerate(deps):
            if not a:
                submit(i)
    except BaseException as e:  # no processes to be had, or stopped while forking
        if ex is not None:
            _kill(ex)
        gc.unfreeze()
        _INHERITED.pop(call, None)
        if isinstance(e, (OSError, ValueError)):
            return None
        raise
    try:
        if meanwhile is not None:
            meanwhile()
        pending = set(futures)
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in sorted(done, key=futures.__getitem__):
                i = futures[f]
                out[i], ended[i] = f.result(), True  # a job's own exception propagates
                if on_result is not None:
                    on_result(i)
            ready = [i for i in waiting if all(ended[j] for j in deps[i])]
            waiting = [i for i in waiting if i not in ready]
            pending |= {submit(i) for i in ready}
    except BrokenProcessPool:  # a worker died (killed, out of memory)
        _kill(ex)
        return None
    except BaseException:
        _kill(ex)
        raise
    finally:
        gc.unfreeze()
        _INHERITED.pop(call, None)  # the workers have every job they will run
    ex.shutdown(wait=True)
    return out
