"""Discrete-event simulator of disaggregated serving: prefill pool → KV transfer → decode pool.

The system ``perfmodel.pd_models`` describes analytically, request by request:

1. Each arrival is routed at random to a prefill instance with probability proportional
   to the instance's weight (its planned goodput), and to a decode instance likewise.
2. Prefill instance: FCFS, one prompt at a time, for ``D(s)`` (the iteration time of
   the configuration's instance, ``config.instance(model).iteration_s``, of the prompt
   on its TP group: the roofline, or the configuration's calibrated profile);
   prompts shorter than ``L_m`` (``prefill_batch_tokens``) waiting right behind a short
   head prompt join its iteration until it reaches ``L_m`` tokens. Its KV then goes over the
   instance's link, FCFS, for ``X(s)`` (``kv_transfer_time_s``), overlapped with the
   next prompt's prefill.
3. The first token counts when the KV lands (TTFT = landing − arrival). The request
   joins its decode instance's FIFO.
4. Decode instance: iterations of continuous batching (vLLM-style); at each iteration
   start it admits waiting requests FIFO while the batch cap and the KV capacity
   (reserving ``s + o`` tokens) allow; every resident then decodes one token, the
   iteration lasting the tabulated ``step_time`` of that exact batch
   (``perfmodel.steptable``), or the calibrated profile's time of it. A request leaves
   after ``o − 1`` steps; TPOT = (finish − first token)/(o − 1). Requests with
   ``s + o`` over the KV capacity are rejected (TPOT = ∞).

Requests arriving in the first ``warmup`` and last ``cooldown`` fractions of the
arrival window are simulated but not measured. Randomness is only in the inputs and
the routing draws (seeded; common random numbers across rates).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from perfmodel.errors import SpecError
from perfmodel.model import ModelSpec
from perfmodel.pd.config import PhaseConfig, kv_link, kv_transfer_time_s
from perfmodel.pd.decode import decode_kv_capacity
from perfmodel.pd.deployment import Deployment, Pool
from perfmodel.pd.prefill import prefill_batch_tokens
from perfmodel.serving.search import max_rate
from perfmodel.sim.simulate import Distribution
from perfmodel.step.batch import Batch
from perfmodel.step.instance import Instance
from perfmodel.step.table import build_step_table
from perfmodel.workload.lengths import LengthDistribution
from perfmodel.workload.slo import SLO

Arr = NDArray[np.float64]
IntArr = NDArray[np.int64]


@dataclass(frozen=True)
class PDSimResult:
    """Per-request outcomes of one run (all requests) and the measured window."""

    arrival_s: Arr
    input_tokens: IntArr
    output_tokens: IntArr
    first_token_s: Arr
    finish_s: Arr  # inf for rejected requests
    measured: NDArray[np.bool_] = field(repr=False)
    rejected: int = 0

    @property
    def ttft_s(self) -> Arr:
        m = self.measured
        return self.first_token_s[m] - self.arrival_s[m]

    @property
    def tpot_s(self) -> Arr:
        m = self.measured & (self.output_tokens >= 2)
        return (self.finish_s[m] - self.first_token_s[m]) / (self.output_tokens[m] - 1)

    def ttft(self) -> Distribution:
        return Distribution.of(self.ttft_s)

    def tpot(self) -> Distribution:
        t = self.tpot_s
        return Distribution.of(np.where(np.isfinite(t), t, 1e30))

    def quantiles_s(self, q: float) -> tuple[float, float]:
        """(TTFT, TPOT) at quantile ``q`` over the measured requests."""
        tp = self.tpot_s
        tq = float(np.quantile(tp, q)) if tp.size else 0.0
        return float(np.quantile(self.ttft_s, q)), tq

    def attainment(self, slo: SLO) -> float:
        """Fraction of measured requests meeting both targets."""
        m = self.measured
        ttft = self.first_token_s[m] - self.arrival_s[m]
        o = self.output_tokens[m]
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(
                o >= 2, (self.finish_s[m] - self.first_token_s[m]) / np.maximum(o - 1, 1), 0.0
            )
        return float(np.mean((ttft <= slo.ttft_s) & (tpot <= slo.tpot_s)))

    def meets(self, slo: SLO) -> bool:
        """DistServe's criterion: both ``slo.percentile`` quantiles within their targets."""
        t, p = self.quantiles_s(slo.percentile)
        return t <= slo.ttft_s and p <= slo.tpot_s


@dataclass(frozen=True)
class _DecodeSetup:
    step_s: Callable[[int, int], float]  # (decoding requests, Σ cached tokens) -> seconds
    kv_capacity_tokens: int
    cap: int


def _decode_setup(model: ModelSpec, cfg: PhaseConfig, lengths: LengthDistribution) -> _DecodeSetup:
    M = decode_kv_capacity(model, cfg, lengths)
    smallest = int((lengths.input_tokens + lengths.output_tokens).min())
    cap = M // max(smallest, 1)
    if cfg.batch_cap is not None:
        cap = min(cap, cfg.batch_cap)
    cap = max(1, min(cap, 16384))
    inst = cfg.instance(model)
    if cfg.profile is not None:
        z = np.zeros(())

        def step(n: int, k: int) -> float:
            b = Batch(z, z, z, z, np.asarray(float(n)), np.asarray(float(k)))
            return float(inst.iteration_s(b))

        return _DecodeSetup(step, M, cap)
    table = build_step_table(inst, cap)

    def tabulated(n: int, k: int) -> float:
        return table.time_s(n, n, 0.0, k + n, k, decode_seqs=n)

    return _DecodeSetup(tabulated, M, cap)


def _decode_instance(setup: _DecodeSetup, arrive: Arr, s: IntArr, o: IntArr) -> tuple[Arr, int]:
    """Finish times of the requests routed to one decode instance (``arrive`` sorted)."""
    n = arrive.size
    finish = np.full(n, math.inf)
    tt = setup.step_s
    M, cap = setup.kv_capacity_tokens, setup.cap
    waiting: deque[int] = deque()
    heap: list[tuple[int, int]] = []
    t = 0.0
    it = 0
    N = 0
    K = 0  # Σ cached tokens of the residents
    reserved = 0
    nxt = 0
    rejected = 0
    while nxt < n or waiting or N:
        while nxt < n and arrive[nxt] <= t:
            if o[nxt] < 2:
                finish[nxt] = arrive[nxt]
            elif s[nxt] + o[nxt] > M:
                rejected += 1
            else:
                waiting.append(nxt)
            nxt += 1
        while waiting and cap > N and reserved + s[waiting[0]] + o[waiting[0]] <= M:
            r = waiting.popleft()
            N += 1
            K += int(s[r])
            reserved += int(s[r] + o[r])
            heapq.heappush(heap, (it + int(o[r]) - 1, r))
        if N == 0:
            if nxt < n:
                t = max(t, float(arrive[nxt]))
            continue
        t += tt(N, K)
        it += 1
        K += N
        while heap and heap[0][0] == it:
            _, r = heapq.heappop(heap)
            finish[r] = t
            N -= 1
            K -= int(s[r] + o[r] - 1)
            reserved -= int(s[r] + o[r])
    return finish, rejected


def _fcfs(arrive: Arr, service: Arr) -> Arr:
    """Departure times of a FCFS single server (``arrive`` sorted)."""
    out = np.empty_like(arrive)
    free = 0.0
    for i in range(arrive.size):
        free = max(free, float(arrive[i])) + float(service[i])
        out[i] = free
    return out


def _prefill_instance(
    arrive: Arr, s: IntArr, alone_s: Arr, batch_tokens: int, time_s: Callable[[Batch], float]
) -> Arr:
    """Prefill end times on one instance (``arrive`` sorted): FCFS; when the server frees
    and the head prompt is shorter than ``batch_tokens``, the short prompts waiting right
    behind it join its iteration until the batch reaches ``batch_tokens`` tokens."""
    n = arrive.size
    done = np.empty(n)
    cache: dict[tuple[int, ...], float] = {}
    free = 0.0
    i = 0
    while i < n:
        start = max(free, float(arrive[i]))
        j = i + 1
        if s[i] < batch_tokens:
            total = int(s[i])
            while j < n and total < batch_tokens and arrive[j] <= start and s[j] < batch_tokens:
                total += int(s[j])
                j += 1
        if j == i + 1:
            dur = float(alone_s[i])
        else:
            key = tuple(sorted(int(v) for v in s[i:j]))
            if key not in cache:
                ls = np.asarray(key, dtype=np.float64)
                z = np.zeros(())
                cache[key] = time_s(
                    Batch(
                        np.asarray(ls.sum()),
                        np.asarray(float(ls.size)),
                        np.asarray(float((ls * (ls + 1) / 2).sum())),
                        np.asarray(ls.sum()),
                        z,
                        z,
                    )
                )
            dur = cache[key]
        free = start + dur
        done[i:j] = free
        i = j
    return done


def _route(u: Arr, pools: tuple[Pool, ...]) -> tuple[IntArr, IntArr]:
    """Pool index and instance index per request from uniforms ``u`` (weight-proportional)."""
    w = np.concatenate([np.full(p.instances, p.weight) for p in pools])
    pool_of = np.concatenate([np.full(p.instances, i) for i, p in enumerate(pools)])
    cdf = np.cumsum(w) / w.sum()
    inst = np.minimum(np.searchsorted(cdf, u, side="right"), w.size - 1)
    return pool_of[inst], inst


def simulate_pd(
    dep: Deployment,
    lengths: LengthDistribution,
    *,
    arrival_s: Arr,
    input_tokens: IntArr,
    output_tokens: IntArr,
    route_u: Arr,
    warmup: float = 0.1,
    cooldown: float = 0.1,
) -> PDSimResult:
    """Run the deployment on the given requests (``route_u``: two uniforms per request)."""
    arr = np.asarray(arrival_s, dtype=np.float64)
    s = np.asarray(input_tokens, dtype=np.int64)
    o = np.asarray(output_tokens, dtype=np.int64)
    n = arr.size
    if n == 0 or s.shape != (n,) or o.shape != (n,) or route_u.shape != (n, 2):
        raise SpecError("need non-empty equal-length arrivals, lengths and (n, 2) routing draws")
    if np.any(np.diff(arr) < 0):
        raise SpecError("arrival times must be non-decreasing")
    model = dep.model
    p_pool, p_inst = _route(route_u[:, 0], dep.prefill)
    d_pool, d_inst = _route(route_u[:, 1], dep.decode)
    uniq, inv = np.unique(s, return_inverse=True)
    d_s = np.empty(n)
    x_s = np.empty(n)
    for i, pp in enumerate(dep.prefill):
        sel = p_pool == i
        if not sel.any():
            continue
        d_u = pp.config.instance(model).iteration_s(Batch.prefill(1, uniq))
        d_s[sel] = d_u[inv[sel]]
        for j, dp in enumerate(dep.decode):
            both = sel & (d_pool == j)
            if both.any():
                link = kv_link(pp.config, dp.config, dep.placement)
                x_u = kv_transfer_time_s(
                    model, uniq, prefill=pp.config, decode=dp.config, link=link
                )
                x_s[both] = x_u[inv[both]]
    first = np.empty(n)
    batch_tokens = [prefill_batch_tokens(model, pp.config) for pp in dep.prefill]
    for k in np.unique(p_inst):
        idx = np.flatnonzero(p_inst == k)
        cfg = dep.prefill[int(p_pool[idx[0]])].config

        def batch_time_s(b: Batch, inst: Instance = cfg.instance(model)) -> float:
            return float(inst.iteration_s(b))

        done = _prefill_instance(  # prefill end (arrivals sorted)
            arr[idx], s[idx], d_s[idx], batch_tokens[int(p_pool[idx[0]])], batch_time_s
        )
        order = np.argsort(done, kind="stable")
        land = _fcfs(done[order], x_s[idx][order])
        first[idx[order]] = land
    finish = np.full(n, math.inf)
    rejected = 0
    for j, dp in enumerate(dep.decode):
        setup = _decode_setup(model, dp.config, lengths)
        for k in np.unique(d_inst[d_pool == j]):
            idx = np.flatnonzero(d_inst == k)
            order = idx[np.argsort(first[idx], kind="stable")]
            f, rej = _decode_instance(setup, first[order], s[order], o[order])
            finish[order] = f
            rejected += rej
    t_end = float(arr[-1])
    measured = (arr >= warmup * t_end) & (arr <= (1 - cooldown) * t_end)
    return PDSimResult(arr, s, o, first, finish, measured, rejected)


@dataclass(frozen=True)
class SampledRequests:
    """Requests at unit rate (scale arrivals by 1/λ): common random numbers across rates."""

    unit_arrival_s: Arr
    input_tokens: IntArr
    output_tokens: IntArr
    route_u: Arr


def sample_requests(lengths: LengthDistribution, n: int, *, seed: int) -> SampledRequests:
    """``n`` Poisson(1) arrivals with lengths and routing draws from one seeded generator."""
    if n < 10:
        raise SpecError("simulate at least 10 requests")
    rng = np.random.default_rng(seed)
    s, o = lengths.sample(n, rng)
    t = np.cumsum(rng.exponential(1.0, n))
    return SampledRequests(t, s, o, rng.random((n, 2)))


def run_at_rate(
    dep: Deployment, lengths: LengthDistribution, req: SampledRequests, rate_per_s: float
) -> PDSimResult:
    if not rate_per_s > 0:
        raise SpecError(f"rate must be > 0, got {rate_per_s}")
    return simulate_pd(
        dep,
        lengths,
        arrival_s=req.unit_arrival_s / rate_per_s,
        input_tokens=req.input_tokens,
        output_tokens=req.output_tokens,
        route_u=req.route_u,
    )


def simulated_goodput(
    dep: Deployment,
    lengths: LengthDistribution,
    slo: SLO,
    *,
    hi_rate_per_s: float,
    n_requests: int = 4000,
    seed: int = 0,
    rel_tol: float = 0.02,
) -> float:
    """Largest rate at which the simulated deployment meets ``slo`` (bisection, CRN)."""
    req = sample_requests(lengths, n_requests, seed=seed)
    lo, hi = 0.0, hi_rate_per_s
    while run_at_rate(dep, lengths, req, hi).meets(slo):
        lo, hi = hi, hi * 1.5
    return max_rate(lambda r: run_at_rate(dep, lengths, req, r).meets(slo), hi, lo=lo,
                    rel_tol=rel_tol)  # fmt: skip
