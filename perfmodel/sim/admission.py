"""An iteration that admits waiting requests, stepped in locals (see :mod:`perfmodel.sim.engine`).

:func:`make_admit_step` builds the common iteration with admissions: no prefill was
running, every decoder fits the budget (so ``EngineState.schedule`` would only have
counted the decodes) and there is no prefix cache. It admits waiting requests FIFO as
``EngineState.admit`` does and costs the iteration through the step table as
``EngineState.step`` does (the same float operations in the same order). A request whose
whole prompt fits its first chunk is written straight into the state it has after the
iteration (``EngineState._advance_chunks``: a decoder, its context and generated count
as offsets from the next ``G``, its completion on the heap; or done at its first token),
so only the first-token times wait for the iteration's end. The state's lists are bound
in a closure once (the loop calls it once per admitting iteration).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from heapq import heappush

from perfmodel.sim.engine_state import NO_TERMS, Counters, EngineState

AdmitStep = Callable[[float, float, int, int, int, int, int, int], Counters | None]


def make_admit_step(e: EngineState) -> AdmitStep:
    """``admit_step(t, busy, iterations, G, kv, n_dec, Σ base, decode context)``: admit and
    step one iteration of ``e``; the counters after it, or None (nothing admitted: nothing
    changed). ``kv`` already holds the decodes' new tokens."""
    waiting, s_in, gen_done, o_out, C, B, room = (
        e.waiting, e.s_in, e.gen_done, e.o_out, e.C, e.B, e.M - e.reserve
    )  # fmt: skip
    req, ctx, rem, gen, out, gfin, seq_of, isdec = (
        e.req, e.ctx, e.rem, e.gen, e.out, e.gfin, e.seq_of, e.isdec
    )  # fmt: skip
    free, act, pref, heap, first, finish = e.free, e.act, e.pref, e.heap, e.first, e.finish
    tt, terms = e.tt, e.terms
    token_s, rows_s, a_pp, a_dp, a_kv, a_tok, a_dx, over = terms or NO_TERMS
    inf = math.inf

    def admit_step(
        t: float, busy: float, it: int, G: int, kv: int, nd: int, bs: int, d_ctx: int
    ) -> Counters | None:
        budget = B - nd
        r = waiting[0]
        rm = s_in[r] + gen_done[r]  # recompute prompt + generated after a preemption
        c = rm if rm < C else C  # min(rm, C, budget)
        if c > budget:
            c = budget
        if kv + c > room:
            return None
        G1 = G + 1  # G after this iteration
        new_first: list[int] = []  # requests whose first token ends this iteration
        done: list[int] = []  # slots whose request is complete then
        pre_tok = pre_seqs = new_dec = new_base = 0  # pre_tok is also the KV read
        pairs = 0.0
        seq = e.seq
        while True:
            waiting.popleft()
            pre_tok += c
            pre_seqs += 1
            pairs += c * (c + 1) / 2  # EngineState.step's c·0 + c(c+1)/2: it starts at 0
            kv += c
            budget -= c
            g0, o = gen_done[r], o_out[r]
            if free:
                k = free.pop()
            else:
                k = len(req)
                for slots in (req, ctx, rem, gen, out, gfin, seq_of):
                    slots.append(0)
                isdec.append(False)
            req[k], out[k], seq_of[k] = r, o, seq
            act[k] = None
            if c < rm:  # a prefill that goes on next iteration
                ctx[k], rem[k], gen[k], isdec[k] = c, rm - c, g0, False
                pref[k] = None
            else:  # the prompt is done: its first token ends this iteration
                if first[r] == inf:
                    new_first.append(r)
                rem[k] = 0
                if g0 + 1 >= o:
                    ctx[k], gen[k], isdec[k] = c, g0 + 1, False
                    done.append(k)
                else:  # a decoder: offsets from G1
                    ctx[k], gen[k], isdec[k] = c - G1, g0 + 1 - G1, True
                    gfin[k] = g = o - g0 - 1 + G1
                    heappush(heap, (g, seq, k))
                    new_dec += 1
                    new_base += c - G1
            seq += 1
            if budget <= 0 or not waiting:
                break
            r = waiting[0]
            rm = s_in[r] + gen_done[r]
            c = rm if rm < C else C
            if c > budget:
                c = budget
            if kv + c > room:
                break
        e.seq = seq
        if terms is None:
            T, R, dp, kvr = nd + pre_tok, nd + pre_seqs, d_ctx + nd, d_ctx + pre_tok
            dt = tt(T, R, pairs, dp, kvr, pre_tok, pre_seqs, nd)
        else:  # StepTable.time_s inlined (engine_state.step_terms)
            pc_ = a_pp * pairs + a_dp * (d_ctx + nd)
            pm = a_kv * (d_ctx + pre_tok) + a_tok * (nd + pre_tok) + a_dx * d_ctx
            dt = token_s[nd + pre_tok] + rows_s[nd + pre_seqs] + (pm if pm > pc_ else pc_) + over
        t = t + dt
        for r in new_first:
            first[r] = t
        for k in done:
            finish[req[k]] = t
            kv -= ctx[k]
            del act[k]
            free.append(k)
        return t, busy + dt, dt, it + 1, G1, kv, nd + new_dec, bs + new_base

    return admit_step
