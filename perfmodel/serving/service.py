"""Stability, service rate, latency, goodput and sizing of LLM serving instances.

Public API (stable; other modules build on it):

* :func:`service_rate` -> :class:`ServiceRate`: the largest stable request rate ``μ`` of
  one instance (model on ``plan.tp·plan.pp`` devices) under continuous batching with chunked
  prefill, as the minimum of two necessary bounds:

  - compute (Li–Dai–Peng, arXiv 2504.07347, Thm 2): a work-conserving engine processes
    at most ``b_max / t_{b_max}`` tokens/s, so ``μ_compute = B / (t_full·(E[s]+E[o]−1))``
    with ``t_full`` the step time of a full budget of ``B`` tokens at the saturated mix;
  - KV memory (Nie–Si–Zhou, arXiv 2605.04595): ``μ_memory = M_eff / (b̄·E[g(s,o)])``,
    derived below.

  ``μ = min``; the smaller names the binding bound; ``δ = max(s+o)/M`` and
  ``μ(1 − δ)`` is the rate below which every work-conserving policy is stable.

**The memory bound.** Little's law in iteration time: if the cache holds ``L`` KV tokens
on average during an iteration and a request holds ``E[g]`` token·iterations over its
life, a saturated engine completes ``L/E[g]`` requests per iteration, i.e.
``μ = L / (b̄·E[g])`` with ``b̄`` the mean iteration time there. Nie et al. take
``L = M`` and a measured median ``b̄``. Two corrections make it predictive:

* *Occupancy.* FIFO admission cannot keep the cache full. The engine admits only while
  the KV in use stays below ``(1 − w)·M`` (watermark ``w``), and the head-of-line
  request only once its whole first chunk ``c = min(s, C)`` fits. Free tokens arrive from
  completions and are consumed by prompts in FIFO order, so the free space waiting for
  the next prompt is the age of a renewal process whose intervals are the first chunks:
  on average ``E[c²]/(2E[c])`` (the inspection paradox,
  :func:`perfmodel.classic_queues.renewal_mean_age`). Hence
  ``L = M_eff = M − ⌊w·M⌋ − E[c²]/(2E[c])``. Neglected: decode growth into that gap
  between completions (it refills up to ``E[o−1]`` tokens: ``M_eff`` is slightly low).
* *Recompute.* A full cache preempts: ``R`` prompt tokens per request are prefilled
  again (:mod:`perfmodel.serving.preemption`), so ``b̄`` below is taken with
  ``1 + R/E[s]`` prompt passes per request (not for an engine that reserves a request's
  whole KV at admission); with a prefix cache (``engine.prefix_caching``, vLLM V1) only
  the evicted share ``φ`` of it, ``φ·R``.
* *Iteration time.* At that operating point ``r = M_eff/E[g]`` prompts start per
  iteration and ``n_d = r·E[o−1]`` requests decode (Little). The prompts come as whole
  chunks, ``K ~ Poisson(r·E[chunks])`` per iteration, so
  ``b̄ = E_K[t(n_d decodes + K chunks)]``
  (:func:`perfmodel.servemix.poisson_iteration_s`). The step time of the *mean* batch
  (prompt tokens spread thinly over every iteration) is smaller by Jensen's inequality
  when one prompt turns a memory-bound decode step compute-bound; with it the bound was
  20–38 % too high on caches of 100,000 tokens. (When ``r ≥ B/E[tokens]`` the budget
  fills before the cache, compute binds, and ``b̄`` is the mean batch's time.)

Both quantities follow from the length distribution, the chunk size and the engine's
watermark; nothing is fitted to the simulator. Known limit: with a budget much larger
than the chunk (``B`` = 2,048, ``C`` = 512) several first chunks are admitted at once and
the simulator preempts more than ``R`` says (``chat`` at ``M`` = 100,000: 14–25 % of the
memory-bound throughput).

* :func:`stability` -> :class:`Stability`: verdict, utilization ``λ/μ`` and margin.
* :func:`latency` -> :class:`perfmodel.latency.LatencyEstimate`: TTFT/TPOT means and
  p50/p90/p99 at a rate.
* :func:`slo_attainment`, :func:`goodput` -> :class:`Goodput`: SLO checks and the
  largest rate meeting the attainment goal.
* :func:`instances_needed` -> :class:`Sizing`: instances for an arrival rate.

**Pipeline parallelism** (``plan.pp = P > 1``). The instance runs ``P`` virtual
engines (vLLM), each with its own scheduler, token budget ``B``, ``⌊M/P⌋`` of the
instance's KV tokens (vLLM V0 splits the cache blocks evenly) and iteration time
``perfmodel.step.step_time`` (the virtual engine's iteration when the pipeline is
full). New requests go to the least-loaded engine, so each sees ``λ/P``: ``μ`` is ``P``
times a virtual engine's rate (both bounds), ``δ`` is that of one engine's cache, the
latency at ``λ`` is an engine's at ``λ/P``, and an instance counts ``tp·P`` devices.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from perfmodel.errors import SpecError
from perfmodel.memory import DEFAULT_MAX_BATCHED_TOKENS
from perfmodel.serving.classic_queues import (
    nie_memory_rate_per_s,
    renewal_mean_age,
    work_conserving_capacity_tokens_per_s,
)
from perfmodel.serving.latency import LatencyEstimate, estimate_latency
from perfmodel.serving.preemption import (
    prefix_cache_evicted_fraction,
    recompute_tokens_per_request,
)
from perfmodel.serving.servemix import (
    DEFAULT_WATERMARK,
    PROMPT_BINS,
    RequestMoments,
    compress_atoms,
    mix_batch,
    poisson_iteration_s,
    request_moments,
)
from perfmodel.step.instance import Instance, OnInstance
from perfmodel.workload.arrivals import check_rate
from perfmodel.workload.presets import Workload


@dataclass(frozen=True)
class ServiceRate(OnInstance):
    """The stable service rate of one instance and what bounds it."""

    instance: Instance
    workload: Workload
    rate_per_s: float  # μ = min(compute, memory) (× pp: the whole instance)
    compute_rate_per_s: float
    memory_rate_per_s: float
    binding: str  # "compute" | "memory"
    delta: float  # max(s+o)/M (M of one virtual engine when pp > 1)
    guaranteed_rate_per_s: float  # μ·(1 − δ), 0 if δ >= 1
    kv_capacity_tokens: int  # M of the instance
    max_batched_tokens: int  # B per iteration (of each virtual engine)
    chunk_size: int
    full_step_s: float  # iteration time of a full token budget at the saturated mix
    memory_step_s: float  # b̄: iteration time when the KV is full
    capacity_tokens_per_s: float  # B / t_full (Li–Dai–Peng) (× pp)
    moments: RequestMoments
    effective_kv_tokens: float = 0.0  # M_eff = M − watermark·M − E[c²]/(2E[c]) (× pp)
    admission_slack_tokens: float = 0.0  # E[c²]/(2E[c]): KV left free by FIFO admission
    recompute_tokens: float = 0.0  # φ·R: prompt tokens recomputed per request after preemption
    recompute_evicted_fraction: float = 1.0  # φ: what a prefix cache loses (1: no cache)

    @property
    def largest_request_fits(self) -> bool:
        return self.delta < 1.0

    @property
    def devices(self) -> int:
        """Devices of one instance: ``tp·pp``."""
        return self.plan.devices

    @property
    def virtual_engines(self) -> int:
        return self.plan.pp

    @property
    def engine_kv_capacity_tokens(self) -> int:
        """KV tokens of one virtual engine: ``⌊M/pp⌋``."""
        return self.kv_capacity_tokens // self.plan.pp


@dataclass(frozen=True)
class Stability:
    """Verdict at an arrival rate λ."""

    rate_per_s: float
    service: ServiceRate
    utilization: float  # λ/μ
    stable: bool  # λ < μ (λ > μ is unstable under any policy)
    guaranteed: bool  # λ < μ(1 − δ): stable under every work-conserving policy
    margin: float  # 1 − λ/μ, negative when unstable
    headroom_rate_per_s: float  # μ − λ

    @property
    def explanation(self) -> str:
        sv = self.service
        bound = (
            f"{sv.binding}-bound: μ = {sv.rate_per_s:.3g} req/s "
            f"(compute {sv.compute_rate_per_s:.3g}, KV memory {sv.memory_rate_per_s:.3g})"
        )
        if not sv.largest_request_fits:
            return (
                f"unstable: the largest request ({sv.moments.max_total_tokens} tokens) exceeds "
                f"the KV capacity of {sv.engine_kv_capacity_tokens} tokens"
                f"{' per virtual engine' if sv.virtual_engines > 1 else ''}; {bound}"
            )
        if not self.stable:
            return (
                f"unstable: λ = {self.rate_per_s:.3g} req/s exceeds {bound}; the queue grows "
                f"by {-self.headroom_rate_per_s:.3g} req/s"
            )
        return f"stable at utilization {self.utilization:.0%} ({self.margin:.0%} margin); {bound}"


def service_rate(
    inst: Instance,
    workload: Workload,
    *,
    kv_capacity_tokens: int | None = None,
    max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS,
    chunk_size: int | None = None,
    admission_watermark: float = DEFAULT_WATERMARK,
) -> ServiceRate:
    """The stable service rate ``μ`` of one instance (see the module docstring).

    Parameters
    ----------
    kv_capacity_tokens
        ``M``; default from ``perfmodel.memory.memory_fit`` (vLLM-like 90 % of HBM minus
        weights and the activation reserve of ``max_batched_tokens``).
    max_batched_tokens
        ``B``: token budget per iteration (vLLM ``max_num_batched_tokens``).
    chunk_size
        Largest prefill chunk of one request per iteration (vLLM
        ``long_prefill_token_threshold``); default ``B``.
    admission_watermark
        Fraction of ``M`` kept free at admission (the engine's watermark, as in
        :func:`perfmodel.simulate.simulate`).
    """
    for name, v in (("max_batched_tokens", max_batched_tokens), ("chunk_size", chunk_size)):
        if v is not None and not (isinstance(v, int | np.integer) and v >= 1):
            raise SpecError(f"{name} must be a positive integer, got {v!r}")
    B = int(max_batched_tokens)
    chunk = int(min(chunk_size or B, B))
    if kv_capacity_tokens is None:
        M = inst.kv_capacity_tokens(B)
    elif not (isinstance(kv_capacity_tokens, int | np.integer) and kv_capacity_tokens >= 1):
        raise SpecError(
            f"kv_capacity_tokens must be a positive integer, got {kv_capacity_tokens!r}"
        )
    else:
        M = int(kv_capacity_tokens)
    pp = inst.plan.pp
    M_total, M = M, M // pp  # from here on: one virtual engine
    if M < 1:
        raise SpecError(
            f"a KV capacity of {M_total} tokens cannot be split over the {pp} virtual "
            "engines of the pipeline"
        )
    if not 0 <= admission_watermark < 1:
        raise SpecError(
            f"admission watermark must be a fraction in [0, 1), got {admission_watermark}"
        )
    m = request_moments(workload.lengths, chunk)
    lengths = workload.lengths
    slack = renewal_mean_age(np.minimum(lengths.input_tokens, chunk), lengths.weights)
    m_eff = max(M - int(admission_watermark * M) - slack, 1.0)
    r_compute = B / m.tokens
    r_memory = m_eff / m.lifetime_kv_token_steps
    t = inst.iteration_s(mix_batch(np.array([r_compute, r_memory]), m))
    t_full, t_mem = float(t[0]), float(t[1])
    recompute, evicted = 0.0, 1.0
    if r_memory < r_compute:  # the cache fills before the budget: iterations are not full
        # a full cache preempts: R tokens per request are prefilled again (preemption.py);
        # an engine that reserves a request's whole KV at admission never preempts
        if inst.engine is None or inst.engine.kv_reservation == "incremental":
            recompute = recompute_tokens_per_request(
                lengths.output_tokens,
                lengths.weights,
                decode_growth_tokens=m.decode_steps,
                admission_slack_tokens=slack,
            )
        s_vals, s_w = compress_atoms(lengths.input_tokens, lengths.weights, PROMPT_BINS)
        if recompute > 0 and inst.engine is not None and inst.engine.prefix_caching:
            # a prefix cache keeps what the others' growth has not evicted (preemption.py)
            evicted = prefix_cache_evicted_fraction(
                s_vals,
                s_w,
                lengths.input_tokens + lengths.output_tokens,
                lengths.weights,
                decode_growth_tokens=m.decode_steps,
                # h: the watermark and a first chunk free beyond the victim's own blocks
                headroom_tokens=int(admission_watermark * M)
                + float(np.dot(s_w, np.minimum(s_vals, chunk)) / s_w.sum()),
            )
            recompute *= evicted
        t_mem = poisson_iteration_s(
            inst,
            s_vals,
            s_w,
            m,
            prompts_per_step=r_memory * (1.0 + recompute / m.input_tokens),
            decode_seqs=min(r_memory * m.decode_steps, B - 1.0),
            max_batched_tokens=B,
        )
    mu_c = work_conserving_capacity_tokens_per_s(B, t_full) / m.tokens
    mu_m = nie_memory_rate_per_s(m_eff, t_mem, m.lifetime_kv_token_steps)
    mu = min(mu_c, mu_m)
    delta = m.max_total_tokens / M
    return ServiceRate(
        instance=inst,
        workload=workload,
        rate_per_s=pp * mu,
        compute_rate_per_s=pp * mu_c,
        memory_rate_per_s=pp * mu_m,
        binding="compute" if mu_c <= mu_m else "memory",
        delta=delta,
        guaranteed_rate_per_s=pp * mu * max(0.0, 1.0 - delta),
        kv_capacity_tokens=M_total,
        max_batched_tokens=B,
        chunk_size=chunk,
        full_step_s=t_full,
        memory_step_s=t_mem,
        capacity_tokens_per_s=pp * B / t_full,
        moments=m,
        effective_kv_tokens=pp * m_eff,
        admission_slack_tokens=slack,
        recompute_tokens=recompute,
        recompute_evicted_fraction=evicted,
    )


@dataclass(frozen=True)
class EngineLimits:
    """The engine's sizing knobs, as a command takes them: ``M``, ``B`` and the chunk size.

    ``None`` leaves the choice to :func:`service_rate` (``M`` from the memory fit, the
    chunk equal to ``B``). The capacity and simulation answers take one of these so that
    both size the engine through the same call.
    """

    kv_capacity_tokens: int | None = None
    max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS
    chunk_size: int | None = None

    def service_rate(self, inst: Instance, workload: Workload) -> ServiceRate:
        """:func:`service_rate` of ``inst`` on ``workload`` under these limits."""
        return service_rate(
            inst,
            workload,
            kv_capacity_tokens=self.kv_capacity_tokens,
            max_batched_tokens=self.max_batched_tokens,
            chunk_size=self.chunk_size,
        )


def stability(service: ServiceRate, rate_per_s: float) -> Stability:
    """Stable iff ``λ < μ`` (and the largest request fits in the KV cache)."""
    check_rate(rate_per_s)
    mu = service.rate_per_s
    stable = rate_per_s < mu and service.largest_request_fits
    return Stability(
        rate_per_s=rate_per_s,
        service=service,
        utilization=rate_per_s / mu,
        stable=stable,
        guaranteed=rate_per_s < service.guaranteed_rate_per_s,
        margin=1.0 - rate_per_s / mu,
        headroom_rate_per_s=mu - rate_per_s,
    )


def latency(
    service: ServiceRate, rate_per_s: float, *, warm: LatencyEstimate | None = None
) -> LatencyEstimate:
    """TTFT and TPOT (means, p50/p90/p99) at ``rate_per_s`` (see ``perfmodel.latency``);
    ``warm``: an estimate of ``service`` at a lower rate to start from (a search's).

    With ``pp`` virtual engines: those of one engine at ``rate_per_s/pp`` (its
    ``decode_batch``, ``kv_load`` and ``step_s`` are the engine's), whose arrivals are a
    random ``1/pp`` thinning of the instance's: inter-arrival CV² ``1 + (c² − 1)/pp``.
    """
    st = stability(service, rate_per_s)
    pp = service.plan.pp
    est = estimate_latency(
        service.instance,
        service.workload.lengths,
        service.moments,
        rate_per_s=rate_per_s / pp,
        # the memory queue's servers are the usable KV (M_eff), as in the memory bound
        kv_capacity_tokens=max(
            1, int((service.effective_kv_tokens or service.kv_capacity_tokens) / pp)
        ),
        max_batched_tokens=service.max_batched_tokens,
        # each engine gets a random 1/pp of a renewal stream: a thinned renewal process,
        # CV² = 1 + (c² − 1)/pp (Poisson stays Poisson)
        arrival_cv=math.sqrt(1.0 + (service.workload.arrival_cv**2 - 1.0) / pp),
        full_step_s=service.full_step_s,
        stable=st.stable,
        warm=warm,
    )
    return est if pp == 1 else replace(est, rate_per_s=rate_per_s)
