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
``o ≥ 2``. Time is continuous; randomness is only in the inputs (seeded). The loop itself
(scalar per-request state, exact decode-only skip-ahead) is :mod:`perfmodel.sim.engine`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from perfmodel.errors import SpecError
from perfmodel.serving.servemix import DEFAULT_WATERMARK
from perfmodel.sim.engine import run_engine
from perfmodel.sim.engine_state import EngineState
from perfmodel.step.instance import Instance
from perfmodel.step.table import StepTable, build_step_table
from perfmodel.workload.arrivals import RenewalArrivals
from perfmodel.workload.lengths import LengthDistribution

Arr = NDArray[np.float64]
IntArr = NDArray[np.int64]


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
    recompute_tokens: int = 0  # prompt and generated tokens computed again after preemptions

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

    def window_throughput_per_s(self, *, start_fraction: float = 0.5) -> float:
        """Completions per second over ``[start_fraction·T, T]``, ``T`` the last arrival.

        The window skips the warm-up from an empty system. A stable engine serves the
        offered rate there; an overloaded one is backlogged and serves its saturation
        rate, whatever the noise of the arrivals, so ``λ −`` this is the growth rate of
        the requests in the system (waiting or running).
        """
        if self.arrival_s.size < 2 or not 0 <= start_fraction < 1:
            return 0.0
        last = float(self.arrival_s[-1])
        lo = start_fraction * last
        f = self.finish_s
        n = int(np.count_nonzero((f > lo) & (f <= last)))
        return n / (last - lo) if last > lo else 0.0

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
    skip_ahead: bool = True,
    prefix_cache_block_tokens: int = 0,
) -> SimResult:
    """Run the engine on the given requests (arrival times non-decreasing).

    ``skip_ahead`` advances runs of identical decode-only iterations in one vectorized
    step (exact; see :mod:`perfmodel.sim.engine`); ``False`` steps every iteration.
    ``prefix_cache_block_tokens`` > 0: a prefix cache with blocks of that size keeps a
    preempted request's KV until the free queue reaches it (:mod:`perfmodel.sim.prefix_cache`).
    """
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
    state = EngineState(
        table,
        arr,
        s_in,
        o_out,
        kv_capacity_tokens=M,
        max_batched_tokens=B,
        chunk_size=C,
        reserve_tokens=int(admission_watermark * M),
        max_time_s=max_time_s,
        queue_samples=queue_samples,
        prefix_cache_block_tokens=prefix_cache_block_tokens,
    )
    run = run_engine(state, skip_ahead=skip_ahead)
    return SimResult(
        arrival_s=arr,
        input_tokens=s_in,
        output_tokens=o_out,
        first_token_s=run.first_token_s,
        finish_s=run.finish_s,
        rejected=run.rejected,
        preemptions=run.preemptions,
        iterations=run.iterations,
        busy_s=run.busy_s,
        end_s=run.end_s,
        queue_t_s=run.queue_t_s,
        queue_len=run.queue_len,
        kv_used_tokens=run.kv_used_tokens,
        recompute_tokens=run.recompute_tokens,
    )


@dataclass(frozen=True)
class SimSetup:
    """An instance to simulate: model, device, plan and engine settings, with its table."""

    table: StepTable
    kv_capacity_tokens: int
    max_batched_tokens: int
    chunk_size: int
    prefix_cache_block_tokens: int = 0  # > 0: the engine's prefix cache block (0: none)


def make_setup(
    inst: Instance,
    *,
    kv_capacity_tokens: int,
    max_batched_tokens: int,
    chunk_size: int | None = None,
) -> SimSetup:
    table = build_step_table(inst, max_batched_tokens)
    eng = inst.engine
    block = eng.kv_block_tokens if eng is not None and eng.prefix_caching else 0
    return SimSetup(
        table, kv_capacity_tokens, max_batched_tokens, int(chunk_size or max_batched_tokens),
        block,
    )  # fmt: skip


def simulate_workload(
    setup: SimSetup,
    lengths: LengthDistribution,
    arrivals: RenewalArrivals | None,
    *,
    n_requests: int,
    seed: int,
    max_time_s: float = math.inf,
    skip_ahead: bool = True,
    engines: int = 1,
) -> SimResult:
    """Sample ``n_requests`` from ``lengths`` with ``arrivals`` (None: all at t = 0).

    ``engines > 1``: the requests are spread over that many virtual engines
    (:func:`simulate_engines`)."""
    rng = np.random.default_rng(seed)
    s, o = lengths.sample(n_requests, rng)
    times = arrivals.times_s(n_requests, rng) if arrivals else np.zeros(n_requests)
    return simulate_engines(
        setup, arrival_s=times, input_tokens=s, output_tokens=o, engines=engines,
        seed=seed + 1, max_time_s=max_time_s, skip_ahead=skip_ahead,
    )  # fmt: skip


def simulate_engines(
    setup: SimSetup,
    *,
    arrival_s: ArrayLike,
    input_tokens: ArrayLike,
    output_tokens: ArrayLike,
    engines: int,
    seed: int = 0,
    max_time_s: float = math.inf,
    skip_ahead: bool = True,
) -> SimResult:
    """Independent virtual engines sharing the arrivals (pipeline parallelism).

    With ``pp`` stages an instance runs ``pp`` virtual engines (``perfmodel.step``):
    ``setup`` is one of them (its table gives the virtual engine's iteration time, its KV
    capacity is the engine's share). Each request goes to a uniformly random engine, so
    a Poisson stream splits into independent Poisson streams of ``λ/pp`` — what
    ``perfmodel.queueing`` assumes; vLLM adds a request to the least-loaded engine,
    which can only do better. Each engine is simulated on its requests; the merged result
    lists every request in arrival order, sums the counters, and sums the engines'
    waiting queues and KV use at the union of their sample times.
    """
    if not (isinstance(engines, int) and engines >= 1):
        raise SpecError(f"engines must be a positive integer, got {engines!r}")
    t = np.asarray(arrival_s, dtype=np.float64)
    s = np.asarray(input_tokens, dtype=np.int64)
    o = np.asarray(output_tokens, dtype=np.int64)
    kw: dict[str, Any] = {
        "kv_capacity_tokens": setup.kv_capacity_tokens,
        "max_batched_tokens": setup.max_batched_tokens,
        "chunk_size": setup.chunk_size,
        "max_time_s": max_time_s,
        "skip_ahead": skip_ahead,
        "prefix_cache_block_tokens": setup.prefix_cache_block_tokens,
    }
    if engines == 1:
        return simulate(setup.table, arrival_s=t, input_tokens=s, output_tokens=o, **kw)
    which = np.random.default_rng(seed).integers(0, engines, size=t.size)
    parts = []
    for e in range(engines):
        sel = which == e
        if sel.any():
            parts.append(
                simulate(
                    setup.table, arrival_s=t[sel], input_tokens=s[sel], output_tokens=o[sel],
                    **kw,
                )
            )  # fmt: skip
    return merge_results(parts)


def _step_sum(times: list[Arr], values: list[IntArr]) -> tuple[Arr, IntArr]:
    """Sum of right-continuous step functions (0 before their first sample)."""
    grid = np.unique(np.concatenate(times)) if times else np.zeros(0)
    total = np.zeros(grid.size, dtype=np.int64)
    for t, v in zip(times, values, strict=True):
        i = np.searchsorted(t, grid, side="right") - 1
        total += np.where(i >= 0, v[np.maximum(i, 0)], 0) if v.size else 0
    return grid, total


def merge_results(parts: list[SimResult]) -> SimResult:
    """One result from engines that ran side by side (see :func:`simulate_engines`)."""
    if not parts:
        raise SpecError("no simulation results to merge")
    if len(parts) == 1:
        return parts[0]
    arr = np.concatenate([p.arrival_s for p in parts])
    order = np.argsort(arr, kind="stable")

    def cat(name: str) -> Any:
        return np.concatenate([getattr(p, name) for p in parts])[order]

    q_t, q_len = _step_sum([p.queue_t_s for p in parts], [p.queue_len for p in parts])
    _, kv = _step_sum([p.queue_t_s for p in parts], [p.kv_used_tokens for p in parts])
    return SimResult(
        arrival_s=arr[order],
        input_tokens=cat("input_tokens"),
        output_tokens=cat("output_tokens"),
        first_token_s=cat("first_token_s"),
        finish_s=cat("finish_s"),
        rejected=sum(p.rejected for p in parts),
        preemptions=sum(p.preemptions for p in parts),
        iterations=sum(p.iterations for p in parts),
        busy_s=sum(p.busy_s for p in parts),
        end_s=max(p.end_s for p in parts),
        queue_t_s=q_t,
        queue_len=q_len,
        kv_used_tokens=kv,
        recompute_tokens=sum(p.recompute_tokens for p in parts),
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
