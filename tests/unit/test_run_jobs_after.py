"""``solvers.fleet.cache.run_jobs`` with jobs that take other jobs' values (``Job.after``):
the values of cached and of computed inputs arrive in order, serially and in processes."""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import pytest

from solvers.fleet.cache import Job, run_jobs


def _const(x: int) -> int:
    return x


def _weigh(base: int, *xs: int) -> int:
    return base + sum((10**i) * x for i, x in enumerate(xs))


def _jobs() -> list[Job]:
    return [
        Job("t", "a", partial(_const, 1)),
        Job("t", "b", partial(_const, 2)),
        Job("t", "c", partial(_weigh, 0), after=("a", "b")),  # 1 + 20
        Job("t", "d", partial(_weigh, 1000), after=("c", "a")),  # 1000 + 21 + 10
    ]


@pytest.mark.parametrize("workers", [1, 2])
def test_values_in_order_with_a_cached_input(
    workers: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if workers > 1 and not hasattr(os, "fork"):
        pytest.skip("needs fork")
    monkeypatch.setenv("PERFMODEL_CACHE_DIR", str(tmp_path))
    assert run_jobs(_jobs()[:1], workers=workers) == [1]  # "a" is cached now
    assert run_jobs(_jobs(), workers=workers) == [1, 2, 21, 1031]
    assert run_jobs(_jobs(), workers=workers) == [1, 2, 21, 1031]  # all read back
