"""The simulator loop's fast paths (perfmodel.sim.engine, .admission, .skip_ahead) against its
general path, bit for bit.

The loop inlines ``StepTable.time_s`` (``engine_state.step_terms``), admits the commonest
request without a call and the others in ``admission.make_admit``, and skips runs of
decode-only iterations. A table whose ``time_s`` is overridden (here by a subclass that only
calls the parent) turns the inlined step times off: every iteration's time is a ``time_s``
call and nothing is skipped. ``run_engine(general=True)`` sends every iteration through
``EngineState.schedule`` / ``admit`` / ``step``. All must give exactly the same run — every
request's first-token and finish time, the counters, the queue samples.
"""

from __future__ import annotations

import dataclasses
import gc
import math
from typing import Any

import numpy as np
import pytest

from hardware.device import load_device
from perfmodel.model import load_model
from perfmodel.plan import ParallelPlan
from perfmodel.serving.servemix import DEFAULT_WATERMARK
from perfmodel.sim import admission, engine
from perfmodel.sim.engine import EngineRun, run_engine
from perfmodel.sim.engine_state import EngineState, step_terms
from perfmodel.sim.simulate import SimResult, simulate
from perfmodel.step.instance import Instance
from perfmodel.step.table import StepTable, build_step_table
from perfmodel.workload.presets import preset


@dataclasses.dataclass(frozen=True)
class CalledTable(StepTable):
    """The same table, its ``time_s`` overridden: the loop calls it for every iteration."""

    def time_s(self, *args: Any, **kwargs: Any) -> float:
        return super().time_s(*args, **kwargs)


@pytest.fixture(scope="module")
def tables() -> dict[int, StepTable]:
    inst = Instance(load_model("llama-3.1-8b"), load_device("h100-sxm"), ParallelPlan(tp=1))
    return {B: build_step_table(inst, B) for B in (256, 8192)}


FIELDS = (
    "first_token_s", "finish_s", "rejected", "preemptions", "iterations", "busy_s", "end_s",
    "queue_t_s", "queue_len", "kv_used_tokens", "recompute_tokens",
)  # fmt: skip

# (workload, requests, rate req/s (0: all at t = 0), KV tokens, budget, chunk, limit s, block)
CASES = {
    "light": ("chat", 1500, 6.0, 445_000, 8192, 8192, math.inf, 0),
    "busy": ("chat", 1500, 18.0, 445_000, 8192, 8192, math.inf, 0),
    "overload_preempt": ("chat", 800, 40.0, 40_000, 8192, 8192, math.inf, 0),
    "prefix_cache": ("chat", 800, 40.0, 40_000, 8192, 2048, math.inf, 16),
    "small_budget": ("code", 300, 20.0, 400_000, 256, 64, math.inf, 0),
    "time_limit": ("chat", 1500, 30.0, 200_000, 8192, 8192, 20.0, 0),
    "burst": ("chat", 600, 0.0, 100_000, 8192, 8192, math.inf, 0),
}


def inputs(case: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    wl, n, rate = CASES[case][:3]
    rng = np.random.default_rng(5)
    s, o = preset(wl).lengths.sample(n, rng)
    arr = preset(wl).arrivals(rate).times_s(n, rng) if rate > 0 else np.zeros(n)
    return arr, s, o


def run(table: StepTable, case: str, skip_ahead: bool) -> SimResult:
    M, B, C, tmax, block = CASES[case][3:]
    arr, s, o = inputs(case)
    return simulate(
        table, arrival_s=arr, input_tokens=s, output_tokens=o, kv_capacity_tokens=M,
        max_batched_tokens=B, chunk_size=C, max_time_s=tmax, skip_ahead=skip_ahead,
        prefix_cache_block_tokens=block,
    )  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_fast_paths_equal_the_called_table_bit_for_bit(
    tables: dict[int, StepTable], case: str
) -> None:
    B = CASES[case][4]
    table = tables[B]
    called = CalledTable(**table.__dict__)
    assert step_terms(table) is not None and step_terms(called) is None
    ref = run(called, case, skip_ahead=False)
    assert np.isfinite(ref.finish_s).sum() > 0
    for skip in (True, False):
        got = run(table, case, skip_ahead=skip)
        for f in FIELDS:
            a, b = getattr(ref, f), getattr(got, f)
            assert np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b, (case, skip, f)


def test_step_terms_give_time_s_bit_for_bit(tables: dict[int, StepTable]) -> None:
    table = tables[8192]
    terms = step_terms(table)
    assert terms is not None
    token_s, rows_s, a_pp, a_dp, a_kv, a_tok, a_dx, over = terms
    rng = np.random.default_rng(3)
    for _ in range(2000):
        nd = int(rng.integers(0, 400))
        c = int(rng.integers(0, 8192 - nd))
        seqs = int(rng.integers(1, 4)) if c else 0
        T, R = nd + c, nd + seqs
        if T == 0:
            continue
        d_ctx, cx = int(rng.integers(0, 2_000_000)), int(rng.integers(0, 30_000))
        pairs = 0.0 + (c * cx + c * (c + 1) / 2)
        dp, kv = d_ctx + nd, d_ctx + cx + c
        want = table.time_s(
            T, R, pairs, dp, kv, prefill_tokens=c, prefill_seqs=seqs, decode_seqs=nd
        )
        cc = a_pp * pairs + a_dp * dp
        m = a_kv * kv + a_tok * T + a_dx * (dp - nd)
        assert token_s[T] + rows_s[R] + (m if m > cc else cc) + over == want


def test_the_garbage_collector_is_restored(tables: dict[int, StepTable]) -> None:
    was = gc.isenabled()
    try:
        for state in (True, False):
            (gc.enable if state else gc.disable)()
            run(tables[8192], "burst", skip_ahead=True)
            assert gc.isenabled() is state
    finally:
        (gc.enable if was else gc.disable)()


def run_state(table: StepTable, case: str, **kw: bool) -> tuple[EngineRun, EngineState]:
    """``run_engine`` on the state ``simulate`` builds for ``case`` (and the state after)."""
    M, B, C, tmax, block = CASES[case][3:]
    e = EngineState(
        table, *inputs(case), kv_capacity_tokens=M, max_batched_tokens=B, chunk_size=min(C, B),
        reserve_tokens=int(DEFAULT_WATERMARK * M), max_time_s=tmax, queue_samples=2000,
        prefix_cache_block_tokens=block,
    )  # fmt: skip
    skip, general = kw.get("skip_ahead", False), kw.get("general", False)
    return run_engine(e, skip_ahead=skip, general=general), e


@pytest.mark.parametrize("case", list(CASES))
def test_fast_paths_equal_the_general_path_bit_for_bit(
    tables: dict[int, StepTable], case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every iteration through EngineState's schedule/admit/step against the loop's inline
    admission, make_admit, the inline decode step and the skip-ahead; and the paths are
    exercised: the loop admits requests inline and through make_admit (several at once
    somewhere), and preemptions leave stale calendar entries behind."""
    table = tables[CASES[case][4]]
    calls: dict[str, int] = {"admitted": 0, "several": 0, "general_admits": 0}
    make_admit, general_admit = admission.make_admit, EngineState.admit

    def counting_make_admit(e: EngineState) -> admission.Admit:
        admit = make_admit(e)

        def counted(*a: Any) -> admission.Admitted | None:
            before = len(e.waiting)
            out = admit(*a)
            calls["admitted"] += before - len(e.waiting)
            calls["several"] += before - len(e.waiting) > 1
            return out

        return counted

    def counting_admit(self: EngineState, budget: int, chunks: list[tuple[int, int]]) -> int:
        before = len(chunks)
        out = general_admit(self, budget, chunks)
        calls["general_admits"] += len(chunks) - before
        return out

    monkeypatch.setattr(engine, "make_admit", counting_make_admit)
    monkeypatch.setattr(EngineState, "admit", counting_admit)
    ref, _ = run_state(table, case, general=True)
    assert np.isfinite(ref.finish_s).sum() > 0 and calls["admitted"] == 0
    admissions = calls["general_admits"]
    for skip in (True, False):
        calls.update(admitted=0, several=0, general_admits=0)
        got, e = run_state(table, case, skip_ahead=skip)
        for f in FIELDS:
            a, b = getattr(ref, f), getattr(got, f)
            assert np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b, (case, skip, f)
        if not ref.preemptions and case != "small_budget":  # (its prompts are all chunked)
            # each request admitted once: the loop's inline admissions are the rest
            inline = admissions - calls["admitted"] - calls["general_admits"]
            assert inline > 0 and calls["admitted"] > 0, (case, skip, inline, calls)
        assert not e.act or case == "time_limit"
    if case in ("busy", "burst"):
        assert calls["several"] > 0
    if case in ("overload_preempt", "prefix_cache"):
        assert ref.preemptions > 0
