"""The iteration loop of :func:`perfmodel.sim.simulate.simulate` (scalar state, exact skip-ahead).

The engine semantics are documented in :mod:`perfmodel.sim.simulate`; this module is how
they are executed fast:

* **Per-request state in Python scalars.** A decoding request advances one token per
  iteration, so instead of touching every decoder each iteration the engine keeps a
  global decode counter ``G`` and stores a decoder's context and generated count as
  offsets from it (``ctx = base + G``). The decode context of an iteration is then
  ``Σ base + n_dec·G``, and completions come from a heap keyed by the value of ``G``
  at which each decoder reaches its output length. An ordinary iteration costs a few
  microseconds whatever the batch size.
* **Decode-only skip-ahead (exact).** When no request is in prefill, no waiting request
  is admissible (the queue is empty, the budget is used up, or the head's first chunk
  does not fit: since the KV held only grows while everyone decodes, it stays blocked)
  and all decoders fit the budget, the next ``j`` iterations are identical except that
  the total context grows by ``n_dec`` per iteration. Their step times are evaluated
  in one vectorized call (:meth:`perfmodel.step.table.StepTable.decode_run_s`) and
  accumulated left to right (``numpy.cumsum``, the same float additions as the
  iteration loop), and ``j`` stops at the first of: the next arrival (an iteration
  starting at or after it must absorb it), the first completion (included: it is the
  last iteration of the run), KV exhaustion (an iteration that would need a
  preemption), and ``max_time_s``. Queue samples falling inside the run are recorded
  as the loop would. ``skip_ahead=False`` runs every iteration one by one; both give
  the same per-request times (tested).

The loop is :func:`run_engine`; one iteration is, in order, ``EngineState.arrive``
(arrivals join the queue), :func:`perfmodel.sim.skip_ahead.skip_ahead` (a decode-only
run, when one applies), ``EngineState.schedule`` (the running requests' decodes and
chunks, with preemption), ``EngineState.admit`` (waiting requests, FIFO) and
``EngineState.step`` (the iteration's time and its effect), in
:mod:`perfmodel.sim.engine_state`. State lives in one object with slots; the hot methods
copy what they touch into locals.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from perfmodel.sim.engine_state import QUEUE_WARMUP, EngineState
from perfmodel.sim.skip_ahead import skip_ahead as skip_run

Arr = NDArray[np.float64]


@dataclass(frozen=True)
class EngineRun:
    """Raw outcome of :func:`run_engine` (wrapped by ``simulate.SimResult``)."""

    first_token_s: Arr
    finish_s: Arr
    rejected: int
    preemptions: int
    iterations: int
    busy_s: float
    end_s: float
    queue_t_s: Arr
    queue_len: NDArray[np.int64]
    kv_used_tokens: NDArray[np.int64]
    recompute_tokens: int = 0  # tokens computed again after preemptions


def run_engine(e: EngineState, *, skip_ahead: bool) -> EngineRun:
    """Run the engine from state ``e`` (its inputs already validated by ``simulate``)."""
    max_time_s = e.max_time_s
    n, arr, q_every, B = e.n, e.arr, e.q_every, e.B
    arrive, sample, schedule, admit, step = e.arrive, e.sample, e.schedule, e.admit, e.step
    while True:
        if e.nxt < n and arr[e.nxt] <= e.t:
            arrive()
        if not e.act and not e.waiting:
            if e.nxt >= n:
                break
            e.t = max(e.t, arr[e.nxt])
            continue
        if e.t > max_time_s:
            break
        if (  # the cheap conditions of a decode-only run first (no call when they fail)
            skip_ahead
            and not e.pref
            and e.iterations >= e.retry_at
            and 0 < e.n_dec <= B
            and e.sample_i >= QUEUE_WARMUP
            and skip_run(e)
        ):
            continue
        if e.iterations % q_every == 0 or e.sample_i < QUEUE_WARMUP:
            sample()
        nd, budget, d_ctx, chunks, sel = schedule()
        admit(budget, chunks)
        step(nd, d_ctx, chunks, sel)
    return EngineRun(
        first_token_s=np.asarray(e.first, dtype=np.float64),
        finish_s=np.asarray(e.finish, dtype=np.float64),
        rejected=e.rejected,
        preemptions=e.preemptions,
        iterations=e.iterations,
        busy_s=e.busy,
        end_s=e.t,
        queue_t_s=np.asarray(e.q_t, dtype=np.float64),
        queue_len=np.asarray(e.q_len, dtype=np.int64),
        kv_used_tokens=np.asarray(e.q_kv, dtype=np.int64),
        recompute_tokens=e.recomputed,
    )
