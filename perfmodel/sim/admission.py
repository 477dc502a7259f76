"""An iteration that admits waiting requests, stepped in locals (see :mod:`perfmodel.sim.engine`).

:func:`make_admit` builds the common iteration with admissions: no prefill was running,
every decoder fits the budget (so ``EngineState.schedule`` would only have counted the
decodes) and there is no prefix cache. It admits waiting requests FIFO as
``EngineState.admit`` does and costs the iteration through the step table as
``EngineState.step`` does (the same float operations in the same order). A request whose
whole prompt fits its first chunk is written straight into the state it has after the
iteration (``EngineState._advance_chunks``: a decoder, its context and generated count as
offsets from the next ``G``, its completion in the calendar; or done at its first token),
so only the first-token times wait for the iteration's end. The state's lists are bound
in a closure once (the loop calls it once per admitting iteration).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from heapq import heappush

from perfmodel.sim.engine_state import NO_TERMS, EngineState

#: the loop's counters after an admitting iteration, then the next calendar G
Admitted = tuple[float, float, float, int, int, int, int, int, float]
Admit = Callable[[float, float, int, int, int, int, int], Admitted | None]


def make_admit(e: EngineState) -> Admit:
    """``admit(t, busy, iterations, G, kv, n_dec, Σ base)``: admit waiting requests and
    step one iteration of ``e``; the counters after it and the next calendar ``G`` (a
    lower bound of the next completion), or None (nothing admitted: nothing changed).
    ``kv`` already holds the decodes' new tokens; the loop checked ``n_dec < B`` and that
    a request waits."""
    waiting, s_in, gen_done, o_out, C, B, room = (
        e.waiting, e.s_in, e.gen_done, e.o_out, e.C, e.B, e.M - e.reserve
    )  # fmt: skip
    ctx, rem, gen, gfin, isdec, act, pref = e.ctx, e.rem, e.gen, e.gfin, e.isdec, e.act, e.pref
    due, dues, first, finish = e.due, e.dues, e.first, e.finish
    tt, terms = e.tt, e.terms
    token_s, rows_s, a_pp, a_dp, a_kv, a_tok, a_dx, over = terms or NO_TERMS
    inf = math.inf

    def admit(t: float, busy: float, it: int, G: int, kv: int, nd: int, bs: int) -> Admitted | None:
        budget, G1 = B - nd, G + 1  # G1: G after this iteration
        new_first: list[int] = []  # requests whose first token ends this iteration
        done: list[int] = []  # requests complete then
        pre_tok = pre_seqs = new_dec = new_base = 0  # pre_tok is also the KV read
        pairs = 0.0
        while True:
            r = waiting[0]
            g0 = gen_done[r]
            rm = s_in[r] + g0  # recompute prompt + generated after a preemption
            c = rm if rm < C else C  # min(rm, C, budget)
            if c > budget:
                c = budget
            if kv + c > room:
                break
            waiting.popleft()
            pre_tok += c
            pre_seqs += 1
            pairs += c * (c + 1) / 2  # EngineState.step's c·0 + c(c+1)/2: it starts at 0
            kv += c
            budget -= c
            act[r] = None
            if first[r] == inf and c == rm:
                new_first.append(r)  # its prompt is done: the first token ends this iteration
            if c < rm:  # a prefill that goes on next iteration
                ctx[r], rem[r], gen[r], isdec[r] = c, rm - c, g0, False
                pref[r] = None
            elif g0 + 1 < o_out[r]:  # a decoder: offsets from G1, its completion in the calendar
                ctx[r], gen[r], isdec[r] = c - G1, g0 + 1 - G1, True
                gfin[r] = g = o_out[r] - g0 - 1 + G1
                if (b := due.get(g)) is None:
                    due[g] = [r]
                    heappush(dues, g)
                else:
                    b.append(r)
                new_dec += 1
                new_base += c - G1
            else:  # done at its first token
                ctx[r], rem[r], gen[r], isdec[r] = c, 0, g0 + 1, False
                done.append(r)
            if budget <= 0 or not waiting:
                break
        if not pre_seqs:
            return None
        d_ctx = bs + nd * G
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
        for r in done:
            finish[r] = t
            kv -= ctx[r]
            del act[r]
        gnext = dues[0] if dues else inf
        return t, busy + dt, dt, it + 1, G1, kv, nd + new_dec, bs + new_base, gnext

    return admit
