"""An engine slowed by expert fetches, served through the queueing layer's own formulas.

With routed experts offloaded (:class:`perfmodel.paging.OffloadedExperts`), an iteration
of ``T`` tokens that would take ``t`` with every expert resident takes ``t + p(T, t)``:
the fetches of its missed experts. :mod:`perfmodel.queueing` has no hook for extra time
per iteration (``service_rate`` and ``latency`` take no cost profile), so this module
maps the slowed engine onto the unslowed one instead of re-deriving the service rate or
the latency:

**Iteration units.** Measured in iterations, both engines are the same system if every
iteration carries the same work: the same decodes, the same prompt chunks, the same KV.
The slowed engine at rate ``λ`` with mean iteration ``b' = b + p̄`` admits ``λ·b'``
prompts per iteration; the unslowed engine does the same at the *equivalent rate*
``f·λ`` with ``f = b'/b``, where ``b = b(f·λ)`` is its own mean iteration there
(:func:`perfmodel.queueing.latency`). So ``f`` is the fixed point
``f = 1 + p̄(f)/b(f·λ)``, solved by Brent's method in a bracket found around a cheap
guess (:func:`_guess`).

* **Service rate.** Li–Dai–Peng's ``μ_c = B/(t_full·E[tokens])`` and Nie–Si–Zhou's
  ``μ_m = M_eff/(b̄·E[g])`` are inversely proportional to the iteration time at their
  operating point with everything else fixed, so the slowed bounds are the queueing
  layer's own bounds times ``t/(t + p)``: ``t_full`` with ``p`` of a full budget of
  ``B`` tokens, and the memory-bound iteration ``b̄`` (Poisson chunk arrivals) with
  ``p̄`` at its operating point ``r = M_eff/E[g]`` prompts per iteration. ``M_eff``,
  ``b̄`` and ``t_full`` are the queueing layer's (:class:`perfmodel.queueing.ServiceRate`).
* **Fetch time of an iteration.** ``p̄ = E_K[p(n_d + K·c̄)]`` with ``n_d`` decodes,
  ``K ~ Poisson(r·E[chunks])`` prompt chunks of mean size ``c̄`` (capped at the budget
  ``B``); the misses are concave in ``T``, so the fetch time of the mean batch would be
  too high (Jensen). A request's own prefill iteration carries its chunk as well:
  ``p_pre = E_K[p(n_d + (K + 1)·c̄)]``.
* **TPOT** = the queueing layer's TPOT at ``f·λ`` plus ``p̄`` (every iteration a request
  decodes in pays the fetches).
* **TTFT** = the queueing layer's TTFT at ``f·λ``, plus the request's own ``k(s)``
  prefill iterations' fetches ``k(s)·p_pre`` (``k = ⌈s/min(C, B − n_d)⌉`` over the
  prompt lengths), plus the longer residual of the iteration in progress: ``U(0, p̄)``
  when the engine is busy, which it is with probability ``1 − exp(−λ·b'·E[iterations])``
  (Poisson arrivals: the number of resident requests of an M/G/∞ system is Poisson).

Approximations: one slow-down factor for the waits in the KV-memory queue (they are in
unslowed seconds, short by ``f`` when the memory queue is long); the fetches of a
prefill iteration are not correlated with the prompt's length beyond its chunk count.
The discrete-event check uses :func:`penalized_table` (the exact per-iteration
``t + p(T, t)``) in :func:`perfmodel.simulate.simulate`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace

import numpy as np
from numpy.typing import NDArray

from perfmodel.cache.paging import OffloadedExperts, step_with_misses_s
from perfmodel.serving.latency import LatencyEstimate
from perfmodel.serving.poisson import poisson_pmf, poisson_ppf
from perfmodel.serving.search import cdf_quantile
from perfmodel.serving.servemix import mix_batch
from perfmodel.serving.service import ServiceRate, latency
from perfmodel.step.table import StepTable

Arr = NDArray[np.float64]
_RESIDUAL_NODES = 8  # midpoints of U(0, p̄) for the residual of the iteration in progress
_POISSON_TAIL = 1e-6
_F_RTOL = 1e-3  # relative accuracy of the slow-down factor f
_BRACKET_STEP = 1.2  # geometric step when bracketing f around the guess


def mean_fetch_s(
    off: OffloadedExperts,
    *,
    decode_seqs: float,
    chunk_rate: float,
    chunk_tokens: float,
    max_batched_tokens: int,
    step_s: float,
    own_chunks: int = 0,
) -> float:
    """``E_K[p(min(n_d + (K + own)·c̄, B), t)]``, ``K ~ Poisson(chunk_rate)`` (docstring)."""
    hi = int(poisson_ppf(1.0 - _POISSON_TAIL, chunk_rate)) if chunk_rate > 0 else 0
    k = np.arange(hi + 1)
    pmf = poisson_pmf(k, chunk_rate) if chunk_rate > 0 else np.ones(1)
    pmf = pmf / pmf.sum()
    tokens = np.minimum(decode_seqs + (k + own_chunks) * chunk_tokens, max_batched_tokens)
    # the budget caps T: equal token counts need one penalty evaluation
    uniq, inv = np.unique(np.round(tokens, 6), return_inverse=True)
    pen = np.array([off.penalty_s(float(t), step_s) for t in uniq])
    return float(np.dot(pmf, pen[inv]))


def _mean_chunk_tokens(sr: ServiceRate, decode_seqs: float) -> float:
    mo = sr.moments
    room = max(sr.max_batched_tokens - math.ceil(decode_seqs), 1)
    return float(min(mo.input_tokens / mo.prefill_chunks, room))


def _fetch_s(
    sr: ServiceRate,
    off: OffloadedExperts,
    prompts: float,
    step_s: float,
    *,
    decode_seqs: float | None = None,
    own_chunks: int = 0,
) -> float:
    """:func:`mean_fetch_s` of an iteration of ``sr``'s instance admitting ``prompts``
    prompts per iteration, decoding ``decode_seqs`` (default: ``prompts·E[o]``, within the
    budget) and lasting ``step_s`` without the fetches."""
    mo, B = sr.moments, sr.max_batched_tokens
    n_d = min(prompts * mo.decode_steps, B - 1.0) if decode_seqs is None else decode_seqs
    return mean_fetch_s(
        off,
        decode_seqs=n_d,
        chunk_rate=prompts * mo.prefill_chunks,
        chunk_tokens=_mean_chunk_tokens(sr, n_d),
        max_batched_tokens=B,
        step_s=step_s,
        own_chunks=own_chunks,
    )


def slowed_service_rate(sr: ServiceRate, off: OffloadedExperts | None) -> ServiceRate:
    """The queueing layer's ``μ`` of ``sr`` with expert fetches in every iteration."""
    if off is None:
        return sr
    mo, B = sr.moments, sr.max_batched_tokens
    t_full = sr.full_step_s + off.penalty_s(B, sr.full_step_s)
    r_mem = sr.effective_kv_tokens / mo.lifetime_kv_token_steps  # prompts per iteration
    p_mem = _fetch_s(sr, off, r_mem, sr.memory_step_s)
    t_mem = sr.memory_step_s + p_mem
    mu_c = sr.compute_rate_per_s * sr.full_step_s / t_full
    mu_m = sr.memory_rate_per_s * sr.memory_step_s / t_mem
    mu = min(mu_c, mu_m)
    return replace(
        sr,
        rate_per_s=mu,
        compute_rate_per_s=mu_c,
        memory_rate_per_s=mu_m,
        binding="compute" if mu_c <= mu_m else "memory",
        guaranteed_rate_per_s=mu * max(0.0, 1.0 - sr.delta),
        full_step_s=t_full,
        memory_step_s=t_mem,
        capacity_tokens_per_s=B / t_full,
    )


@dataclass(frozen=True)
class OffloadLatency:
    """Latency of the slowed engine at ``rate_per_s`` (``inf`` quantiles when unbounded)."""

    rate_per_s: float
    equivalent_rate_per_s: float  # f·λ: the unslowed engine with the same iterations
    base: LatencyEstimate  # queueing.latency at the equivalent rate
    stable: bool
    step_s: float  # b' = b + p̄
    fetch_s: float  # p̄: mean fetch time per iteration
    prefill_fetch_s: float  # p_pre: fetch time of an iteration carrying the own chunk
    busy: float  # P(engine busy) seen by an arrival
    misses_per_step: float  # experts fetched per iteration (all MoE layers)
    own_chunks: Arr = field(repr=False)  # k values of the own prefill
    own_chunks_w: Arr = field(repr=False)  # their probabilities

    @property
    def tpot_mean_s(self) -> float:
        return self.base.tpot_mean_s + self.fetch_s if self.stable else math.inf

    def tpot_cdf(self, x_s: float) -> float:
        return self.base.tpot_cdf(x_s - self.fetch_s) if self.stable else 0.0

    def tpot_quantile_s(self, q: float) -> float:
        return self.base.tpot_quantile_s(q) + self.fetch_s if self.stable else math.inf

    def ttft_cdf(self, x_s: float) -> float:
        if not self.stable:
            return 0.0
        if self.fetch_s == 0 and self.prefill_fetch_s == 0:
            return self.base.ttft_cdf(x_s)
        u = (np.arange(_RESIDUAL_NODES) + 0.5) / _RESIDUAL_NODES * self.fetch_s
        total = 0.0
        for k, w in zip(self.own_chunks, self.own_chunks_w, strict=True):
            x = x_s - k * self.prefill_fetch_s
            idle = self.base.ttft_cdf(x)
            busy = float(np.mean([self.base.ttft_cdf(x - r) for r in u]))
            total += w * ((1.0 - self.busy) * idle + self.busy * busy)
        return total

    def ttft_quantile_s(self, q: float) -> float:
        if not self.stable:
            return math.inf
        lo = self.base.ttft_quantile_s(q)
        hi = lo + float(self.own_chunks.max()) * self.prefill_fetch_s + self.fetch_s
        return cdf_quantile(self.ttft_cdf, q, lo, hi, iterations=40, rel_tol=1e-4)


def _unbounded(rate_per_s: float, base: LatencyEstimate) -> OffloadLatency:
    one = np.ones(1)
    inf = math.inf
    return OffloadLatency(rate_per_s, inf, base, False, inf, inf, inf, 1.0, inf, one, one)


def _guess(sr: ServiceRate, off: OffloadedExperts, lam: float) -> float:
    """A starting ``f`` from the mean batch (only to bracket the root; not the answer).

    ``b' = t(mix(λ·b')) + p̄(λ·b')`` with ``t`` the step time of the average iteration
    (:func:`perfmodel.servemix.mix_batch`), then ``f = b'/t``.
    """
    from scipy.optimize import brentq

    mo, B = sr.moments, sr.max_batched_tokens

    def parts(b: float) -> tuple[float, float]:
        r = lam * b
        t = float(sr.instance.iteration_s(mix_batch(r, mo)))
        return t, _fetch_s(sr, off, r, t)

    hi = max(sr.full_step_s, sr.memory_step_s) + off.penalty_s(B, sr.full_step_s)
    t_hi, p_hi = parts(hi)
    if t_hi + p_hi >= hi:
        return max(hi / t_hi, 1.0)
    b = float(brentq(lambda x: sum(parts(x)) - x, 1e-9, hi, rtol=1e-3))
    t, _ = parts(b)
    return max(b / t, 1.0)


def _bracket(
    gap: Callable[[float], float], guess: float, f_hi: float
) -> tuple[float | None, float | None]:
    """``lo ≤ hi`` in ``[1, f_hi)`` with ``gap(lo) ≥ 0 ≥ gap(hi)``, stepping out from ``guess``."""
    f, step = min(max(guess, 1.0), f_hi), _BRACKET_STEP
    if gap(f) >= 0:
        while f < f_hi:
            nxt = min(f * step, f_hi)
            if gap(nxt) <= 0:
                return f, nxt
            f = nxt
        return None, None
    while f > 1.0:
        nxt = max(f / step, 1.0)
        if gap(nxt) >= 0:
            return nxt, f
        f = nxt
    return 1.0, 1.0


def offload_latency(
    sr: ServiceRate, off: OffloadedExperts | None, rate_per_s: float
) -> OffloadLatency:
    """TTFT/TPOT of the engine of ``sr`` slowed by ``off`` at ``rate_per_s`` (docstring).

    ``sr`` is the queueing layer's unslowed :class:`perfmodel.queueing.ServiceRate`.
    """
    from scipy.optimize import brentq

    lam, mo, B = rate_per_s, sr.moments, sr.max_batched_tokens

    def operating_point(f: float) -> tuple[LatencyEstimate, float, float]:
        """Unslowed latency at ``f·λ`` and the fetch times of its iterations."""
        est = latency(sr, f * lam)
        if not est.stable or off is None:
            return est, 0.0, 0.0
        prompts = f * lam * est.step_s  # = λ·b'

        def fetch(own: int) -> float:
            return _fetch_s(
                sr, off, prompts, est.step_s, decode_seqs=est.decode_batch, own_chunks=own
            )

        return est, fetch(0), fetch(1)

    f = 1.0
    est, p_bar, p_pre = operating_point(1.0)
    if not est.stable:
        return _unbounded(lam, est)
    if off is not None and p_bar > 0:
        f_hi = sr.rate_per_s / lam * (1.0 - 1e-9)  # beyond it the unslowed engine saturates
        cache: dict[float, tuple[LatencyEstimate, float, float]] = {1.0: (est, p_bar, p_pre)}

        def point(f_: float) -> tuple[LatencyEstimate, float, float]:
            if f_ not in cache:
                cache[f_] = operating_point(f_)
            return cache[f_]

        def gap(f_: float) -> float:
            e, p, _ = point(f_)
            return 1.0 + p / e.step_s - f_ if e.stable else -f_

        lo, hi = _bracket(gap, _guess(sr, off, lam), f_hi)
        if lo is None or hi is None:  # pragma: no cover - fetches alone exceed every iteration
            return _unbounded(lam, est)
        f = float(brentq(gap, lo, hi, xtol=1e-9, rtol=_F_RTOL)) if hi > lo else lo
        est, p_bar, p_pre = point(f)
        if not est.stable:
            return _unbounded(lam, est)
    step = est.step_s + p_bar
    busy = 1.0 - math.exp(-lam * step * mo.iterations)
    lengths = sr.workload.lengths
    room = max(min(mo.chunk, B - math.ceil(est.decode_batch)), 1)
    k, inv = np.unique(np.ceil(lengths.input_tokens / room), return_inverse=True)
    k_w = np.bincount(inv, weights=lengths.weights)
    misses = off.misses_per_step(lam * step * mo.tokens) if off is not None and p_bar > 0 else 0.0
    return OffloadLatency(
        rate_per_s=lam,
        equivalent_rate_per_s=f * lam,
        base=est,
        stable=True,
        step_s=step,
        fetch_s=p_bar,
        prefill_fetch_s=p_pre,
        busy=busy,
        misses_per_step=misses,
        own_chunks=k.astype(np.float64),
        own_chunks_w=k_w.astype(np.float64),
    )


# ---- the same engine for the discrete-event simulator -----------------------------------


@dataclass(frozen=True)
class _PenalizedTable(StepTable):
    """A step table whose iterations also fetch missed experts: ``t + p(T, t)``."""

    misses: Arr = field(default_factory=lambda: np.zeros(1))
    fetch_s: float = 0.0
    prefetched: float = 0.0

    def time_s(self, tokens: int, rows: int, *args: float, **kw: int) -> float:  # type: ignore[override]
        t = StepTable.time_s(self, tokens, rows, *args, **kw)
        if tokens <= 0:
            return t
        x = float(self.misses[min(tokens, self.misses.size - 1)]) * self.fetch_s
        return step_with_misses_s(t, x, prefetched=self.prefetched)


def penalized_table(table: StepTable, off: OffloadedExperts) -> StepTable:
    """``table`` with every iteration of ``T`` tokens paying ``off``'s fetches (exact per ``T``)."""
    base = {f.name: getattr(table, f.name) for f in fields(table)}
    return _PenalizedTable(
        **base,
        misses=off.miss_table(table.max_tokens),
        fetch_s=off.fetch.mean_s,
        prefetched=off.prefetched,
    )
