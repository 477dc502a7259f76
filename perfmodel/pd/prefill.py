"""Prefill instance model: TTFT goodput of one prefill instance (DistServe §3.1).

**Prefill instance** (DistServe §3.1, eq. 1, generalized from M/D/1 to M/G/1): FCFS,
one prompt at a time, ``D(s)`` = one prefill iteration of an ``s``-token prompt on the
instance's TP group (its all-reduces included: the TP speed-up ``K`` of eq. 3 is not a
parameter, it falls out of ``step_time``). The KV transfer ``X(s)`` follows on the
instance's link, overlapped with the next prompt's prefill, so the pair is a tandem
whose bottleneck occupancy per request is ``S(s) = max(D(s), X(s))``. The queue in front
is M/G/1 with service ``S``; its waiting time has the Cramér–Lundberg tail
``P(W > x) ≈ min(ρ, C·e^{−γx})`` where ``γ > 0`` solves ``λ(E[e^{γS}] − 1) = γ`` and
``C = (1 − ρ)/(λ·E[S·e^{γS}] − 1)`` (exact for M/M/1: ``γ = μ − λ``, ``C = ρ``; Asmussen,
*Applied Probability and Queues*, XIII.5). ``TTFT = W + D(s) + X(s)``: the first token
counts as delivered when the decode instance holds the KV (vLLM-style disaggregated
serving; it is the conservative reading of DistServe's TTFT). Prompts shorter than the
critical length ``L_m`` are batched until the batch reaches ``L_m`` tokens (DistServe
§3.1): past it a batch of prompts costs the sum of its prompts, below it they share one
weight read. How full the batches are depends on the queue (Pollaczek–Khinchine wait,
:meth:`PrefillProfile.at_rate`), so short prompts occupy the server for ``D(s)`` at light
load and for their token share of a full batch near saturation
(:func:`prefill_profile`, :func:`prefill_batch_tokens`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
from numpy.typing import NDArray

from perfmodel.errors import SpecError
from perfmodel.model import ModelSpec
from perfmodel.pd.config import (
    MAX_ATOMS,
    KVLink,
    PhaseConfig,
    PhaseGoodput,
    kv_link,
    kv_transfer_time_s,
    weighted_quantile,
)
from perfmodel.serving.search import cdf_quantile, max_rate
from perfmodel.serving.servemix import compress_atoms
from perfmodel.special import distinct_sorted
from perfmodel.step.batch import Batch
from perfmodel.units import MS_PER_S
from perfmodel.workload.lengths import LengthDistribution
from perfmodel.workload.slo import SLO

Arr = NDArray[np.float64]


def mg1_wait_tail(rate_per_s: float, service_s: Arr, weights: Arr) -> tuple[float, float, float]:
    """``(ρ, C, γ)`` of the M/G/1 FCFS wait tail ``P(W > x) ≈ min(ρ, C·e^{−γx})``.

    Cramér–Lundberg: ``γ > 0`` solves ``λ(E[e^{γS}] − 1) = γ``, and
    ``C = (1 − ρ)/(λ·E[S·e^{γS}] − 1)``. Requires ``ρ = λE[S] < 1``.
    """
    lam = rate_per_s
    mean = float(np.dot(weights, service_s))
    rho = lam * mean
    if not 0 <= rho < 1:
        raise SpecError("the M/G/1 wait tail needs 0 <= λ·E[S] < 1")
    if lam == 0:
        return 0.0, 0.0, math.inf
    smax = float(service_s.max())

    def f(g: float) -> tuple[float, float]:
        """``f(g) = λ(E[e^{gS}] − 1) − g`` and ``f'(g) = λE[S·e^{gS}] − 1`` (one exp)."""
        e = np.exp(g * service_s)
        return lam * (float(np.dot(weights, e)) - 1.0) - g, lam * float(
            np.dot(weights, service_s * e)
        ) - 1.0

    hi = 1.0 / smax
    while f(hi)[0] <= 0:
        hi *= 2.0
    # f is convex with f(0) = 0 and f'(0) = ρ − 1 < 0: Newton from ``hi`` (f > 0) falls
    # monotonically onto the root γ, to the last bits (scipy's brentq: ~0.15 s of import)
    gamma = hi
    for _ in range(200):
        f_g, slope = f(gamma)
        step = f_g / slope
        if not step > 4e-16 * gamma:
            break
        gamma -= step
    deriv = f(gamma)[1]
    c = (1.0 - rho) / deriv if deriv > 0 else rho
    return rho, c, gamma


@dataclass(frozen=True)
class PrefillProfile:
    """Prefill and KV-transfer times of a prefill instance over the prompt lengths."""

    config: PhaseConfig
    input_tokens: Arr
    weights: Arr
    prefill_s: Arr  # D_b(s): a full batch of batch_size(s) such prompts (alone: D(s))
    transfer_s: Arr  # X(s)
    link: KVLink
    alone_s: Arr  # D(s): the prompt's iteration alone (the unloaded TTFT)
    batch_size: Arr  # k(s) = ⌈L_m/s⌉ prompts per full batch below L_m, else 1
    batch_tokens: int  # L_m
    # the rate-dependent parts of ttft_cdf by rate (a quantile or an SLO sweep asks at
    # the same rates again): (own iteration, None if unstable else the M/G/1 wait tail)
    _by_rate: dict[float, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def occupancy_s(self) -> Arr:
        """Server time per prompt in full batches: ``D_b(s)/k(s)`` (saturation)."""
        return self.prefill_s / self.batch_size

    @property
    def service_s(self) -> Arr:
        return np.maximum(self.occupancy_s, self.transfer_s)

    @property
    def capacity_rate_per_s(self) -> float:
        return 1.0 / float(np.dot(self.weights, self.service_s))

    @property
    def link_capacity_per_s(self) -> float:
        return 1.0 / float(np.dot(self.weights, self.transfer_s))

    def at_rate(self, rate_per_s: float) -> tuple[Arr, Arr]:
        """``(own iteration, server time per prompt)`` at a Poisson rate.

        A short prompt finds ``m = λ·P(short)·W`` short companions queued behind it when
        its iteration starts (the short arrivals during its wait; ``W = λE[S²]/(2(1−ρ))``,
        Pollaczek–Khinchine), so it runs in a batch of ``n = min(k, 1 + m)`` prompts
        lasting ``D(s) + (n − 1)/(k − 1)·(D_b(s) − D(s))`` (linear in the batch: exact for
        additive costs, above a roofline's flat part) and occupies the server for that
        over ``n``. Fixed point in ``m``; full batches as ``ρ → 1``.
        """
        short = self.batch_size > 1
        p_short = float(self.weights[short].sum())
        span = np.where(short, self.batch_size - 1, 1.0)
        own, svc = self.alone_s, np.maximum(self.alone_s, self.transfer_s)
        if p_short == 0 or rate_per_s <= 0:
            return own, svc
        m = 0.0
        for _ in range(100):
            n = np.minimum(self.batch_size, 1.0 + m)
            own = self.alone_s + (n - 1.0) / span * (self.prefill_s - self.alone_s)
            svc = np.maximum(own / n, self.transfer_s)
            rho = rate_per_s * float(np.dot(self.weights, svc))
            if rho >= 1:
                new = float(self.batch_size.max())
            else:
                wait = rate_per_s * float(np.dot(self.weights, svc**2)) / (2 * (1 - rho))
                new = rate_per_s * p_short * wait
            if abs(new - m) <= 1e-6 * max(new, 1.0):
                break
            m = new
        return own, svc

    def _at(self, rate_per_s: float) -> tuple[Arr, tuple[float, float, float] | None]:
        hit = self._by_rate.get(rate_per_s)
        if hit is None:
            own, svc = self.at_rate(rate_per_s)
            unstable = rate_per_s * float(np.dot(self.weights, svc)) >= 1
            tail = None if unstable else mg1_wait_tail(rate_per_s, svc, self.weights)
            hit = self._by_rate[rate_per_s] = (own, tail)
        return hit

    def ttft_cdf(self, rate_per_s: float, x_s: float) -> float:
        """``P(TTFT ≤ x)`` at a Poisson rate (0 when unstable)."""
        own, tail_law = self._at(rate_per_s)
        if tail_law is None:
            return 0.0
        rho, c, g = tail_law
        y = x_s - own - self.transfer_s
        with np.errstate(over="ignore"):
            tail = np.minimum(rho, c * np.exp(-g * np.maximum(y, 0.0)))
        return float(np.dot(self.weights, np.where(y < 0, 0.0, 1.0 - tail)))

    def ttft_quantile_s(self, rate_per_s: float, q: float) -> float:
        lo = float((self.alone_s + self.transfer_s).min())
        if self.ttft_cdf(rate_per_s, lo) >= q:
            return lo
        if self._at(rate_per_s)[1] is None:  # unstable
            return math.inf
        hi = 2.0 * lo + 1.0
        while self.ttft_cdf(rate_per_s, hi) < q:
            hi *= 2.0
        return cdf_quantile(lambda x: self.ttft_cdf(rate_per_s, x), q, lo, hi, iterations=60)


def prefill_profile(
    model: ModelSpec,
    config: PhaseConfig,
    lengths: LengthDistribution,
    *,
    decode: PhaseConfig,
    placement: str = "auto",
) -> PrefillProfile:
    """Tabulate ``D(s)`` and ``X(s)`` over (at most 96) prompt-length atoms.

    Prompt batching (DistServe §3.1, ``formal_models.md`` §2.2): prompts shorter than
    ``L_m`` (:func:`prefill_batch_tokens`) share an iteration with the short prompts
    waiting behind them until the batch reaches ``L_m`` tokens, ``k(s) = ⌈L_m/s⌉`` like
    prompts when full. ``D_b(s)`` is that full batch; how full it is at a rate is
    :meth:`PrefillProfile.at_rate`.
    """
    s, w = compress_atoms(lengths.input_tokens, lengths.weights, MAX_ATOMS)
    link = kv_link(config, decode, placement)
    lm, alone, k, full = _prefill_times(model, config, s)
    x = kv_transfer_time_s(model, s, prefill=config, decode=decode, link=link)
    return PrefillProfile(config, s, w, full, np.asarray(x), link, alone, k, lm)


#: prefill times by (model, config, prompt atoms): the same for every decode class a
#: prefill configuration is paired with (only the KV transfer depends on the pair)
_TIMES: dict[tuple[int, int, bytes], tuple[Any, ...]] = {}
_TIMES_KEPT = 64


def _prefill_times(model: ModelSpec, config: PhaseConfig, s: Arr) -> tuple[int, Arr, Arr, Arr]:
    """``(L_m, D(s), k(s), D_b(s))`` of :func:`prefill_profile`, computed once per
    configuration object (identity-checked)."""
    key = (id(model), id(config), s.tobytes())
    hit = _TIMES.get(key)
    if hit is not None and hit[0] is model and hit[1] is config:
        return hit[2]
    lm = prefill_batch_tokens(model, config)
    alone = np.asarray(config.instance(model).iteration_s(Batch.prefill(1, s)))
    k = np.where(s < lm, np.ceil(lm / s), 1.0)
    full = np.where(k > 1, config.instance(model).iteration_s(Batch.prefill(k, s)), alone)
    if len(_TIMES) >= _TIMES_KEPT:
        _TIMES.pop(next(iter(_TIMES)))
    value = (lm, alone, k, np.asarray(full))
    _TIMES[key] = (model, config, value)
    return value


def prefill_batch_tokens(model: ModelSpec, config: PhaseConfig) -> int:
    """``L_m``: the prompt length past which prefill is compute-bound (DistServe §3.1).

    ``L_m = √2·L*`` with ``L*`` the shortest prompt whose time grows by at least √2
    when it doubles, ``t(2L) ≥ √2·t(L)`` (elasticity ½ over an octave). For a roofline
    that is flat (one weight read) up to its ridge ``R`` and linear after, ``L_m = R``;
    for an affine ``a + b·L``, ``L_m = a/b`` (fixed cost = per-token cost). Batching
    prompts beyond ``L_m`` tokens saves little and delays every prompt in the batch.
    """
    grid = distinct_sorted(np.rint(np.geomspace(1.0, 1 << 17, 241)))
    t = config.instance(model).iteration_s(Batch.prefill(1, np.concatenate([grid, 2 * grid])))
    t1, t2 = t[: grid.size], t[grid.size :]
    hit = np.flatnonzero(t2 >= math.sqrt(2.0) * t1)
    return round(math.sqrt(2.0) * float(grid[hit[0]])) if hit.size else int(grid[-1])


def prefill_goodput(profile: PrefillProfile, slo: SLO, *, model: ModelSpec) -> PhaseGoodput:
    """Largest rate with ``P(TTFT ≤ slo.ttft_s) ≥ slo.percentile`` on one prefill instance."""
    q = slo.percentile
    cfg = profile.config
    floor = weighted_quantile(profile.alone_s + profile.transfer_s, profile.weights, q)
    cap = profile.capacity_rate_per_s
    link_cap = profile.link_capacity_per_s
    link_bound = link_cap <= 1.0 / float(np.dot(profile.weights, profile.occupancy_s))
    kv_cap = cfg.instance(model).memory_fit().kv_capacity_tokens
    goodput = PhaseGoodput.of(cfg, cap, link_cap, kv_cap)
    limiter = "kv-link" if link_bound else "ttft"
    if floor > slo.ttft_s:
        x_q = weighted_quantile(profile.transfer_s, profile.weights, q)
        return goodput(
            0.0,
            limiter,
            floor,
            partial(float, floor),
            f"unloaded p{q * 100:g} TTFT is {floor * MS_PER_S:.1f} ms (KV transfer "
            f"{x_q * MS_PER_S:.1f} ms of it over {profile.link.name})",
        )
    rate = max_rate(lambda r: profile.ttft_cdf(r, slo.ttft_s) >= q, cap)
    return goodput(
        rate,
        limiter,
        floor,
        partial(profile.ttft_quantile_s, rate, q),
        f"{rate:.3g} req/s at {rate / cap:.0%} of the prefill capacity {cap:.3g} req/s",
    )
