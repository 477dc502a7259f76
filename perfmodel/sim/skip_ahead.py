"""Decode-only skip-ahead of the simulator engine (exact; see :mod:`perfmodel.sim.engine`)."""

from __future__ import annotations

import heapq
import math

import numpy as np

from perfmodel.sim.engine_state import QUEUE_WARMUP, EngineState

# Decode-only runs at least this long are evaluated with numpy (~20 µs a call); shorter
# ones in a scalar loop (~0.5 µs an iteration). The result is the same either way.
VECTOR_RUN = 64


def skip_ahead(e: EngineState) -> bool:
    """Advance a run of identical decode-only iterations if one applies (see the
    module docstring); False if the next iteration must be stepped on its own."""
    nd, B = e.n_dec, e.B
    if e.iterations < e.retry_at or e.pref or not 0 < nd <= B:
        return False
    if e.sample_i < QUEUE_WARMUP:
        return False
    waiting, kv_used = e.waiting, e.kv_used
    if waiting and nd < B:
        r = waiting[0]
        head = e.s_in[r] + e.gen_done[r]
        if kv_used + nd + min(head, e.C, B - nd) <= e.M - e.reserve:
            return False  # the head of the queue can be admitted
    heap = e.heap
    while heap and not e.valid(heap[0]):
        heapq.heappop(heap)
    # exact bounds: the first completion (its iteration ends the run) and the KV
    j = min(heap[0][0] - e.G, (e.M - kv_used) // nd)
    nxt, t = e.nxt, e.t
    limit = min(e.arr[nxt] if nxt < e.n else math.inf, e.max_time_s)
    jv = j
    if j >= VECTOR_RUN and e.dt > 0 and limit < math.inf:
        # decode steps only lengthen along a run, so the last step time bounds how many
        # fit before the limit (a cap for speed; the times decide)
        jv = min(j, int((limit - t) / e.dt) + 2)
    if j < 2:
        e.retry_at = e.iterations + j  # a completion or a preemption is due
        return False
    if jv >= VECTOR_RUN:
        _vector_run(e, nd, jv)
    else:
        _scalar_run(e, nd, j, limit)
    e.finish_decoders()
    return True


def _vector_run(e: EngineState, nd: int, jv: int) -> None:
    """A long decode-only run: step times in one vectorized call, summed left to right."""
    dts = e.table.decode_run_s(nd, e.base_sum + nd * e.G, jv)
    starts = np.cumsum(np.concatenate(([e.t], dts)))
    if e.nxt < e.n:  # an iteration starting at or after an arrival absorbs it
        jv = min(jv, int(np.searchsorted(starts, e.arr[e.nxt], side="left")))
    jv = min(jv, int(np.searchsorted(starts, e.max_time_s, side="right")))
    kv_used = e.kv_used
    for i in range((-e.iterations) % e.q_every, jv, e.q_every):
        e.sample(float(starts[i]), kv_used + i * nd)
    e.t = float(starts[jv])
    e.busy = float(np.cumsum(np.concatenate(([e.busy], dts[:jv])))[-1])
    e.dt = float(dts[jv - 1])
    e.iterations += jv
    e.kv_used += jv * nd
    e.G += jv


def _scalar_run(e: EngineState, nd: int, j: int, limit: float) -> None:
    """A short decode-only run: the same iterations in a tight scalar loop."""
    step = e.decode_steps.get(nd)
    if step is None:  # one closure per decoder count (building it reads numpy scalars)
        step = e.decode_steps[nd] = e.table.decode_step_fn(nd)
    x = e.base_sum + nd * e.G
    t, busy, it, kv, q_every = e.t, e.busy, e.iterations, e.kv_used, e.q_every
    i = 0
    dt = e.dt
    while True:
        if it % q_every == 0:
            e.t, e.kv_used = t, kv
            e.sample()
        dt = step(x)
        t += dt
        busy += dt
        it += 1
        kv += nd
        x += nd
        i += 1
        if i == j or t >= limit:  # limit: the next start would absorb it / stop
            break
    e.t, e.busy, e.iterations, e.kv_used, e.dt = t, busy, it, kv, dt
    e.G += i
