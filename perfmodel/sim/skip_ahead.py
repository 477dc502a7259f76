"""Decode-only skip-ahead of the simulator engine (exact; see :mod:`perfmodel.sim.engine`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from heapq import heappop

import numpy as np

from perfmodel.sim.engine_state import NO_TERMS, EngineState, StepTerms

# Decode-only runs at least this long are evaluated with numpy (~30 µs a call); shorter
# ones in a scalar loop (~0.2 µs an iteration). The result is the same either way.
VECTOR_RUN = 160
# The loop tries a run only when the next completion and arrival look at least this many
# iterations away (a cheap estimate; shorter runs cost more to set up than to step).
MIN_RUN = 8

#: the loop's counters after a run: t, busy, dt, iterations, G, KV held, queue samples taken
RunCounters = tuple[float, float, float, int, int, int, int]


SkipRun = Callable[[float, float, float, int, int, int, int, int, float], RunCounters | None]


def make_skip_run(e: EngineState, terms: StepTerms | None) -> SkipRun:
    """``skip_run(t, busy, dt, iterations, G, kv, n_dec, Σ base, next arrival)``: advance a
    run of identical decode-only iterations of ``e`` if one applies, from the loop's
    counters; None if the next iteration must be stepped on its own. The loop checked
    that no prefill runs, ``0 < n_dec ≤ B``, the warm-up is over and no waiting request is
    admissible; it completes the decoders at the run's end."""
    due, dues, act, isdec, gfin, M, max_time_s = (
        e.due, e.dues, e.act, e.isdec, e.gfin, e.M, e.max_time_s
    )  # fmt: skip
    q_every, q_t, q_len, q_kv, waiting = e.q_every, e.q_t, e.q_len, e.q_kv, e.waiting
    token_s, rows_s, a_pp, a_dp, a_kv, a_tok, a_dx, over = terms or NO_TERMS  # None: unused
    zero = a_pp * 0.0  # no prefill pairs

    def skip_run(
        t: float, busy: float, dt: float, it: int, G: int, kv: int, nd: int, bs: int, na: float
    ) -> RunCounters | None:
        while True:  # drop stale calendar entries: the top is then the first completion
            g = dues[0]
            for k in due[g]:
                if gfin[k] == g and isdec[k] and k in act:
                    break
            else:
                del due[heappop(dues)]
                continue
            break
        # exact bounds: the first completion (its iteration ends the run) and the KV
        j = min(g - G, (M - kv) // nd)
        if j < 2:
            e.retry_at = it + j  # a completion or a preemption is due
            return None
        limit = min(na, max_time_s)
        if j >= VECTOR_RUN:
            jv = j
            if dt > 0 and limit < math.inf:
                # decode steps only lengthen along a run, so the last step time bounds how
                # many fit before the limit (a cap for speed; the times decide)
                jv = min(j, int((limit - t) / dt) + 2)
            if jv >= VECTOR_RUN:
                return _vector_run(e, t, busy, it, G, kv, nd, bs, na, jv)
        base, tok, n_wait = token_s[nd] + rows_s[nd], a_tok * nd, len(waiting)
        x = bs + nd * G  # the total context of the run's first iteration
        ns = (-it) % q_every  # the run's first iteration that is sampled
        sampled = 0
        # a step is max(c, m) of two affine functions of x: when m - c is positive at both
        # ends of the run by a margin far above rounding (1e-15), m is the max throughout
        x1 = x + (j - 1) * nd
        m0, m1 = a_kv * x + tok + a_dx * x, a_kv * x1 + tok + a_dx * x1
        d = min(m0 - zero - a_dp * (x + nd), m1 - zero - a_dp * (x1 + nd))
        m_wins = d > 1e-9 * max(m0, m1)
        for i in range(j):
            if i == ns:
                q_t.append(t)
                q_len.append(n_wait)
                q_kv.append(kv + i * nd)
                ns += q_every
                sampled += 1
            if m_wins:
                dt = base + (a_kv * x + tok + a_dx * x) + over
            else:
                c = zero + a_dp * (x + nd)
                m = a_kv * x + tok + a_dx * x
                dt = base + (m if m > c else c) + over
            t += dt
            busy += dt
            x += nd
            if t >= limit:  # the next start would absorb the arrival / stop
                break
        i += 1  # iterations run
        return t, busy, dt, it + i, G + i, kv + i * nd, sampled

    return skip_run


def _vector_run(
    e: EngineState,
    t: float,
    busy: float,
    it: int,
    G: int,
    kv: int,
    nd: int,
    bs: int,
    na: float,
    jv: int,
) -> RunCounters:
    """A long decode-only run: step times in one vectorized call, summed left to right."""
    dts = e.table.decode_run_s(nd, bs + nd * G, jv)
    starts = np.cumsum(np.concatenate(([t], dts)))
    if na < math.inf:  # an iteration starting at or after an arrival absorbs it
        jv = min(jv, int(np.searchsorted(starts, na, side="left")))
    jv = min(jv, int(np.searchsorted(starts, e.max_time_s, side="right")))
    sampled = 0
    n_wait = len(e.waiting)
    for i in range((-it) % e.q_every, jv, e.q_every):
        e.q_t.append(float(starts[i]))
        e.q_len.append(n_wait)
        e.q_kv.append(kv + i * nd)
        sampled += 1
    busy = float(np.cumsum(np.concatenate(([busy], dts[:jv])))[-1])
    return float(starts[jv]), busy, float(dts[jv - 1]), it + jv, G + jv, kv + jv * nd, sampled
