"""Latency of one serving instance under load: TTFT and TPOT means and percentiles.

Continuous batching with a token budget ``B`` per iteration and chunked prefill
(chunks of at most ``C``), FIFO admission, KV capacity ``M`` tokens. All step times come
from ``perfmodel.step.step_time``. The model, at arrival rate ``λ``:

* **Steady iteration (TPOT).** With ``b̄`` the mean iteration time, ``n_d = λ·b̄·E[o−1]``
  requests decode in each iteration (Little's law). A decode-only iteration takes
  ``t₀(n_d)``; a request's prompt adds ``Δ(s) = Σ_chunks [t(n_d + chunk) − t₀(n_d)]``
  (its chunks of ``min(C, B − n_d)`` tokens, each alone with the decodes). Time
  balance over a long interval gives the fixed point ``b̄ = t₀(n_d) / (1 − λ·E[Δ])``.
* **TPOT backlog.** A request's first decode steps share iterations with the prompts
  queued behind it: with probability ``ρ_D = λ·E[D]`` it leaves ``N ≥ 1`` prompts
  (mean ``L/ρ_D``, ``L = λ·(W + E[D])`` by Little's law) whose busy period of
  ``N·E[D]/(1 − ρ_D)`` seconds is made of prefill iterations of mean ``t_pre``; its
  length in iterations ``K`` is taken exponential, so a request with ``n`` decode steps
  has mean TPOT ``b̄ + ρ_D·(t_pre − b̄)·E[min(n, K)]/n``. The decode step a request
  sees is costed at ``n_d + 1`` sequences (itself plus the others).
* **TTFT** = wait + the request's own prefill ``D(s) = Σ_chunks t(n_d + chunk)``.
  - Gated batch service: iteration ``k+1`` carries the prompts that arrived during
    iteration ``k``, ``X' = t₀ + Σ_{N(X)} Δ`` with ``N ~ Poisson(λX)``, so
    ``E[X] = b̄`` and ``Var X = λ·b̄·E[Δ²]/(1 − ρ²)``, ``ρ = λ·E[Δ]``. An arrival waits
    the residual ``P(busy)·E[X²]/(2E[X])`` of the iteration in progress, and shares
    its own iteration with the ``ρ·E[X²]/E[X]`` of prompt time that arrived with it
    (scaled by ``(c_a² + 1)/2`` for renewal arrivals with inter-arrival CV ``c_a``).
  - KV memory: M/M/c (Erlang C) with ``c = M / m̄`` slots, ``m̄ = E[g]/E[iterations]``
    the mean KV a resident request holds, holding time ``b̄·E[iterations]``; its
    utilization is ``λ·b̄·E[g]/M`` (Nie–Si–Zhou's memory load).
  - Percentiles: the wait is 0 with probability ``(1 − P(busy))(1 − C_mem)`` and
    otherwise exponential with the matching mean, added to ``D(s)`` over the
    prompt-length distribution; TPOT's extra over ``t₀`` is Gamma with mean as above
    and variance ``λ·b̄·E[Δ²]/n``, mixed over the output lengths.

Approximations, stated once: iteration features are averaged; a prompt is costed as if
alone in its iterations; decode-batch fluctuations and preemptions are ignored.
The simulator (:mod:`perfmodel.simulate`) measures what this neglects.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray
from scipy import stats

from hardware.device import Device
from perfmodel.classic_queues import erlang_c
from perfmodel.model import ModelSpec
from perfmodel.parallel import ParallelPlan
from perfmodel.servemix import (
    PROMPT_BINS,
    LumpedIteration,
    RequestMoments,
    compress_atoms,
    decode_batch,
    decode_only,
    lumped_iteration,
)
from perfmodel.step import step_time
from perfmodel.workload import LengthDistribution

Arr = NDArray[np.float64]
PERCENTILES = (0.5, 0.9, 0.99)


@dataclass(frozen=True)
class LatencyEstimate:
    """Steady-state latency at one arrival rate (``inf`` when the queue is unbounded)."""

    rate_per_s: float
    stable: bool
    step_s: float  # mean iteration time b̄
    decode_batch: float  # mean decoding requests per iteration
    kv_load: float  # λ·b̄·E[g]/M: mean KV occupancy over capacity
    prefill_load: float  # ρ_p of the prefill FIFO
    prefill_wait_s: float
    memory_wait_s: float
    ttft_mean_s: float
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    tpot_mean_s: float
    tpot_p50_s: float
    tpot_p90_s: float
    tpot_p99_s: float
    e2e_mean_s: float
    _ttft: _Mixture
    _tpot: _Mixture

    def ttft_quantile_s(self, q: float) -> float:
        return self._ttft.quantile(q)

    def tpot_quantile_s(self, q: float) -> float:
        return self._tpot.quantile(q)

    def ttft_cdf(self, x_s: float) -> float:
        return self._ttft.cdf(x_s)

    def tpot_cdf(self, x_s: float) -> float:
        return self._tpot.cdf(x_s)


@dataclass(frozen=True)
class _Mixture:
    """``X = base_i + Y_i`` with probability ``w_i``.

    ``Y_i`` is 0 with probability ``1 − p_i``, otherwise Gamma(``shape_i``, ``scale_i``)
    (shape 1 is the exponential wait of the TTFT model).
    """

    weights: Arr
    base: Arr
    p: Arr
    shape: Arr
    scale: Arr
    unbounded: bool = False

    def cdf(self, x: float) -> float:
        if self.unbounded:
            return 0.0
        y = x - self.base
        inner = np.where(
            self.scale > 0,
            stats.gamma.cdf(np.maximum(y, 0.0), self.shape, scale=np.maximum(self.scale, 1e-300)),
            1.0,
        )
        f = np.where(y < 0, 0.0, (1 - self.p) + self.p * inner)
        return float(np.dot(self.weights, f))

    def quantile(self, q: float) -> float:
        if self.unbounded:
            return math.inf
        lo = float(self.base.min())
        hi = float(self.base.max() + 50 * max(float((self.shape * self.scale).max()), 1e-9))
        for _ in range(80):
            mid = 0.5 * (lo + hi)
            if self.cdf(mid) < q:
                lo = mid
            else:
                hi = mid
        return hi

    def mean(self) -> float:
        if self.unbounded:
            return math.inf
        return float(np.dot(self.weights, self.base + self.p * self.shape * self.scale))


def estimate_latency(
    model: ModelSpec,
    device: Device,
    plan: ParallelPlan,
    lengths: LengthDistribution,
    moments: RequestMoments,
    *,
    rate_per_s: float,
    kv_capacity_tokens: int,
    max_batched_tokens: int,
    arrival_cv: float = 1.0,
    full_step_s: float,
    stable: bool = True,
) -> LatencyEstimate:
    """TTFT/TPOT at ``rate_per_s`` (see the module docstring for the model).

    ``full_step_s`` is the iteration time at a full token budget (from
    ``queueing.service_rate``); ``stable=False`` (the rate is at or above the service
    rate) returns unbounded latencies without evaluating the model.
    """
    lam = rate_per_s
    B = max_batched_tokens
    M = kv_capacity_tokens
    m = moments
    if not stable:
        return _unbounded(lam)
    s_vals, s_w = compress_atoms(lengths.input_tokens, lengths.weights, PROMPT_BINS)
    ctx_per_seq = m.decode_context_tokens / max(m.decode_steps, 1e-12)

    def times(b_step: float) -> LumpedIteration:
        n_d = min(lam * b_step * m.decode_steps, B - 1.0)
        return lumped_iteration(
            model, device, plan, s_vals, m, decode_seqs=n_d, max_batched_tokens=B
        )

    b = float(step_time(model, device, decode_batch(0.0, m), plan=plan).total_s)
    b = max(b, 1e-9)
    for _ in range(200):
        it = times(b)
        n_d, t0, delta = it.decode_seqs, it.decode_step_s, it.prompt_extra_s
        load = lam * float(np.dot(s_w, delta))
        if load >= 1 or n_d >= B - 1:
            return _unbounded(lam)
        b_new = t0 / (1 - load)
        if abs(b_new - b) <= 1e-9 * b_new:
            b = b_new
            break
        b = b_new
    it = times(b)
    n_d, t0, d_s, delta, ch = (
        it.decode_seqs,
        it.decode_step_s,
        it.prompt_s,
        it.prompt_extra_s,
        it.chunks,
    )
    mean_delta = float(np.dot(s_w, delta))

    # Prefill: gated batch service. Iteration k+1 carries the prompts that arrived during
    # iteration k: X' = t0 + Σ_{N(X)} Δ, N ~ Poisson(λX) -> E[X] = b̄,
    # Var X = λ·b̄·E[Δ²]/(1 − ρ²) with ρ = λE[Δ] (law of total variance, stationary).
    # A prompt waits the residual E[X²]/(2E[X]) of the iteration it arrives in, then
    # shares its own iteration with the λ·X_biased·E[Δ] of the others that arrived.
    rho_p = lam * mean_delta
    ed2 = float(np.dot(s_w, delta**2))
    ex2 = b * b + lam * b * ed2 / max(1 - rho_p**2, 1e-12)
    biased_x = ex2 / b
    w_p = rho_p * biased_x
    # Bursty arrivals scale the batch of co-arrivals' variability (Allen–Cunneen factor).
    w_p *= (arrival_cv**2 + 1) / 2
    # KV memory (Erlang C over mean-footprint slots).
    hold_s = b * m.iterations
    slots = M * m.iterations / m.lifetime_kv_token_steps
    offered = lam * hold_s
    kv_load = offered / slots
    c_mem = erlang_c(slots, offered)
    w_m = c_mem * hold_s / (max(int(slots), 1) - offered) if offered < int(slots) else math.inf
    if not (math.isfinite(w_p) and math.isfinite(w_m)):
        return _unbounded(lam)
    chunk_iters = float(np.dot(s_w, np.bincount(ch.owner, minlength=s_vals.size)))
    t_pre = t0 + mean_delta / max(chunk_iters, 1e-12)
    p_busy = 1 - math.exp(-lam * b * m.iterations)
    residual = p_busy * biased_x / 2
    p_wait = 1 - (1 - p_busy) * (1 - c_mem)
    w_total = residual + w_p + w_m
    theta = w_total / p_wait if p_wait > 0 else 0.0
    ttft = _Mixture(
        weights=s_w,
        base=d_s,
        p=np.full(s_w.shape, p_wait if w_total > 0 else 0.0),
        shape=np.ones_like(s_w),
        scale=np.full(s_w.shape, theta),
    )
    # TPOT over n = o − 1 decode steps: the stationary b̄, plus the prefill busy period
    # the request leaves behind (its first decode steps share iterations with the prompts
    # queued behind it): with prob. ρ_D it leaves N ≥ 1 prompts (mean L/ρ_D, L = λ·(W + D̄),
    # Little), whose busy period of length N·D̄/(1 − ρ_D) consists of prefill iterations
    # of mean t_pre; its length in iterations K is taken exponential with that mean.
    mean_d = float(np.dot(s_w, d_s))
    rho_d = min(lam * mean_d, 0.999)
    n_left = lam * (w_total + mean_d) / max(rho_d, 1e-12)
    k_mean = n_left * mean_d / (1 - rho_d) / t_pre
    n_vals, n_w = compress_atoms(lengths.output_tokens - 1, lengths.weights, PROMPT_BINS * 2)
    keep = n_vals >= 1
    p_multi = float(n_w[keep].sum())  # P(o >= 2): requests that have a TPOT
    n_vals, n_w = n_vals[keep], n_w[keep] / p_multi
    busy_frac = k_mean * (1 - np.exp(-n_vals / max(k_mean, 1e-12))) / n_vals
    # A decoding request sees itself plus the others (Palm): its decode step is costed at
    # n_d + 1 sequences, which matters when n_d is small (MoE experts activated, tiles).
    seen = float(
        step_time(model, device, decode_only(n_d + 1, ctx_per_seq, 1), plan=plan).total_s[0]
    )
    t0_seen = max(seen, t0)
    tpot_n = b + (t0_seen - t0) + rho_d * max(t_pre - b, 0.0) * busy_frac
    ex_mean = tpot_n - t0_seen
    ex_var = lam * b * float(np.dot(s_w, delta**2)) / n_vals
    with np.errstate(divide="ignore", invalid="ignore"):
        shape = np.where(ex_var > 0, ex_mean**2 / ex_var, 1.0)
        scale = np.where(ex_mean > 0, ex_var / np.maximum(ex_mean, 1e-300), 0.0)
    tpot = _Mixture(
        weights=n_w,
        base=np.full(n_w.shape, t0_seen),
        p=np.where(ex_mean > 0, 1.0, 0.0),
        shape=shape,
        scale=scale,
    )
    ttft_mean = ttft.mean()
    return LatencyEstimate(
        rate_per_s=lam,
        stable=True,
        step_s=b,
        decode_batch=n_d,
        kv_load=kv_load,
        prefill_load=rho_p,
        prefill_wait_s=w_p,
        memory_wait_s=w_m,
        ttft_mean_s=ttft_mean,
        ttft_p50_s=ttft.quantile(0.5),
        ttft_p90_s=ttft.quantile(0.9),
        ttft_p99_s=ttft.quantile(0.99),
        tpot_mean_s=tpot.mean(),
        tpot_p50_s=tpot.quantile(0.5),
        tpot_p90_s=tpot.quantile(0.9),
        tpot_p99_s=tpot.quantile(0.99),
        e2e_mean_s=ttft_mean + p_multi * float(np.dot(n_w, n_vals * tpot_n)),
        _ttft=ttft,
        _tpot=tpot,
    )


def _unbounded(lam: float) -> LatencyEstimate:
    inf = math.inf
    z = np.zeros(1)
    mix = _Mixture(z + 1, z, z, z + 1, z, unbounded=True)
    return LatencyEstimate(
        lam,
        False,
        inf,
        inf,
        inf,
        inf,
        inf,
        inf,
        inf,
        inf,
        inf,
        inf,
        inf,
        inf,
        inf,
        inf,
        inf,
        mix,
        mix,
    )
