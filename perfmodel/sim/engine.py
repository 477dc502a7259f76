"""The iteration loop of :func:`perfmodel.simulate.simulate` (scalar state, exact skip-ahead).

The engine semantics are documented in :mod:`perfmodel.simulate`; this module is how
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
  in one vectorized call (:meth:`perfmodel.steptable.StepTable.decode_run_s`) and
  accumulated left to right (``numpy.cumsum``, the same float additions as the
  iteration loop), and ``j`` stops at the first of: the next arrival (an iteration
  starting at or after it must absorb it), the first completion (included: it is the
  last iteration of the run), KV exhaustion (an iteration that would need a
  preemption), and ``max_time_s``. Queue samples falling inside the run are recorded
  as the loop would. ``skip_ahead=False`` runs every iteration one by one; both give
  the same per-request times (tested).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from perfmodel.errors import SpecError
from perfmodel.step.table import StepTable

Arr = NDArray[np.float64]
# Decode-only runs at least this long are evaluated with numpy (~20 µs a call); shorter
# ones in a scalar loop (~0.5 µs an iteration). The result is the same either way.
_VECTOR_RUN = 64


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


def run_engine(
    table: StepTable,
    arrival_s: Arr,
    input_tokens: NDArray[np.int64],
    output_tokens: NDArray[np.int64],
    *,
    kv_capacity_tokens: int,
    max_batched_tokens: int,
    chunk_size: int,
    reserve_tokens: int,
    max_time_s: float,
    queue_samples: int,
    skip_ahead: bool,
) -> EngineRun:
    """Run the engine (inputs already validated by ``simulate``)."""
    M, B, C, reserve = kv_capacity_tokens, max_batched_tokens, chunk_size, reserve_tokens
    arr = arrival_s.tolist()
    s_in = input_tokens.tolist()
    o_out = output_tokens.tolist()
    n = len(arr)
    inf = math.inf
    first = [inf] * n
    finish = [inf] * n
    gen_done = [0] * n  # tokens generated, kept across a preemption
    tt = table.time_s
    run_s = table.decode_run_s

    # per-slot state; for a decoder ctx/gen hold offsets from G, for a prefill absolute values
    req: list[int] = []
    ctx: list[int] = []
    rem: list[int] = []
    gen: list[int] = []
    out: list[int] = []
    gfin: list[int] = []  # decoder: the value of G at which it has generated `out` tokens
    seq_of: list[int] = []
    isdec: list[bool] = []
    free: list[int] = []
    act: dict[int, None] = {}  # running slots in admission order (newest last)
    pref: dict[int, None] = {}  # running slots still in prefill, admission order
    heap: list[tuple[int, int, int]] = []  # (gfin, seq, slot); stale entries skipped
    n_dec_all = 0  # decoders
    base_sum = 0  # Σ ctx offsets of the decoders
    G = 0

    waiting: deque[int] = deque()
    nxt = 0
    t = 0.0
    busy = 0.0
    kv_used = 0
    seq = 0
    rejected = preemptions = iterations = 0
    q_every = max(1, n // max(queue_samples, 1))
    q_t: list[float] = []
    q_len: list[int] = []
    q_kv: list[int] = []
    sample_i = 0
    dt = 0.0  # the last iteration's time
    retry_at = 0  # a decode-only run is known to be impossible before this iteration

    def valid(entry: tuple[int, int, int]) -> bool:
        g, sq, k = entry
        return k in act and isdec[k] and seq_of[k] == sq and gfin[k] == g

    def preempt_newest() -> tuple[int, bool, int]:
        """Free the most recently admitted running request (vLLM recompute preemption).

        Returns its slot, whether it was decoding, and its context before this iteration.
        """
        nonlocal kv_used, preemptions, n_dec_all, base_sum
        k = next(reversed(act))
        r = req[k]
        dec = isdec[k]
        if dec:
            c, g = ctx[k] + G, gen[k] + G
            n_dec_all -= 1
            base_sum -= ctx[k]
        else:
            c, g = ctx[k], gen[k]
            del pref[k]
        kv_used -= c
        gen_done[r] = g
        del act[k]
        free.append(k)
        preemptions += 1
        waiting.appendleft(r)
        return k, dec, c

    def finish_decoders() -> None:
        """Complete the decoders whose generated count reached their output length."""
        nonlocal kv_used, n_dec_all, base_sum
        while heap and heap[0][0] <= G:
            e = heapq.heappop(heap)
            if not valid(e):
                continue
            k = e[2]
            finish[req[k]] = t
            kv_used -= ctx[k] + G
            n_dec_all -= 1
            base_sum -= ctx[k]
            del act[k]
            free.append(k)

    while True:
        while nxt < n and arr[nxt] <= t:
            if s_in[nxt] + o_out[nxt] > M:
                rejected += 1
            else:
                waiting.append(nxt)
            nxt += 1
        if not act and not waiting:
            if nxt >= n:
                break
            t = max(t, arr[nxt])
            continue
        if t > max_time_s:
            break
        # ---- decode-only run: advance j identical iterations at once ----------------------
        nd = n_dec_all
        if skip_ahead and iterations >= retry_at and not pref and 0 < nd <= B and sample_i >= 64:
            blocked = True
            if waiting and nd < B:
                r = waiting[0]
                blocked = kv_used + nd + min(s_in[r] + gen_done[r], C, B - nd) > M - reserve
            if blocked:
                while heap and not valid(heap[0]):
                    heapq.heappop(heap)
                # exact bounds: the first completion (its iteration ends the run) and the KV
                j = min(heap[0][0] - G, (M - kv_used) // nd)
                limit = min(arr[nxt] if nxt < n else inf, max_time_s)
                jv = j
                if j >= _VECTOR_RUN and dt > 0 and limit < inf:
                    # decode steps only lengthen along a run, so the last step time bounds
                    # how many fit before the limit (a cap for speed; the times decide)
                    jv = min(j, int((limit - t) / dt) + 2)
                if j < 2:
                    retry_at = iterations + j  # a completion or a preemption is due
                elif jv >= _VECTOR_RUN:  # long run: one vectorized evaluation
                    dts = run_s(nd, base_sum + nd * G, jv)
                    starts = np.cumsum(np.concatenate(([t], dts)))
                    if nxt < n:  # an iteration starting at or after an arrival absorbs it
                        jv = min(jv, int(np.searchsorted(starts, arr[nxt], side="left")))
                    jv = min(jv, int(np.searchsorted(starts, max_time_s, side="right")))
                    for i in range((-iterations) % q_every, jv, q_every):
                        q_t.append(float(starts[i]))
                        q_len.append(len(waiting))
                        q_kv.append(kv_used + i * nd)
                        sample_i += 1
                    t = float(starts[jv])
                    busy = float(np.cumsum(np.concatenate(([busy], dts[:jv])))[-1])
                    dt = float(dts[jv - 1])
                    iterations += jv
                    kv_used += jv * nd
                    G += jv
                    finish_decoders()
                    continue
                else:  # short run: the same iterations in a tight scalar loop
                    step = table.decode_step_fn(nd)
                    x = base_sum + nd * G
                    i = 0
                    while True:
                        if iterations % q_every == 0:
                            sample_i += 1
                            q_t.append(t)
                            q_len.append(len(waiting))
                            q_kv.append(kv_used)
                        dt = step(x)
                        t += dt
                        busy += dt
                        iterations += 1
                        kv_used += nd
                        x += nd
                        i += 1
                        if i == j or t >= limit:  # limit: the next start would absorb / stop
                            break
                    G += i
                    finish_decoders()
                    continue
        if iterations % q_every == 0 or sample_i < 64:
            sample_i += 1
            q_t.append(t)
            q_len.append(len(waiting))
            q_kv.append(kv_used)
        # ---- running requests: decodes (oldest B if more), then ongoing prefills -----------
        capped = nd > B
        sel: set[int] = set()
        if capped:
            sel = set([k for k in act if isdec[k]][:B])
            nd = B
        while nd and kv_used + nd > M:
            v, was_dec, _ = preempt_newest()
            if was_dec and (not capped or v in sel):
                nd -= 1
                sel.discard(v)
        kv_used += nd
        budget = B - nd
        d_ctx = sum(ctx[k] for k in sel) + nd * G if capped else base_sum + nd * G
        chunks: list[tuple[int, int]] = []
        if budget > 0 and pref:
            for k in list(pref):
                if budget <= 0:
                    break
                if k not in act:
                    continue
                c = min(rem[k], C, budget)
                while kv_used + c > M and k in act:
                    v, was_dec, vctx = preempt_newest()
                    if was_dec and (not capped or v in sel):
                        sel.discard(v)
                        nd -= 1
                        kv_used -= 1
                        budget += 1
                        d_ctx -= vctx
                if k not in act:
                    continue
                c = min(rem[k], C, budget)
                chunks.append((k, c))
                kv_used += c
                budget -= c
        # ---- admit waiting requests FIFO while the budget and the KV allow ----------------
        while budget > 0 and waiting:
            r = waiting[0]
            rm = s_in[r] + gen_done[r]  # recompute prompt + generated after a preemption
            c = min(rm, C, budget)
            if kv_used + c > M - reserve:
                break
            waiting.popleft()
            if free:
                k = free.pop()
                req[k], ctx[k], rem[k], gen[k], out[k] = r, 0, rm, gen_done[r], o_out[r]
                seq_of[k], isdec[k] = seq, False
            else:
                k = len(req)
                req.append(r)
                ctx.append(0)
                rem.append(rm)
                gen.append(gen_done[r])
                out.append(o_out[r])
                gfin.append(0)
                seq_of.append(seq)
                isdec.append(False)
            seq += 1
            act[k] = None
            pref[k] = None
            chunks.append((k, c))
            kv_used += c
            budget -= c
        pre_tok = 0
        pairs = 0.0
        kv_read = 0
        for k, c in chunks:
            cx = ctx[k]
            pre_tok += c
            pairs += c * cx + c * (c + 1) / 2
            kv_read += cx + c
        pre_seqs = len(chunks)
        tokens = nd + pre_tok
        if tokens == 0:  # nothing fits: the head request waits for memory that never frees
            if not act and waiting:
                raise SpecError("a request cannot be admitted into an empty KV cache")
            continue
        dt = tt(
            tokens,
            nd + pre_seqs,
            pairs,
            d_ctx + nd,
            d_ctx + kv_read,
            prefill_tokens=pre_tok,
            prefill_seqs=pre_seqs,
            decode_seqs=nd,
        )
        t += dt
        busy += dt
        iterations += 1
        # ---- apply the iteration ---------------------------------------------------------
        if capped:  # decoders left out of the budget do not advance: shift their offsets
            for k in act:
                if isdec[k] and k not in sel:
                    ctx[k] -= 1
                    gen[k] -= 1
                    base_sum -= 1
                    gfin[k] += 1
                    heapq.heappush(heap, (gfin[k], seq_of[k], k))
        G += 1
        for k, c in chunks:
            ctx[k] += c
            rem[k] -= c
            if rem[k] == 0:
                gen[k] += 1
                r = req[k]
                if first[r] == inf:
                    first[r] = t
                del pref[k]
                if gen[k] >= out[k]:
                    finish[r] = t
                    kv_used -= ctx[k]
                    del act[k]
                    free.append(k)
                else:  # becomes a decoder: store offsets from G
                    ctx[k] -= G
                    gen[k] -= G
                    isdec[k] = True
                    n_dec_all += 1
                    base_sum += ctx[k]
                    gfin[k] = out[k] - gen[k]
                    heapq.heappush(heap, (gfin[k], seq_of[k], k))
        finish_decoders()
    return EngineRun(
        first_token_s=np.asarray(first, dtype=np.float64),
        finish_s=np.asarray(finish, dtype=np.float64),
        rejected=rejected,
        preemptions=preemptions,
        iterations=iterations,
        busy_s=busy,
        end_s=t,
        queue_t_s=np.asarray(q_t, dtype=np.float64),
        queue_len=np.asarray(q_len, dtype=np.int64),
        kv_used_tokens=np.asarray(q_kv, dtype=np.int64),
    )
