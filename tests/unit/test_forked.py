"""perfmodel.forked.fork_map: values in order, and workers gone the moment the parent stops."""

from __future__ import annotations

import os
import signal
import time
from functools import partial

import pytest

from perfmodel.forked import fork_map

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")


def _square(x: int) -> int:
    return x * x


def _pid_then_sleep(path: str, seconds: float) -> int:
    with open(path, "a") as f:
        f.write(f"{os.getpid()}\n")
    time.sleep(seconds)
    return 0


def _boom() -> int:
    raise ValueError("job failed")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class _Stop(BaseException):
    pass


def test_values_in_job_order_with_progress():
    seen: list[int] = []
    jobs = [partial(_square, x) for x in range(7)]
    assert fork_map(jobs, 2, on_result=seen.append) == [x * x for x in range(7)]
    assert sorted(seen) == list(range(7))


def test_a_job_error_propagates():
    with pytest.raises(ValueError, match="job failed"):
        fork_map([partial(_square, 2), _boom], 2)


def test_jobs_are_inherited_not_pickled():
    """The workers find the jobs in their copy of the parent: a job that cannot be pickled
    (a lambda over a lock) runs in a worker, and the next call's jobs are its own."""
    import threading

    lock = threading.Lock()
    jobs = [lambda: (os.getpid(), lock.locked()), lambda: (os.getpid(), 2)]
    out = fork_map(jobs, 2)
    assert out is not None and [v for _, v in out] == [False, 2]
    assert all(pid != os.getpid() for pid, _ in out)
    assert fork_map([lambda: "again"], 2) == ["again"]


def test_parent_interrupt_kills_running_workers(tmp_path):
    """A time limit (SIGALRM raising in the parent) stops a 30 s job within a second or
    two, and leaves no worker behind (ProcessPoolExecutor's exit would wait 30 s)."""
    pids = tmp_path / "pids"

    def alarm(_sig: int, _frame: object) -> None:
        raise _Stop

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    t0 = time.perf_counter()
    try:
        with pytest.raises(_Stop):
            fork_map([partial(_pid_then_sleep, str(pids), 30.0)] * 3, 2)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert time.perf_counter() - t0 < 10.0
    started = [int(p) for p in pids.read_text().split()]
    assert 1 <= len(started) <= 2
    assert not any(_alive(p) for p in started)


def _os_error() -> int:
    raise FileNotFoundError("no such input")


def test_a_job_os_error_is_the_jobs_not_a_dead_pool():
    """A job's own OSError propagates (it is not taken for a pool that cannot be had,
    which would run every job again serially)."""
    with pytest.raises(FileNotFoundError, match="no such input"):
        fork_map([partial(_square, 2), _os_error], 2)


_SEEN: list[int] = []  # what meanwhile() appends in the parent


def _pid_and_seen() -> tuple[int, int]:
    time.sleep(0.2)  # still running when the parent's meanwhile() runs
    return os.getpid(), len(_SEEN)


def test_meanwhile_runs_once_in_the_parent_after_the_fork() -> None:
    """``meanwhile`` is the parent's work while the workers compute: called once, in the
    parent, once the workers are forked (they never see what it did)."""
    _SEEN.clear()
    out = fork_map([_pid_and_seen] * 4, 2, meanwhile=lambda: _SEEN.append(os.getpid()))
    assert out is not None
    assert len(_SEEN) == 1 and _SEEN[0] == os.getpid()
    assert all(pid != os.getpid() and seen == 0 for pid, seen in out)


def _add(*xs: int) -> int:
    return sum(xs)


def _const(x: int) -> int:
    return x


def test_a_job_takes_the_values_of_the_jobs_it_follows():
    jobs = [partial(_const, 2), partial(_const, 3), _add, partial(_add, 100), _add]
    after = [(), (), (0, 1), (2,), (3, 1, 0)]
    # 2, 3, 2 + 3, 100 + 5, 105 + 3 + 2
    assert fork_map(jobs, 2, after=after) == [2, 3, 5, 105, 110]


def test_after_must_name_earlier_jobs():
    with pytest.raises(ValueError, match="earlier jobs"):
        fork_map([_add, partial(_const, 1)], 2, after=[(1,), ()])


def _first() -> int:
    time.sleep(0.2)
    return 1


def _next(x: int) -> tuple[int, int]:
    return x + 1, os.getpid()


def test_jobs_after_others_run_in_the_workers_and_nothing_is_kept():
    """Three jobs wait for the first (its value their argument) with four workers: each
    runs in a worker forked before they were submitted, and no call's jobs stay behind."""
    from perfmodel.forked import _INHERITED

    out = fork_map([_first, _next, _next, _next], 4, after=[(), (0,), (0,), (0,)])
    assert out is not None and out[0] == 1
    assert [v for v, _ in out[1:]] == [2, 2, 2]
    assert all(pid != os.getpid() for _, pid in out[1:])
    assert _INHERITED == {}
