"""The one place solvers choose and configure a MILP backend for PuLP.

HiGHS (through ``highspy``) by default, CBC as the fallback; always a time limit.
PuLP and highspy are imported lazily so that CLI start-up stays fast.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

_BANNER_MUTED: list[bool] = []
#: HiGHS threads for every solve of the project. One: the models are small, HiGHS's idle
#: workers spin against the evaluations and other processes on a small machine (the ten
#: MILPs of a five-device plan: 0.8 s instead of 2.1 s of CPU), and HiGHS fixes its thread
#: count at a thread's first solve — a later solve there asking another count fails
#: ("Not Solved") — so every solve must ask the same.
HIGHS_THREADS = 1


def mute_highs_banner() -> None:
    """highspy prints a banner from C on its first ``Highs()`` even with output off, which
    would corrupt ``--json`` output: create that first instance with fd 1 on /dev/null."""
    if _BANNER_MUTED:
        return
    _BANNER_MUTED.append(True)
    try:
        import highspy
    except ImportError:  # pragma: no cover - CBC fallback
        return
    sys.stdout.flush()
    saved, null = os.dup(1), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        highspy.Highs()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(null)


def pulp_solver(
    time_limit_s: float,
    gap_rel: float = 1e-9,
    *,
    presolve: bool = True,
    threads: int = HIGHS_THREADS,
    highs_options: Mapping[str, Any] | None = None,
) -> tuple[Any, str]:
    """A PuLP solver object and its name (``"highs"`` or ``"cbc"``). ``presolve=False``
    turns HiGHS's presolve off (a retry when it ends in a solve error). ``threads``: the
    solver's thread limit (see :data:`HIGHS_THREADS` before changing it); ``highs_options``:
    further HiGHS options by name (ignored by the CBC fallback)."""
    import pulp

    extra: dict[str, Any] = dict(highs_options or {})
    if not presolve:
        extra["presolve"] = "off"
    h = pulp.HiGHS(
        msg=False, timeLimit=time_limit_s, gapRel=gap_rel, gapAbs=1e-12, threads=threads, **extra
    )
    if h.available():
        mute_highs_banner()
        return h, "highs"
    return pulp.PULP_CBC_CMD(
        msg=False, timeLimit=time_limit_s, gapRel=gap_rel, threads=threads
    ), "cbc"


def highs_error(prob: Any) -> str | None:
    """HiGHS's model status after ``prob.solve`` if the solve failed (anything but
    optimal, infeasible, unbounded or stopped by a limit), else None."""
    import highspy

    st = highspy.HighsModelStatus
    h = prob.solverModel
    status = h.getModelStatus()
    fine = (
        st.kOptimal,
        st.kTimeLimit,
        st.kInfeasible,
        st.kUnbounded,
        st.kUnboundedOrInfeasible,
        st.kIterationLimit,
        st.kSolutionLimit,
        st.kInterrupt,
    )
    return None if status in fine else str(h.modelStatusToString(status))
