"""The iteration loop of :func:`perfmodel.sim.simulate.simulate` (scalar state, exact skip-ahead).

The engine semantics are documented in :mod:`perfmodel.sim.simulate`; this module is how
they are executed fast:

* **Per-request state in Python scalars.** A decoding request advances one token per
  iteration, so instead of touching every decoder each iteration the engine keeps a
  global decode counter ``G`` and stores a decoder's context and generated count as
  offsets from it (``ctx = base + G``). The decode context of an iteration is then
  ``Σ base + n_dec·G``, and completions come from a calendar keyed by the value of
  ``G`` at which each decoder reaches its output length (``EngineState.due``). An
  ordinary iteration costs well under a microsecond whatever the batch size.
* **The common iteration in locals.** :func:`run_engine` keeps the engine's counters
  (time, busy time, iterations, ``G``, KV held, decoders, ``Σ base``, the next arrival,
  the next calendar ``G``) in local variables and runs the common iteration inline:
  arrivals, a decode-only step (``StepTable.time_s`` inlined from
  :func:`perfmodel.sim.engine_state.step_terms`) and completions. An iteration that
  admits requests (no prefill running, the decoders within the budget, no prefix cache)
  is :func:`perfmodel.sim.admission.make_admit`; one with prefills already running, more
  decoders than the budget, a preemption, or admissions with a prefix cache goes through
  the general ``EngineState.schedule`` / ``admit`` / ``step``
  (:meth:`EngineState.iterate_from`: the counters written back first and read after).
  Every path performs the float operations of the general one in its order, so the
  results are the same bit for bit (``tests/unit/test_sim_loop.py`` runs a table whose
  ``time_s`` is called for every iteration against the inlined one).
* **Decode-only skip-ahead (exact).** When no request is in prefill, no waiting request
  is admissible (the queue is empty, the budget is used up, or the head's first chunk
  does not fit: since the KV held only grows while everyone decodes, it stays blocked)
  and all decoders fit the budget, the next ``j`` iterations are identical except that
  the total context grows by ``n_dec`` per iteration. Their step times are evaluated
  in a tight loop (:func:`perfmodel.sim.skip_ahead.make_skip_run`, tried only when the
  next completion and arrival look at least ``MIN_RUN`` iterations away: shorter runs
  cost more to set up than to step), or for a long run in one vectorized call
  (:meth:`perfmodel.step.table.StepTable.decode_run_s`) accumulated left to right
  (``numpy.cumsum``, the same float additions as the iteration loop), and ``j`` stops
  at the first of: the next arrival (an iteration starting at or after it must absorb
  it), the first completion (included: it is the last iteration of the run), KV
  exhaustion (an iteration that would need a preemption), and ``max_time_s``. Queue
  samples falling inside the run are recorded as the loop would. ``skip_ahead=False``
  runs every iteration one by one; both give the same per-request times, bit for bit
  (tested).
"""

from __future__ import annotations

import gc
import math
from dataclasses import dataclass
from heapq import heappop, heappush

import numpy as np
from numpy.typing import NDArray

from perfmodel.errors import SpecError
from perfmodel.sim.admission import make_admit
from perfmodel.sim.engine_state import NO_TERMS, QUEUE_WARMUP, EngineState
from perfmodel.sim.skip_ahead import MIN_RUN, make_skip_run

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


def run_engine(e: EngineState, *, skip_ahead: bool, general: bool = False) -> EngineRun:
    """Run the engine from state ``e`` (its inputs already validated by ``simulate``).

    ``general``: every iteration through ``EngineState.schedule`` / ``admit`` / ``step``,
    no inline path and no skip-ahead (the reference the fast paths are tested against).
    The loop creates no reference cycles, so the cyclic garbage collector is paused while
    it runs (its passes over the young tuples cost ~5 % of a busy run) and restored after.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _run(e, skip_ahead and not general, general)
    finally:
        if enabled:
            gc.enable()


def _run(e: EngineState, skip_ahead: bool, general: bool) -> EngineRun:
    n, arr, s_in, o_out, gen_done, M, B, C = e.n, e.arr, e.s_in, e.o_out, e.gen_done, e.M, e.B, e.C
    room, max_time_s, q_every, waiting, act, pref, due, dues = (
        M - e.reserve, e.max_time_s, e.q_every, e.waiting, e.act, e.pref, e.due, e.dues
    )  # fmt: skip
    ctx, gen, isdec, gfin, finish, first = e.ctx, e.gen, e.isdec, e.gfin, e.finish, e.first
    q_t, q_len, q_kv, pc, tt, terms = e.q_t, e.q_len, e.q_kv, e.pc, e.tt, e.terms
    admit, skip_run = make_admit(e), make_skip_run(e, terms)
    skip_ahead = skip_ahead and terms is not None  # else the skip-ahead makes the same calls
    token_s, rows_s, a_pp, a_dp, a_kv, a_tok, a_dx, over = terms or NO_TERMS
    zero, inf = a_pp * 0.0, math.inf  # no prefill pairs
    t, busy, dt, it, G, kv, nd, bs, nxt, sample_i = (
        e.t, e.busy, e.dt, e.iterations, e.G, e.kv_used, e.n_dec, e.base_sum, e.nxt, e.sample_i
    )  # fmt: skip
    na = arr[nxt] if nxt < n else inf  # the next arrival
    gnext = dues[0] if dues else inf  # the next G at which decoders may complete
    warm, has_pc, exact = QUEUE_WARMUP, pc is not None, terms is not None
    qn = it if sample_i < warm else it + (-it) % q_every  # the next iteration sampled
    Bg = -1 if general else B  # n_dec > Bg sends an iteration to the general path
    while True:
        if na <= t:  # arrivals up to t join the queue (a request that can never fit: rejected)
            while na <= t:
                if s_in[nxt] + o_out[nxt] > M:
                    e.rejected += 1
                else:
                    waiting.append(nxt)
                nxt += 1
                na = arr[nxt] if nxt < n else inf
        if not act and not waiting:
            if nxt >= n:
                break
            t = max(t, na)
            continue
        if t > max_time_s:
            break
        # a decode-only run that looks worth it (stepping gives the same; see skip_ahead)
        # when no prefill runs, the decoders fit the budget and the queue's head is blocked
        if (skip_ahead and gnext - G >= MIN_RUN and na - t >= MIN_RUN * dt and not pref
                and 0 < nd <= B and sample_i >= warm and it >= e.retry_at
                and (not waiting or nd == B or kv + nd + min(
                    s_in[waiting[0]] + gen_done[waiting[0]], C, B - nd) > room)
                and (ran := skip_run(t, busy, dt, it, G, kv, nd, bs, na)) is not None):  # fmt: skip
            t, busy, dt, it, G, kv, sampled = ran
            sample_i, qn = sample_i + sampled, it + (-it) % q_every
        else:
            if it >= qn:  # the first QUEUE_WARMUP iterations, then every q_every-th
                q_t.append(t)
                q_len.append(len(waiting))
                q_kv.append(kv)
                sample_i += 1
                qn = it + 1 if sample_i < warm else it + q_every - it % q_every
            # running prefills, a preemption, capped decodes, admissions with a prefix cache
            if pref or kv + nd > M or nd > Bg or (has_pc and waiting and nd < B):
                t, busy, dt, it, G, kv, nd, bs = e.iterate_from(t, busy, dt, it, G, kv, nd, bs)
                gnext = dues[0] if dues else inf
            elif (waiting and exact and len(waiting) == 1 and (g0 := gen_done[r := waiting[0]])
                    + 1 < o_out[r] and (rm := s_in[r] + g0) <= C and nd + rm <= B
                    and kv + nd + rm <= room):  # fmt: skip
                # make_admit for its commonest case: one request, its whole prompt in one
                # chunk, a decoder after it (the same operations, no call)
                waiting.popleft()
                d_ctx, kv, G = bs + nd * G, kv + nd + rm, G + 1
                act[r] = None
                ctx[r], gen[r], isdec[r], gfin[r] = rm - G, g0 + 1 - G, True, o_out[r] - g0 - 1 + G
                if (b := due.get(g := gfin[r])) is None:
                    due[g] = [r]
                    heappush(dues, g)
                    gnext = g if g < gnext else gnext
                else:
                    b.append(r)
                c = a_pp * (rm * (rm + 1) / 2) + a_dp * (d_ctx + nd)
                m = a_kv * (d_ctx + rm) + a_tok * (nd + rm) + a_dx * d_ctx
                dt = token_s[nd + rm] + rows_s[nd + 1] + (m if m > c else c) + over
                t = t + dt
                if first[r] == inf:
                    first[r] = t
                busy, it, nd, bs = busy + dt, it + 1, nd + 1, bs + rm - G
            elif waiting and nd < B and (s := admit(t, busy, it, G, kv + nd, nd, bs)):
                t, busy, dt, it, G, kv, nd, bs, gnext = s  # admissions (admission.make_admit)
            elif not nd:  # nothing fits: the head request waits for memory that never frees
                if not act and waiting:
                    raise SpecError("a request cannot be admitted into an empty KV cache")
                continue
            else:  # every decoder advances, no prefill is running, nothing admitted
                kv += nd
                d_ctx = bs + nd * G
                if exact:  # StepTable.time_s of (nd, nd, 0.0, d_ctx + nd, d_ctx) inlined
                    c = zero + a_dp * (d_ctx + nd)
                    m = a_kv * d_ctx + a_tok * nd + a_dx * d_ctx
                    dt = token_s[nd] + rows_s[nd] + (m if m > c else c) + over
                else:
                    dt = tt(nd, nd, 0.0, d_ctx + nd, d_ctx, 0, 0, nd)
                t = t + dt
                busy += dt
                it += 1
                G += 1
        if gnext <= G:  # decoders that reached their output length (the calendar)
            while dues and dues[0] <= G:
                g = heappop(dues)
                for k in due.pop(g):
                    if gfin[k] == g and isdec[k] and k in act:
                        finish[k] = t
                        cx = ctx[k]
                        kv -= cx + G
                        if has_pc:
                            pc.freed += cx + G  # type: ignore[union-attr]
                        nd -= 1
                        bs -= cx
                        del act[k]
            gnext = dues[0] if dues else inf
    e.t, e.busy, e.iterations, e.nxt = t, busy, it, nxt
    return _result(e)


def _result(e: EngineState) -> EngineRun:
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
