"""The simulator engine's state and its per-iteration phases (see :mod:`perfmodel.sim.engine`).

:class:`EngineState` holds every request's state and the engine's counters; one
iteration is the arrivals, :meth:`~EngineState.schedule` (the running
requests' decodes and chunks, with preemption), :meth:`~EngineState.admit` (waiting
requests, FIFO), :meth:`~EngineState.step` (the iteration's time and effect) and the
completions (done by the loop, :mod:`perfmodel.sim.engine`, from the calendar below). The
decode-only skip-ahead is :mod:`perfmodel.sim.skip_ahead`. The hot methods copy the
attributes they touch into locals.

State is kept per request (index ``r``: no slots to allocate), and a decoder's completion
is in a calendar: ``due[g]`` lists the decoders that reach their output length when the
global decode counter ``G`` reaches ``g``, and the heap ``dues`` holds each such ``g``
once. An entry goes stale when its decoder is preempted or held back (capped decodes);
it is valid iff the request is running, decoding and its ``gfin`` is still ``g``.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

import numpy as np
from numpy.typing import NDArray

from perfmodel.errors import SpecError
from perfmodel.sim.prefix_cache import FreeQueueCache
from perfmodel.step.table import StepTable

Arr = NDArray[np.float64]
QUEUE_WARMUP = 64  # the first this many iterations are all sampled (and no skip-ahead)

#: :meth:`StepTable.time_s`'s terms as Python floats: token_s, rows_s (lists), a_pp, a_dp,
#: a_kv, a_tok, a_dx, over
StepTerms = tuple[list[float], list[float], float, float, float, float, float, float]
#: the loop's counters: t, busy time, the last step, iterations, G, KV held, decoders, Σ base
Counters = tuple[float, float, float, int, int, int, int, int]
NO_TERMS: StepTerms = ([], [], 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)  # placeholders when None


def step_terms(table: StepTable) -> StepTerms | None:
    """The terms of :meth:`StepTable.time_s` as Python floats, for the loop to inline it.

    An iteration of ``T`` tokens, ``R`` rows, prefill pairs ``pp``, decode pairs ``dp``,
    KV read ``kv`` and ``ds`` decodes takes ``token_s[T] + rows_s[R] + max(c, m) + over``
    with ``c = a_pp·pp + a_dp·dp`` and ``m = a_kv·kv + a_tok·T + a_dx·(dp − ds)``, evaluated
    in that order: ``time_s``'s float operations, so bit for bit its value (tested).
    None if ``time_s`` is not that formula (a table that is not ``exact``, or a subclass
    overriding it): the loop then calls it.
    """
    if not table.exact or type(table).time_s is not StepTable.time_s:
        return None
    return (
        table.token_s.tolist(),
        table.rows_s.tolist(),
        float(table.attn_prefill_pair_s),
        float(table.attn_decode_pair_s),
        float(table.attn_kv_token_s),
        float(table.attn_token_s),
        float(table.attn_decode_kv_extra_s),
        float(table.attn_overhead_s),
    )


class EngineState:
    """The engine's state. Per request: for a decoder ``ctx``/``gen`` hold offsets from the
    global decode counter ``G``, for a prefill absolute values."""

    __slots__ = (
        "B", "C", "G", "M", "act", "arr", "base_sum", "busy", "ctx", "dt", "due", "dues",
        "finish", "first", "gen", "gen_done", "gfin", "isdec", "iterations", "kv_used",
        "max_time_s", "n", "n_dec", "nxt", "o_out", "pc", "preemptions", "pref",
        "q_every", "q_kv", "q_len", "q_t", "recomputed", "rejected", "rem", "reserve",
        "retry_at", "s_in", "sample_i", "t", "table", "terms", "tt", "waiting",
    )  # fmt: skip

    def __init__(
        self,
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
        prefix_cache_block_tokens: int = 0,
    ) -> None:
        # a prefix cache keeps a preempted request's blocks until the free queue reaches them
        self.pc = FreeQueueCache(prefix_cache_block_tokens) if prefix_cache_block_tokens else None
        self.recomputed = 0  # tokens computed again after a preemption
        self.M, self.B, self.C = kv_capacity_tokens, max_batched_tokens, chunk_size
        self.reserve, self.max_time_s = reserve_tokens, max_time_s
        self.arr: list[float] = arrival_s.tolist()
        self.s_in: list[int] = input_tokens.tolist()
        self.o_out: list[int] = output_tokens.tolist()
        self.n = n = len(self.arr)
        self.first = [math.inf] * n
        self.finish = [math.inf] * n
        self.gen_done = [0] * n  # tokens generated, kept across a preemption
        self.table, self.tt = table, table.iteration_fn()
        self.terms = step_terms(table)
        self.ctx = [0] * n
        self.rem = [0] * n  # a prefill's prompt tokens still to compute
        self.gen = [0] * n
        self.gfin = [0] * n  # decoder: the value of G at which it has generated its output
        self.isdec = [False] * n
        self.act: dict[int, None] = {}  # running requests in admission order (newest last)
        self.pref: dict[int, None] = {}  # running requests still in prefill, admission order
        self.due: dict[int, list[int]] = {}  # g -> decoders whose gfin was g (stale: skipped)
        self.dues: list[int] = []  # heap of the keys of `due`
        self.n_dec = 0  # decoders
        self.base_sum = 0  # Σ ctx offsets of the decoders
        self.G = 0
        self.waiting: deque[int] = deque()
        self.nxt = 0
        self.t = 0.0
        self.busy = 0.0
        self.kv_used = 0
        self.rejected = self.preemptions = self.iterations = 0
        self.q_every = max(1, n // max(queue_samples, 1))
        self.q_t: list[float] = []
        self.q_len: list[int] = []
        self.q_kv: list[int] = []
        self.sample_i = 0
        self.dt = 0.0  # the last iteration's time
        self.retry_at = 0  # a decode-only run is known to be impossible before this iteration

    def iterate_from(
        self, t: float, busy: float, dt: float, it: int, G: int, kv: int, nd: int, bs: int
    ) -> Counters:
        """One iteration in the general case (schedule, admit, step) from the loop's
        counters (time, busy time, last step, iterations, G, KV held, decoders, Σ base);
        returns them after it. The decoders that completed are left in the calendar for
        the loop."""
        self.t, self.busy, self.dt, self.iterations, self.G = t, busy, dt, it, G
        self.kv_used, self.n_dec, self.base_sum = kv, nd, bs
        nd, budget, d_ctx, chunks, sel = self.schedule()
        self.admit(budget, chunks)
        self.step(nd, d_ctx, chunks, sel)
        return (
            self.t, self.busy, self.dt, self.iterations, self.G, self.kv_used, self.n_dec,
            self.base_sum,
        )  # fmt: skip

    def due_at(self, k: int, g: int) -> None:
        """Decoder ``k`` completes when ``G`` reaches ``g`` (its ``gfin``): in the calendar."""
        self.gfin[k] = g
        b = self.due.get(g)
        if b is None:
            self.due[g] = [k]
            heapq.heappush(self.dues, g)
        else:
            b.append(k)

    def preempt_newest(self) -> tuple[int, bool, int]:
        """Free the most recently admitted running request (vLLM recompute preemption).

        Returns the request, whether it was decoding, and its context before this iteration.
        """
        k = r = next(reversed(self.act))
        dec = self.isdec[k]
        if dec:
            c, g = self.ctx[k] + self.G, self.gen[k] + self.G
            self.n_dec -= 1
            self.base_sum -= self.ctx[k]
        else:
            c, g = self.ctx[k], self.gen[k]
            del self.pref[k]
        self.kv_used -= c
        self.recomputed += c
        if self.pc is not None:
            self.pc.preempt(r, c, self.kv_used, self.M)
        self.gen_done[r] = g
        del self.act[k]
        self.preemptions += 1
        self.waiting.appendleft(r)
        return k, dec, c

    def schedule(self) -> tuple[int, int, int, list[tuple[int, int]], set[int] | None]:
        """The running requests' share of the next iteration: decodes (the oldest ``B`` if
        more), then ongoing prefills' chunks, preempting the newest when the KV is short.

        Returns the decodes, the budget left, their total context, the chunks
        ``(slot, tokens)`` and the decoders selected when capped (None: all of them).
        """
        nd, B, M = self.n_dec, self.B, self.M
        if nd <= B and not self.pref and self.kv_used + nd <= M:  # the common case
            self.kv_used += nd
            return nd, B - nd, self.base_sum + nd * self.G, [], None
        capped = nd > B
        sel: set[int] = set()
        if capped:
            isdec = self.isdec
            sel = set([k for k in self.act if isdec[k]][:B])
            nd = B
        while nd and self.kv_used + nd > M:
            v, was_dec, _ = self.preempt_newest()
            if was_dec and (not capped or v in sel):
                nd -= 1
                sel.discard(v)
        self.kv_used += nd
        budget = B - nd
        ctx = self.ctx
        d_ctx = sum(ctx[k] for k in sel) + nd * self.G if capped else self.base_sum + nd * self.G
        chunks: list[tuple[int, int]] = []
        pref, act, rem, C = self.pref, self.act, self.rem, self.C
        if budget > 0 and pref:
            for k in list(pref):
                if budget <= 0:
                    break
                if k not in act:
                    continue
                c = min(rem[k], C, budget)
                while self.kv_used + c > M and k in act:
                    v, was_dec, vctx = self.preempt_newest()
                    if was_dec and (not capped or v in sel):
                        sel.discard(v)
                        nd -= 1
                        self.kv_used -= 1
                        budget += 1
                        d_ctx -= vctx
                if k not in act:
                    continue
                c = min(rem[k], C, budget)
                chunks.append((k, c))
                self.kv_used += c
                budget -= c
        return nd, budget, d_ctx, chunks, sel if capped else None

    def admit(self, budget: int, chunks: list[tuple[int, int]]) -> int:
        """Admit waiting requests FIFO while the budget and the KV (less the watermark)
        allow; their first chunks join ``chunks``. Returns the budget left."""
        waiting = self.waiting
        if budget <= 0 or not waiting:
            return budget
        s_in, gen_done, C = self.s_in, self.gen_done, self.C
        ctx, rem, gen, isdec = self.ctx, self.rem, self.gen, self.isdec
        act, pref = self.act, self.pref
        room = self.M - self.reserve
        kv_used, pc = self.kv_used, self.pc
        while budget > 0 and waiting:
            r = waiting[0]
            rm = s_in[r] + gen_done[r]  # recompute prompt + generated after a preemption
            kept = pc.cached(r, kv_used, rm) if pc is not None else 0
            c = min(rm - kept, C, budget)
            if kv_used + kept + c > room:
                break
            waiting.popleft()
            if pc is not None:
                pc.take(r, kept)
                self.recomputed -= kept
                kv_used += kept
                rm -= kept
            ctx[r], rem[r], gen[r], isdec[r] = kept, rm, gen_done[r], False
            act[r] = None
            pref[r] = None
            chunks.append((r, c))
            kv_used += c
            budget -= c
        self.kv_used = kv_used
        return budget

    def step(
        self, nd: int, d_ctx: int, chunks: list[tuple[int, int]], sel: set[int] | None
    ) -> None:
        """Cost the iteration and apply it: decodes advance, chunks complete prefills (the
        first token), a request done at its first token frees its KV. (Decoders reaching
        their output length are completed by the loop, from the calendar.)"""
        ctx = self.ctx
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
            if not self.act and self.waiting:
                raise SpecError("a request cannot be admitted into an empty KV cache")
            return
        dt = self.tt(
            tokens, nd + pre_seqs, pairs, d_ctx + nd, d_ctx + kv_read, pre_tok, pre_seqs, nd
        )
        self.dt = dt
        self.t = self.t + dt
        self.busy += dt
        self.iterations += 1
        if sel is not None:  # decoders left out of the budget do not advance: shift offsets
            self._hold_unselected(sel)
        self.G += 1
        if chunks:
            self._advance_chunks(chunks)

    def _advance_chunks(self, chunks: list[tuple[int, int]]) -> None:
        """Chunks done: a prompt finished emits its first token, then decodes or finishes."""
        ctx, rem, gen, out, first, pref, act = (
            self.ctx, self.rem, self.gen, self.o_out, self.first, self.pref, self.act
        )  # fmt: skip
        t, G = self.t, self.G
        freed = new_dec = new_base = 0
        for k, c in chunks:
            ctx[k] += c
            rem[k] -= c
            if rem[k] == 0:
                gen[k] += 1
                if first[k] == math.inf:
                    first[k] = t
                del pref[k]
                if gen[k] >= out[k]:
                    self.finish[k] = t
                    freed += ctx[k]
                    del act[k]
                else:  # becomes a decoder: store offsets from G
                    ctx[k] -= G
                    gen[k] -= G
                    self.isdec[k] = True
                    new_dec += 1
                    new_base += ctx[k]
                    self.due_at(k, out[k] - gen[k])
        self.kv_used -= freed
        if self.pc is not None:
            self.pc.freed += freed
        self.n_dec += new_dec
        self.base_sum += new_base

    def _hold_unselected(self, sel: set[int]) -> None:
        """Decoders beyond the budget keep their context: one step back in offset terms."""
        ctx, gen, gfin, isdec = self.ctx, self.gen, self.gfin, self.isdec
        for k in self.act:
            if isdec[k] and k not in sel:
                ctx[k] -= 1
                gen[k] -= 1
                self.base_sum -= 1
                self.due_at(k, gfin[k] + 1)
