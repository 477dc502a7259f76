"""Discrete-event simulator of one serving instance: continuous batching, chunked prefill, KV.

The engine is modeled on vLLM's V1 scheduler, one iteration at a time:

1. Arrivals up to the iteration start join a FIFO waiting queue.
2. Running requests go first, in admission order: every decoding request gets one
   token of the budget ``B`` and one new KV slot; a request in the middle of its
   prefill gets its next chunk (``≤ C`` tokens, ``≤`` budget left). When the KV cache
   (``M`` tokens) cannot hold a running request's next tokens, the most recently
   admitted running request is preempted: its KV is freed and it returns to the head
   of the queue, to recompute its prompt and generated tokens later (vLLM's
   recompute preemption).
3. The remaining budget admits waiting requests in FIFO order while their first chunk
   fits in the free KV minus a watermark of 1 % of ``M`` (head-of-line blocking, no
   reordering). The watermark is vLLM V0's block-manager default (``watermark=0.01``);
   without it the engine admits into a full cache and loses 10 % or more of its
   memory-bound throughput to recompute preemptions.
4. The iteration lasts ``step_time`` of that exact batch (via the verified
   :class:`perfmodel.steptable.StepTable`); then decodes append a token, chunks
   advance, a finished prefill emits a token (the first one: TTFT), and requests
   that reached their output length free their KV.

A request whose ``s + o`` exceeds ``M`` could never finish; it is rejected on
arrival and counted. TPOT of a request is ``(finish − first token)/(o − 1)`` for
``o ≥ 2``. Time is continuous; randomness is only in the inputs (seeded).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike, NDArray

from hardware.device import Device
from perfmodel.errors import SpecError
from perfmodel.model import ModelSpec
from perfmodel.parallel import ParallelPlan
from perfmodel.steptable import StepTable, build_step_table
from perfmodel.workload import LengthDistribution, RenewalArrivals

Arr = NDArray[np.float64]
IntArr = NDArray[np.int64]
DEFAULT_WATERMARK = 0.01


@dataclass(frozen=True)
class Distribution:
    """Mean and percentiles of a sample (seconds); ``n`` values."""

    n: int
    mean_s: float
    p50_s: float
    p90_s: float
    p99_s: float

    @staticmethod
    def of(x: Arr) -> Distribution:
        if x.size == 0:
            return Distribution(0, math.inf, math.inf, math.inf, math.inf)
        p = np.quantile(x, [0.5, 0.9, 0.99])
        return Distribution(int(x.size), float(x.mean()), float(p[0]), float(p[1]), float(p[2]))


@dataclass(frozen=True)
class SimResult:
    """Per-request outcomes and engine counters of one simulation run."""

    arrival_s: Arr
    input_tokens: IntArr
    output_tokens: IntArr
    first_token_s: Arr  # inf if never (rejected / unfinished)
    finish_s: Arr  # inf if never
    rejected: int
    preemptions: int
    iterations: int
    busy_s: float
    end_s: float
    queue_t_s: Arr = field(repr=False)  # sampled times
    queue_len: IntArr = field(repr=False)  # waiting requests at those times
    kv_used_tokens: IntArr = field(repr=False)  # KV tokens held at those times

    @property
    def completed(self) -> NDArray[np.bool_]:
        return np.isfinite(self.finish_s)

    @property
    def ttft_s(self) -> Arr:
        ok = np.isfinite(self.first_token_s)
        return self.first_token_s[ok] - self.arrival_s[ok]

    @property
    def tpot_s(self) -> Arr:
        ok = self.completed & (self.output_tokens >= 2)
        return (self.finish_s[ok] - self.first_token_s[ok]) / (self.output_tokens[ok] - 1)

    @property
    def e2e_s(self) -> Arr:
        ok = self.completed
        return self.finish_s[ok] - self.arrival_s[ok]

    def ttft(self) -> Distribution:
        return Distribution.of(self.ttft_s)

    def tpot(self) -> Distribution:
        return Distribution.of(self.tpot_s)

    def e2e(self) -> Distribution:
        return Distribution.of(self.e2e_s)

    @property
    def throughput_per_s(self) -> float:
        """Completed requests per second of simulated time."""
        return float(self.completed.sum() / self.end_s) if self.end_s > 0 else 0.0

    def queue_growth_per_s(self) -> float:
        """Least-squares slope of the waiting-queue length over the arrival period."""
        last = float(self.arrival_s[-1]) if self.arrival_s.size else 0.0
        m = self.queue_t_s <= last
        if m.sum() < 3:
            return 0.0
        t, q = self.queue_t_s[m], self.queue_len[m].astype(float)
        return float(np.polyfit(t, q, 1)[0])

    def saturation_throughput_per_s(self, lo: float = 0.2, hi: float = 0.8) -> float:
        """Completion rate between the ``lo`` and ``hi`` quantiles of completions."""
        f = np.sort(self.finish_s[self.completed])
        if f.size < 10:
            return 0.0
        i, j = int(lo * (f.size - 1)), int(hi * (f.size - 1))
        return (j - i) / (f[j] - f[i]) if f[j] > f[i] else math.inf


def simulate(
    table: StepTable,
    *,
    arrival_s: ArrayLike,
    input_tokens: ArrayLike,
    output_tokens: ArrayLike,
    kv_capacity_tokens: int,
    max_batched_tokens: int,
    chunk_size: int | None = None,
    max_time_s: float = math.inf,
    queue_samples: int = 2000,
    admission_watermark: float = DEFAULT_WATERMARK,
) -> SimResult:
    """Run the engine on the given requests (arrival times non-decreasing)."""
    arr = np.asarray(arrival_s, dtype=np.float64)
    s_in = np.asarray(input_tokens, dtype=np.int64)
    o_out = np.asarray(output_tokens, dtype=np.int64)
    n = arr.size
    if s_in.shape != (n,) or o_out.shape != (n,):
        raise SpecError("arrival, input and output arrays must have the same length")
    if n and (np.any(np.diff(arr) < 0) or not np.all(np.isfinite(arr))):
        raise SpecError("arrival times must be finite and non-decreasing")
    if n and (s_in.min() < 1 or o_out.min() < 1):
        raise SpecError("input and output tokens must be >= 1")
    B = int(max_batched_tokens)
    if B < 1 or table.max_tokens < B:
        raise SpecError(f"max_batched_tokens must be in 1..{table.max_tokens} (the step table)")
    C = int(min(chunk_size or B, B))
    M = int(kv_capacity_tokens)
    if M < 1 or C < 1:
        raise SpecError("KV capacity and chunk size must be >= 1")
    if not 0 <= admission_watermark < 1:
        raise SpecError("admission watermark must be a fraction in [0, 1)")
    reserve = int(admission_watermark * M)

    first = np.full(n, math.inf)
    finish = np.full(n, math.inf)
    gen_done = np.zeros(n, dtype=np.int64)  # tokens generated (kept across preemption)

    cap = 256
    s_req = np.zeros(cap, np.int64)
    s_ctx = np.zeros(cap, np.int64)
    s_rem = np.zeros(cap, np.int64)
    s_gen = np.zeros(cap, np.int64)
    s_out = np.zeros(cap, np.int64)
    s_seq = np.zeros(cap, np.int64)
    s_act = np.zeros(cap, dtype=bool)
    free: list[int] = list(range(cap - 1, -1, -1))
    n_active = 0

    waiting: deque[int] = deque()
    nxt = 0  # next arrival index
    t = 0.0
    kv_used = 0
    seq = 0
    rejected = preemptions = iterations = 0
    busy = 0.0
    q_every = max(1, n // max(queue_samples, 1))
    q_t: list[float] = []
    q_len: list[int] = []
    q_kv: list[int] = []
    tt = table.time_s

    def grow() -> None:
        nonlocal cap, s_req, s_ctx, s_rem, s_gen, s_out, s_seq, s_act
        new = cap * 2
        s_req, s_ctx, s_rem, s_gen, s_out, s_seq = (
            np.concatenate([a, np.zeros(cap, np.int64)])
            for a in (s_req, s_ctx, s_rem, s_gen, s_out, s_seq)
        )
        s_act = np.concatenate([s_act, np.zeros(cap, dtype=bool)])
        free.extend(range(new - 1, cap - 1, -1))
        cap = new

    def preempt_newest() -> int:
        """Free the most recently admitted running request; return its slot."""
        nonlocal kv_used, n_active, preemptions
        k = int(np.argmax(np.where(s_act, s_seq, -1)))
        r = int(s_req[k])
        kv_used -= int(s_ctx[k])
        gen_done[r] = s_gen[k]
        s_act[k] = False
        free.append(k)
        n_active -= 1
        preemptions += 1
        waiting.appendleft(r)
        return k

    sample_i = 0
    while True:
        while nxt < n and arr[nxt] <= t:
            if s_in[nxt] + o_out[nxt] > M:
                rejected += 1
            else:
                waiting.append(nxt)
            nxt += 1
        if n_active == 0 and not waiting:
            if nxt >= n:
                break
            t = max(t, float(arr[nxt]))
            continue
        if t > max_time_s:
            break
        if iterations % q_every == 0 or sample_i < 64:
            sample_i += 1
            q_t.append(t)
            q_len.append(len(waiting))
            q_kv.append(kv_used)
        # ---- 2. running requests: decodes (vectorized), then ongoing prefills -------------
        dec = s_act & (s_rem == 0)
        n_dec = int(np.count_nonzero(dec))
        if n_dec > B:  # budget caps the decodes: the oldest B run
            idx = np.flatnonzero(dec)
            keep = idx[np.argsort(s_seq[idx], kind="stable")[:B]]
            dec = np.zeros(cap, dtype=bool)
            dec[keep] = True
            n_dec = B
        while n_dec and kv_used + n_dec > M:
            k = preempt_newest()
            if dec[k]:
                dec[k] = False
                n_dec -= 1
        kv_used += n_dec
        budget = B - n_dec
        d_ctx = int(np.dot(s_ctx, dec)) if n_dec else 0
        pre_tok = pre_seqs = 0
        pairs = 0.0
        kv_read = 0
        chunks: list[tuple[int, int]] = []
        if budget > 0:
            ongoing = np.flatnonzero(s_act & (s_rem > 0))
            if ongoing.size > 1:
                ongoing = ongoing[np.argsort(s_seq[ongoing], kind="stable")]
            for k in ongoing.tolist():
                if budget <= 0:
                    break
                if not s_act[k]:
                    continue
                c = min(int(s_rem[k]), C, budget)
                while kv_used + c > M and s_act[k]:
                    v = preempt_newest()
                    if dec[v]:
                        dec[v] = False
                        n_dec -= 1
                        kv_used -= 1
                        budget += 1
                        d_ctx -= int(s_ctx[v])
                if not s_act[k]:
                    continue
                c = min(int(s_rem[k]), C, budget)
                chunks.append((k, c))
                kv_used += c
                budget -= c
        # ---- 3. admit waiting requests FIFO while the budget and the KV allow ------------
        while budget > 0 and waiting:
            r = waiting[0]
            rem = int(s_in[r] + gen_done[r])  # recompute prompt + generated after preemption
            c = min(rem, C, budget)
            if kv_used + c > M - reserve:
                break
            waiting.popleft()
            if not free:
                grow()
            k = free.pop()
            s_req[k], s_ctx[k], s_rem[k] = r, 0, rem
            s_gen[k], s_out[k], s_seq[k] = gen_done[r], o_out[r], seq
            s_act[k] = True
            seq += 1
            n_active += 1
            chunks.append((k, c))
            kv_used += c
            budget -= c
        if dec.size < cap:  # the slot arrays grew during admission
            dec = np.concatenate([dec, np.zeros(cap - dec.size, dtype=bool)])
        for k, c in chunks:
            ctx = int(s_ctx[k])
            pre_tok += c
            pairs += c * ctx + c * (c + 1) / 2
            kv_read += ctx + c
        pre_seqs = len(chunks)
        tokens = n_dec + pre_tok
        if tokens == 0:  # nothing fits: the head request waits for memory that never frees
            if n_active == 0 and waiting:
                raise SpecError("a request cannot be admitted into an empty KV cache")
            continue
        dt = tt(
            tokens,
            n_dec + pre_seqs,
            pairs,
            d_ctx + n_dec,
            d_ctx + kv_read,
            prefill_tokens=pre_tok,
            prefill_seqs=pre_seqs,
            decode_seqs=n_dec,
        )
        t += dt
        busy += dt
        iterations += 1
        # ---- 4. apply the iteration ---------------------------------------------------------
        if n_dec:
            s_ctx += dec
            s_gen += dec
        done_pref: list[int] = []
        for k, c in chunks:
            s_ctx[k] += c
            s_rem[k] -= c
            if s_rem[k] == 0:
                s_gen[k] += 1
                r = int(s_req[k])
                if first[r] == math.inf:
                    first[r] = t
                done_pref.append(k)
        fin = np.flatnonzero(dec & (s_gen >= s_out)) if n_dec else np.zeros(0, dtype=np.int64)
        extra = [k for k in done_pref if s_gen[k] >= s_out[k]]
        if fin.size or extra:
            ks = np.concatenate([fin, np.asarray(extra, dtype=np.int64)])
            finish[s_req[ks]] = t
            kv_used -= int(s_ctx[ks].sum())
            s_act[ks] = False
            free.extend(ks.tolist())
            n_active -= ks.size
    return SimResult(
        arrival_s=arr,
        input_tokens=s_in,
        output_tokens=o_out,
        first_token_s=first,
        finish_s=finish,
        rejected=rejected,
        preemptions=preemptions,
        iterations=iterations,
        busy_s=busy,
        end_s=t,
        queue_t_s=np.asarray(q_t),
        queue_len=np.asarray(q_len, dtype=np.int64),
        kv_used_tokens=np.asarray(q_kv, dtype=np.int64),
    )


@dataclass(frozen=True)
class SimSetup:
    """An instance to simulate: model, device, plan and engine settings, with its table."""

    table: StepTable
    kv_capacity_tokens: int
    max_batched_tokens: int
    chunk_size: int


def make_setup(
    model: ModelSpec,
    device: Device,
    plan: ParallelPlan,
    *,
    kv_capacity_tokens: int,
    max_batched_tokens: int,
    chunk_size: int | None = None,
) -> SimSetup:
    table = build_step_table(model, device, plan, max_batched_tokens)
    return SimSetup(
        table, kv_capacity_tokens, max_batched_tokens, int(chunk_size or max_batched_tokens)
    )


def simulate_workload(
    setup: SimSetup,
    lengths: LengthDistribution,
    arrivals: RenewalArrivals | None,
    *,
    n_requests: int,
    seed: int,
    max_time_s: float = math.inf,
) -> SimResult:
    """Sample ``n_requests`` from ``lengths`` with ``arrivals`` (None: all at t = 0)."""
    rng = np.random.default_rng(seed)
    s, o = lengths.sample(n_requests, rng)
    times = arrivals.times_s(n_requests, rng) if arrivals else np.zeros(n_requests)
    return simulate(
        setup.table,
        arrival_s=times,
        input_tokens=s,
        output_tokens=o,
        kv_capacity_tokens=setup.kv_capacity_tokens,
        max_batched_tokens=setup.max_batched_tokens,
        chunk_size=setup.chunk_size,
        max_time_s=max_time_s,
    )


def saturation_rate_per_s(
    setup: SimSetup, lengths: LengthDistribution, *, n_requests: int = 4000, seed: int = 0
) -> float:
    """Simulated service rate: completion rate with an infinite backlog (all at t = 0).

    A work-conserving engine with a permanent queue completes requests at the largest
    rate it can sustain; arrivals faster than this make the queue grow without bound.
    """
    res = simulate_workload(setup, lengths, None, n_requests=n_requests, seed=seed)
    return res.saturation_throughput_per_s()
