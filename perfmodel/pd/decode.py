"""Decode instance model: TPOT goodput of one decode instance.

**Decode instance**: continuous batching of decode steps; a request reserves its final
KV (``s + o`` tokens) on admission (no preemption) and admission is FIFO while the KV
capacity ``M`` and the batch cap allow. With ``N̄`` resident requests the step takes
``t(N̄)`` (``step_time`` of a decode batch at the step-weighted mean context), and
Little's law gives the fixed point ``N̄ = r·E[o − 1]·t(N̄)``. Admission is an M/G/c
queue with ``c = min(cap, M / m̄)`` slots, ``m̄ = E[(s + o)(o − 1)]/E[o − 1]`` the
time-average reservation of a resident (Erlang C, Allen–Cunneen factor
``(1 + c_H²)/2``). A tagged request's TPOT is its mean step time, normal around
``t(N̄ + 1)`` with the variance of the M/G/∞ batch (``Var N = N̄``) averaged over its
``o − 1`` steps, plus its admission wait spread over those steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Any

import numpy as np
from numpy.typing import NDArray

from perfmodel.errors import InfeasibleError, SpecError
from perfmodel.model import ModelSpec
from perfmodel.pd.config import (
    MAX_ATOMS,
    KVLink,
    PhaseConfig,
    PhaseGoodput,
    receive_time_s,
    weighted_quantile,
)
from perfmodel.serving.classic_queues import erlang_c
from perfmodel.serving.latency_laws import sum_ctx_sq, window_variance_factor
from perfmodel.serving.search import cdf_quantile, max_rate
from perfmodel.serving.servemix import compress_atoms, decode_sensitivities, noise_coefficient
from perfmodel.special import distinct_sorted, log_ndtr
from perfmodel.special import ndtr_array as ndtr
from perfmodel.step.batch import Batch
from perfmodel.units import MS_PER_S
from perfmodel.workload.lengths import LengthDistribution
from perfmodel.workload.slo import SLO

Arr = NDArray[np.float64]


@dataclass(frozen=True)
class DecodeProfile:
    """What sets TPOT on a decode instance: step times, KV slots and output lengths."""

    config: PhaseConfig
    kv_capacity_tokens: int
    slots: float  # c = min(cap, M / m̄), m̄ = E[(s + o)(o − 1)]/E[o − 1]
    slot_limit: str  # kv-memory | batch-cap
    multi_fraction: float  # P(o >= 2): requests that decode at all
    steps: Arr  # atoms of n = o − 1 (o >= 2 only)
    step_weights: Arr
    mean_context_tokens: float  # step-weighted mean context
    batch_grid: Arr  # N values where the step time is tabulated
    step_s: Arr  # t(N) at the mean context
    var_coef_s2: float  # E[(∂t/∂N + ∂t/∂K·ctx)²] per resident (batch-noise variance / N̄)
    floor_tpot: Arr  # unloaded TPOT per (s, o) atom (o >= 2)
    floor_weights: Arr
    receive_s_mean: float  # E[receive time]: the ingress link's occupancy per request
    #: variance/mean of the reserved KV in units of the mean reservation (Hayward): 1
    #: for equal reservations or a batch-count limit
    peakedness: float = 1.0
    # the rate-dependent parts of tpot_cdf by (rate, slot_limit): a quantile or an SLO
    # sweep asks at the same rates again
    _by_rate: dict[tuple[float, bool], Any] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    _t_seen_by_limit: dict[bool, Arr] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def step_at(self, n: float) -> float:
        return float(np.interp(n, self.batch_grid, self.step_s))

    @cached_property
    def capacity_bound_per_s(self) -> float:
        """Above :attr:`capacity_rate_per_s`: the Little's-law bound
        ``max_{n ≤ c} n / (E[o − 1]·t(n))`` (÷ ``P(o ≥ 2)``), times ``1 + 10⁻⁹``.

        The bound takes the best batch up to the slots, not the full one: a step time with
        jumps (tile padding) can make a smaller batch carry more requests per second.
        """
        en = float(np.dot(self.step_weights, self.steps))
        n = np.append(
            self.batch_grid[(self.batch_grid > 0) & (self.batch_grid < self.slots)], self.slots
        )
        t = np.interp(n, self.batch_grid, self.step_s)
        return float((n / (en * t)).max()) / self.multi_fraction * (1 + 1e-9)

    @cached_property
    def capacity_rate_per_s(self) -> float:
        """The stability limit per routed request: the largest rate at which
        :meth:`batch_law` is stable (its mean below the slots), by bisection under
        :attr:`capacity_bound_per_s`."""
        return max_rate(lambda r: self.batch_law(r) is not None, self.capacity_bound_per_s)

    def batch_law(self, rate_per_s: float, limit: float | None = None) -> Arr | None:
        """The stationary law of the residents ``N`` (index = ``N``); None when unstable.

        Every resident advances one step per iteration of ``t(N)``: a processor-sharing
        server of total rate ``N/t(N)`` steps per second, a symmetric queue whose law is
        insensitive to the output lengths (Kelly, *Reversibility and Stochastic
        Networks*, 1979, §3.3): ``π(N)/π(N − 1) = λ·E[o − 1]·t(N)/N``. A constant ``t``
        gives the Poisson law of M/G/∞; ``t ∝ N`` the geometric one of M/G/1-PS. With a
        convex ``t`` (the per-sequence cost grows with the batch) the tail is heavy long
        before the mean-field fixed point ``N̄ = λ·E[o − 1]·t(N̄)`` stops existing
        (Llama-3.1-70B on 4 MI300X at 41 req/s: fixed point 373, simulated TPOT 10 %
        above ``t(N̄)`` and growing). Unstable when the mean reaches ``limit`` (default:
        the slots) or mass reaches the end of the tabulated grid.
        """
        en, states, log_terms = self._law_terms
        lam = rate_per_s * self.multi_fraction
        lim = self.slots if limit is None else float(limit)
        if lam <= 0:
            law = np.zeros(states.size)
            law[0] = 1.0
            return law
        # log π(N) = N·log(λ·E[o − 1]) + Σ_{k ≤ N} log(t(k)/k), the sum tabulated once
        logp = states * math.log(lam * en) + log_terms
        law = np.exp(logp - logp.max())
        law /= law.sum()
        if law[-1] > 1e-9 or float(states @ law) >= lim:
            return None
        return law

    @cached_property
    def _law_terms(self) -> tuple[float, Arr, Arr]:
        """The rate-free parts of :meth:`batch_law`: ``E[o − 1]``, the states
        ``0 … top`` and ``Σ_{k ≤ N} log(t(k)/k)`` per state."""
        en = float(np.dot(self.step_weights, self.steps))
        top = int(self.batch_grid[-1])
        k = np.arange(1, top + 1, dtype=np.float64)
        t = np.interp(k, self.batch_grid, self.step_s)
        log_terms = np.concatenate([[0.0], np.cumsum(np.log(t) - np.log(k))])
        return en, np.arange(top + 1, dtype=np.float64), log_terms

    @cached_property
    def _window_factor(self) -> Arr:
        return window_variance_factor(self.steps, self.step_weights)

    def _t_seen(self, slot_limit: bool) -> Arr:
        """``t(min(N + 1, slots))`` per state (``t(N + 1)`` without the slot limit)."""
        if slot_limit not in self._t_seen_by_limit:
            top = self.slots if slot_limit else math.inf
            n1 = np.minimum(self._law_terms[1] + 1.0, top)
            self._t_seen_by_limit[slot_limit] = np.interp(n1, self.batch_grid, self.step_s)
        return self._t_seen_by_limit[slot_limit]

    def mean_batch(self, rate_per_s: float, limit: float | None = None) -> float | None:
        """``E[N]`` under :meth:`batch_law`; None when unstable."""
        law = self.batch_law(rate_per_s, limit)
        return None if law is None else float(np.arange(law.size) @ law)

    def tpot_cdf(self, rate_per_s: float, x_s: float, *, slot_limit: bool = True) -> float:
        """``P(TPOT ≤ x)`` over decoding requests at a Poisson rate (0 when unstable).

        ``slot_limit=False`` lifts the KV/batch-cap admission limit (no admission wait;
        the batch may grow to the end of the tabulated grid).
        """
        key = (rate_per_s, slot_limit)
        if key not in self._by_rate:
            self._by_rate[key] = self._tpot_law(rate_per_s, slot_limit)
        law = self._by_rate[key]
        if law is None:
            return 0.0
        w = self.step_weights
        mean, sigma, c_wait, theta = law
        base = ndtr((x_s - mean) / sigma)  # the normal CDF
        if not slot_limit:
            return float(np.dot(w, base))
        waited = base if theta is None else _emg_cdf(x_s, mean, sigma, theta)
        return float(np.dot(w, (1 - c_wait) * base + c_wait * waited))

    def _tpot_law(
        self, rate_per_s: float, slot_limit: bool
    ) -> tuple[Arr, Arr, float, Arr | None] | None:
        """``(mean, σ, P(wait), mean wait per step given waiting)`` of the TPOT mixture at a
        rate; None when the batch or the admission queue is unstable."""
        law = self.batch_law(rate_per_s, self.slots if slot_limit else self.batch_grid[-1] - 1)
        if law is None:
            return None
        states = self._law_terms[1]
        nbar = float(states @ law)
        var_n = float(((states - nbar) ** 2) @ law)
        n = self.steps
        w = self.step_weights
        t_bar = self.step_at(nbar)
        en = float(np.dot(w, n))
        # batch-noise: M/G/∞ correlation over the request's window of L = n steps
        var_avg = var_n * self._window_factor * self.var_coef_s2
        sigma = np.sqrt(np.maximum(var_avg, 0.0)) + 1e-12 * t_bar
        # E[t(N + 1)]: convex t, above t(N̄ + 1)
        mean = np.full(n.shape, float(self._t_seen(slot_limit) @ law))
        if not slot_limit:
            return mean, sigma, 0.0, None
        # admission wait: M/G/c, Erlang C with the Allen–Cunneen factor
        # reservations of unequal sizes: Hayward's equivalent servers, slots and offered
        # load divided by the occupancy's peakedness z (1 for a count-limited batch)
        z = self.peakedness
        offered = nbar / z
        servers = self.slots / z
        c_wait = erlang_c(servers, offered)
        hold_s = en * t_bar
        cv2 = float(np.dot(w, n**2)) / en**2 - 1.0
        c_int = max(int(servers), 1)
        wq = c_wait * hold_s / (c_int - offered) * (1 + cv2) / 2 if offered < c_int else math.inf
        if not math.isfinite(wq):
            return None
        # the mean of the wait spread over the steps, given waiting
        theta = wq / c_wait / n if c_wait > 0 and wq > 0 else None
        return mean, sigma, c_wait, theta


def decode_kv_capacity(model: ModelSpec, config: PhaseConfig, lengths: LengthDistribution) -> int:
    """KV tokens a decode instance holds: ``config.kv_capacity_tokens`` when given (a
    measured capacity), else ``memory_fit`` with an activation reserve sized for a decode
    iteration of about twice the expected batch (at most 8192 tokens).

    Raises InfeasibleError when the largest request cannot fit.
    """
    inst = config.instance(model)
    if config.kv_capacity_tokens is not None:
        M = config.kv_capacity_tokens
    else:
        mean_total = lengths.expect(lambda s, o: s + o)
        slots0 = inst.memory_fit(max_batched_tokens=256).kv_capacity_tokens / mean_total
        reserve = int(min(max(256, 2 * (config.batch_cap or slots0)), 8192))
        M = inst.memory_fit(max_batched_tokens=reserve).kv_capacity_tokens
    if lengths.max_total_tokens > M:
        raise InfeasibleError(
            f"{model.id} on {config.label}: KV capacity {M:,} tokens cannot hold the largest "
            f"request ({lengths.max_total_tokens:,} tokens)"
        )
    return M


def decode_profile(
    model: ModelSpec,
    config: PhaseConfig,
    lengths: LengthDistribution,
    *,
    link: KVLink,
) -> DecodeProfile:
    """Step times, slots and output atoms of one decode instance type."""
    M = decode_kv_capacity(model, config, lengths)
    # a resident holds s + o tokens for its o − 1 steps: the slots are M over the
    # footprint a resident has on average over time, E[(s + o)(o − 1)]/E[o − 1] (long
    # outputs hold their large reservations longest), not over E[s + o] -- on chat that
    # is 18 % larger and the admission waits it causes set the TPOT tail
    mean_total, peak = _resident_footprint_tokens(lengths)
    mem_slots = M / mean_total
    slots = mem_slots if config.batch_cap is None else min(mem_slots, float(config.batch_cap))
    limit = (
        "batch-cap"
        if config.batch_cap is not None and config.batch_cap < mem_slots
        else ("kv-memory")
    )
    multi = lengths.output_tokens >= 2
    p_multi = float(lengths.weights[multi].sum())
    if p_multi <= 0:
        raise SpecError("every request has one output token: there is nothing to decode")
    sub_w = lengths.weights * multi / p_multi
    steps, sw = compress_atoms(lengths.output_tokens - 1, sub_w, MAX_ATOMS)
    sw, steps = sw[steps >= 1], steps[steps >= 1]
    sw = sw / sw.sum()
    e_steps = float(np.dot(sub_w, lengths.output_tokens - 1))
    e_ctx_sum = float(
        np.dot(
            sub_w,
            (lengths.output_tokens - 1) * lengths.input_tokens
            + (lengths.output_tokens - 1) * (lengths.output_tokens - 2) / 2,
        )
    )
    ctx = e_ctx_sum / e_steps
    ctx2 = (
        float(np.dot(sub_w, sum_ctx_sq(lengths.input_tokens, lengths.output_tokens - 1))) / e_steps
    )
    top = 4 * slots + 8  # room above the slots for the unlimited (limiter) evaluation
    grid = distinct_sorted(np.concatenate([np.linspace(0, top, 513), np.arange(0, 9)]))
    bt = config.instance(model).iteration_s(Batch.decode(np.maximum(grid, 1.0), ctx))
    # sensitivities at a representative batch for the batch-noise variance
    dn, dk = decode_sensitivities(config.instance(model), 0.5 * slots, ctx)
    var_coef = noise_coefficient(dn, dk, ctx, ctx2)
    # unloaded TPOT per request: alone, at its own mean context s + (o − 2)/2
    fs, fo = lengths.input_tokens[multi], lengths.output_tokens[multi]
    mctx, mw = compress_atoms(
        np.rint(fs + (fo - 2) / 2).astype(np.int64), lengths.weights[multi] / p_multi, MAX_ATOMS
    )
    floor = config.instance(model).iteration_s(Batch.decode(1, mctx))
    rs, rw = compress_atoms(lengths.input_tokens, lengths.weights, MAX_ATOMS)
    recv = float(np.dot(rw, receive_time_s(model, rs, decode=config, link=link)))
    return DecodeProfile(
        config=config,
        kv_capacity_tokens=M,
        slots=slots,
        slot_limit=limit,
        multi_fraction=p_multi,
        steps=steps,
        step_weights=sw,
        mean_context_tokens=ctx,
        batch_grid=grid,
        step_s=np.asarray(bt),
        var_coef_s2=var_coef,
        floor_tpot=np.asarray(floor),
        floor_weights=mw,
        receive_s_mean=recv,
        peakedness=peak if limit == "kv-memory" else 1.0,
    )


def exponnorm_cdf(x: float, K: Arr, *, loc: Arr, scale: Arr) -> Arr:
    """``scipy.stats.exponnorm.cdf(x, K, loc, scale)``, the same operations as SciPy's
    (``Φ(z) − exp(K⁻¹(K⁻¹/2 − z) + log Φ(z − K⁻¹))``, ``z = (x − loc)/scale``); NaN where
    ``K ≤ 0`` or ``scale ≤ 0``, as SciPy returns; Φ and log Φ from
    :mod:`perfmodel.special` (no scipy import), equal to SciPy's to rounding."""
    z = (x - loc) / scale
    inv_k = 1.0 / K
    cdf = ndtr(z) - np.exp(inv_k * (0.5 * inv_k - z) + log_ndtr(z - inv_k))
    return np.where((K > 0) & (scale > 0), cdf, np.nan)


def _emg_cdf(x: float, mean: Arr, sigma: Arr, theta: Arr) -> Arr:
    """CDF of Normal(mean, sigma²) + Exponential(mean theta) (exponentially modified normal)."""
    k = theta / sigma
    narrow = k > 1e3  # the normal is negligible next to the exponential
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        emg = exponnorm_cdf(x, np.where(narrow, 1.0, k), loc=mean, scale=sigma)
        expo = np.where(x > mean, -np.expm1(-(x - mean) / theta), 0.0)
    return np.where(narrow, expo, emg)


def _resident_footprint_tokens(lengths: LengthDistribution) -> tuple[float, float]:
    """``m̄ = E[g·h]/E[h]`` (``g = s + o`` reserved, ``h = o − 1`` steps held): the
    time-average reservation of a decoding request; and the peakedness of the reserved
    total in units of ``m̄``, ``z = E[g²·h]/(E[g·h]·m̄)`` (M/G/∞ occupancy in tokens:
    mean ``λE[g·h]``, variance ``λE[g²·h]``; Hayward's approximation treats it as ``1/z``
    times as many servers of ``z·m̄`` tokens)."""
    n = np.maximum(lengths.output_tokens - 1, 0).astype(np.float64)
    g = (lengths.input_tokens + lengths.output_tokens).astype(np.float64)
    w = lengths.weights * n
    if w.sum() <= 0:
        return float(lengths.expect(lambda s, o: s + o)), 1.0
    m1 = float(np.dot(w, g) / w.sum())
    return m1, float(np.dot(w, g * g) / np.dot(w, g)) / m1


def decode_goodput(profile: DecodeProfile, slo: SLO) -> PhaseGoodput:
    """Largest rate with ``P(TPOT ≤ slo.tpot_s) ≥ slo.percentile`` on one decode instance.

    The rate counts every request routed to the instance (one-token outputs included).
    ``limiter`` is ``kv-memory``/``batch-cap`` when lifting the slot limit would raise the
    goodput by more than 2 %, else ``tpot``.
    """
    q = slo.percentile
    cfg = profile.config
    floor = weighted_quantile(profile.floor_tpot, profile.floor_weights, q)
    cap = profile.capacity_rate_per_s
    link_cap = 1.0 / profile.receive_s_mean if profile.receive_s_mean > 0 else math.inf
    goodput = PhaseGoodput.of(cfg, cap, link_cap, profile.kv_capacity_tokens)
    if floor > slo.tpot_s:
        return goodput(
            0.0, "tpot", floor, partial(float, floor),
            f"unloaded p{q * 100:g} TPOT is {floor * MS_PER_S:.2f} ms",
        )  # fmt: skip
    hi = cap * 1.05
    rate = max_rate(lambda r: profile.tpot_cdf(r, slo.tpot_s) >= q, hi)
    free_rate = max_rate(
        lambda r: profile.tpot_cdf(r, slo.tpot_s, slot_limit=False) >= q,
        hi * 4,
    )
    limiter = profile.slot_limit if free_rate > 1.02 * rate else "tpot"
    nbar = profile.mean_batch(rate) or profile.slots
    return goodput(
        rate,
        limiter,
        floor,
        partial(_tpot_quantile, profile, rate, q),
        f"{rate:.3g} req/s with a mean batch of {nbar:.1f} of {profile.slots:.0f} slots",
    )


def _tpot_quantile(profile: DecodeProfile, rate: float, q: float) -> float:
    lo, hi = 0.0, float(profile.step_s.max()) * 4 + 1.0
    if profile.tpot_cdf(rate, hi) < q:
        return math.inf
    return cdf_quantile(lambda x: profile.tpot_cdf(rate, x), q, lo, hi, iterations=50)
