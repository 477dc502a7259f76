"""Latency of one serving instance under load: TTFT and TPOT means and percentiles.

Continuous batching with a token budget ``B`` per iteration and chunked prefill
(chunks of at most ``C``), FIFO admission, KV capacity ``M`` tokens. All step times come
from ``perfmodel.step.step_time``. The model, at arrival rate ``λ``:

* **Iteration mix.** The prompt tokens waiting at the start of each iteration form the
  Markov chain of :mod:`perfmodel.prefill_chain`: an iteration carries the ``n_d``
  decodes and up to ``B' = B − n_d`` prompt tokens from the front of the FIFO, lasts
  ``τ(P)``, and the prompts that arrive meanwhile (Poisson) wait for the next one. Its
  stationary law gives the mean iteration ``b̄ = E_π[τ]``. The decode population comes
  from Little's law twice (see :func:`operating_point`): ``n_d = λ·b̄·E[o − 1]/P(busy)``
  per iteration, ``N̄ = λ·E[(o − 1)·TPOT]`` in time, ``P(busy) = 1 − exp(−(N̄ +
  λ·E[TTFT]))`` (residents as in M/G/∞); solved as a nested fixed point (``N̄`` on each
  chain, ``n_d`` by a bracketed secant: :func:`operating_point`).
* **TTFT** (Palm calculus on the chain): the residual ``E_π[τ²]/(2E_π[τ])`` of the
  iteration in progress (times ``P(busy)``), the full iterations spent on the prompt
  tokens ahead of the request, and the iteration that emits its first token — which also
  carries the prompts that arrived with it. KV memory: the M/M/c (Erlang C) wait of the
  previous model, ``c = M / m̄`` slots of the mean resident footprint
  ``m̄ = E[g]/E[iterations]``, holding time ``b̄·E[iterations]``, is added. With chunks
  ``C < B'`` a prompt needs ``⌈s/C⌉`` iterations even alone: the difference between its
  lone prefill in chunks of ``C`` and of ``B'`` is added (the chain itself lets a prompt
  use the whole budget).
* **TPOT.** A request's ``n = o − 1`` decode steps are the ``n`` iterations after its
  last prefill iteration, so its TPOT is ``(1/n)·Σ_{j≤n} E_j`` with ``E_j`` the mean step
  time ``j`` iterations after it (from the chain started at the state it leaves behind:
  the prompts that queued during its own wait). Short outputs see mostly these
  prefill-heavy iterations; long ones the stationary ``E_π[τ₊]`` (``τ₊``: ``N̄ + 1``
  decodes, the request and the others).
* **Percentiles** (approximations): TTFT is the request's lone prefill ``D(s)`` (over the
  prompt-length atoms) plus the residual ``R`` of the iteration in progress (a Gamma with
  the chain's first two residual moments, when busy) plus a queueing delay that is
  positive with probability ``ρ_p`` (the engine-time fraction of prompt work, as the
  M/G/1 wait is positive with probability ``ρ``; or the KV wait's Erlang C), then
  exponential, with the mean above. TPOT is the decode-only step plus a Gamma extra
  with the mean above and the variance of the request's ``n`` consecutive iterations:
  the chain's autocovariance (a long iteration lets more prompts in, so the next is long
  too) and the spread of the state it starts decoding in, mixed over ``n``. Against the
  simulator: p90 TTFT and TPOT within 9 % at ρ ≤ 0.7 on chat and code
  (``benchmarks/validate_percentiles.py``; the per-prompt Poisson variance
  ``λ·b̄·E[Δ²]/n`` used before was 14-36 % short).
* **Bursty arrivals** (renewal, inter-arrival CV ``c_a``): the TTFT delay caused by other
  prompts is scaled by ``(c_a² + 1)/2`` (Allen–Cunneen); the chain itself is Poisson.

Approximations, stated once: ``n_d`` is its mean; the prompt lengths of a request are
independent of its output length; preemptions and the decode-batch fluctuations are
ignored (the latter adds a slowly-decaying TPOT variance the chain lacks, visible for
outputs of ~1,000 tokens); with ``C < B'`` the iteration mix is computed as if ``C = B'``.
The simulator (:mod:`perfmodel.simulate`) measures what this neglects
(``benchmarks/validate_queueing.py``, ``tests/test_latency_vs_sim.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property

import numpy as np
from numpy.typing import NDArray

from perfmodel.serving.classic_queues import erlang_c
from perfmodel.serving.latency_laws import (
    Mixture,
    sum_ctx_sq,
    tpot_mixture,
    ttft_mixture,
    window_variance_factor,
)
from perfmodel.serving.operating_point import OperatingPoint, operating_point
from perfmodel.serving.prefill_chain import PromptLaw, prompt_law
from perfmodel.serving.servemix import (
    PROMPT_BINS,
    RequestMoments,
    compress_atoms,
    decode_sensitivities,
    lumped_iteration,
    noise_coefficient,
)
from perfmodel.serving.tagged import decode_variance
from perfmodel.step.instance import Instance
from perfmodel.workload.lengths import LengthDistribution

Arr = NDArray[np.float64]


PERCENTILES = (0.5, 0.9, 0.99)


@dataclass(frozen=True)
class _LengthAtoms:
    """What the model takes from a length distribution (the same at every rate)."""

    prompts: PromptLaw
    decode_steps: Arr  # atoms of o − 1
    decode_weights: Arr
    prompt_tokens: Arr  # ≤ PROMPT_BINS prompt atoms
    prompt_weights: Arr
    ctx_sq_tokens2: float  # E[Σ_{j≤o−1} (s + j − 1)²]: for the decode-batch noise


#: the percentiles of the latency tables (p50, p90, p99)
TABLE_PERCENTILES = (0.5, 0.9, 0.99)

_ATOMS: dict[int, tuple[LengthDistribution, _LengthAtoms]] = {}
_ATOMS_KEPT = 16


def _length_atoms(lengths: LengthDistribution) -> _LengthAtoms:
    """:class:`_LengthAtoms` of ``lengths``, computed once per distribution object (a
    search evaluates the same workload at dozens of rates; a trace has 10⁵ atoms)."""
    hit = _ATOMS.get(id(lengths))
    if hit is not None and hit[0] is lengths:
        return hit[1]
    prompts = prompt_law(lengths)
    n_all, w_all = compress_atoms(lengths.output_tokens - 1, lengths.weights, PROMPT_BINS * 2)
    s_vals, s_w = compress_atoms(prompts.tokens, prompts.weights, PROMPT_BINS)
    n_steps = np.maximum(lengths.output_tokens - 1, 0)
    ctx_sq = float(lengths.weights @ sum_ctx_sq(lengths.input_tokens, n_steps))
    atoms = _LengthAtoms(prompts, n_all, w_all, s_vals, s_w, ctx_sq)
    if len(_ATOMS) >= _ATOMS_KEPT:
        _ATOMS.pop(next(iter(_ATOMS)))
    _ATOMS[id(lengths)] = (lengths, atoms)
    return atoms


@dataclass(frozen=True)
class LatencyEstimate:
    """Steady-state latency at one arrival rate (``inf`` when the queue is unbounded)."""

    rate_per_s: float
    stable: bool
    step_s: float  # mean iteration time b̄
    decode_batch: float  # mean decoding requests per iteration
    kv_load: float  # λ·b̄·E[g]/M: mean KV occupancy over capacity
    prefill_load: float  # 1 − t₀/b̄: fraction of engine time due to prompt tokens
    prefill_wait_s: float  # TTFT beyond the lone prefill D(s), except the KV wait
    memory_wait_s: float
    ttft_mean_s: float
    e2e_mean_s: float
    _ttft: Mixture
    #: the TPOT law, or what computes it when first read: a goodput search whose TTFT
    #: misses at a rate decides that rate without it (its variance is a chain product
    #: per lag)
    _tpot_law: Mixture | Callable[[], Mixture] = field(repr=False, compare=False)
    prefill_iteration_fraction: float = 1.0  # iterations carrying prompt tokens: 1 − π(0)
    full_iteration_fraction: float = 1.0  # iterations whose prompt tokens fill B − n_d
    first_decode_step_s: float = math.inf  # E[τ₊] of a request's first decode iteration
    point: OperatingPoint | None = field(default=None, repr=False, compare=False)

    @cached_property
    def _tpot(self) -> Mixture:
        law = self._tpot_law
        return law if isinstance(law, Mixture) else law()

    @property
    def tpot_mean_s(self) -> float:
        return self._tpot.mean()

    # The percentiles are computed when first read: a goodput search reads only the CDFs
    # at the SLO targets of most of the rates it tries. A table's three are searched
    # together when one of them is first read (one search of three quantiles).
    @cached_property
    def _ttft_table_s(self) -> list[float]:
        return self._ttft.quantiles(TABLE_PERCENTILES)

    @cached_property
    def _tpot_table_s(self) -> list[float]:
        return self._tpot.quantiles(TABLE_PERCENTILES)

    @property
    def ttft_p50_s(self) -> float:
        return self._ttft_table_s[0]

    @property
    def ttft_p90_s(self) -> float:
        return self._ttft_table_s[1]

    @property
    def ttft_p99_s(self) -> float:
        return self._ttft_table_s[2]

    @property
    def tpot_p50_s(self) -> float:
        return self._tpot_table_s[0]

    @property
    def tpot_p90_s(self) -> float:
        return self._tpot_table_s[1]

    @property
    def tpot_p99_s(self) -> float:
        return self._tpot_table_s[2]

    def ttft_quantile_s(self, q: float) -> float:
        return self._ttft.quantile(q)

    def tpot_quantile_s(self, q: float) -> float:
        return self._tpot.quantile(q)

    def ttft_cdf(self, x_s: float) -> float:
        return self._ttft.cdf(x_s)

    def tpot_cdf(self, x_s: float) -> float:
        return self._tpot.cdf(x_s)


def estimate_latency(
    inst: Instance,
    lengths: LengthDistribution,
    moments: RequestMoments,
    *,
    rate_per_s: float,
    kv_capacity_tokens: int,
    max_batched_tokens: int,
    arrival_cv: float = 1.0,
    full_step_s: float,
    stable: bool = True,
    warm: LatencyEstimate | None = None,
) -> LatencyEstimate:
    """TTFT/TPOT at ``rate_per_s`` (see the module docstring for the model).

    ``full_step_s`` (the iteration time at a full token budget, from
    ``queueing.service_rate``) is kept for callers; the chain computes its own.
    ``stable=False`` (the rate is at or above the service rate) returns unbounded
    latencies without evaluating the model. ``warm``: an estimate of the same instance
    and workload at a lower rate, where the operating point's iteration starts (see
    :func:`operating_point`; the answer is the same to its tolerance).
    """
    lam = rate_per_s
    B = max_batched_tokens
    M = kv_capacity_tokens
    m = moments
    if not stable:
        return _unbounded(lam)
    atoms = _length_atoms(lengths)
    prompts, n_all, w_all = atoms.prompts, atoms.decode_steps, atoms.decode_weights
    op = operating_point(
        inst,
        prompts,
        m,
        rate_per_s=lam,
        max_batched_tokens=B,
        decode_steps=n_all,
        decode_weights=w_all,
        max_steps=int(lengths.output_tokens.max()) - 1,
        warm=None if warm is None else warm.point,
    )
    if op is None:
        return _unbounded(lam)
    chain, tag = op.chain, op.tagged
    b = chain.mean_step_s
    n_d = chain.decode_seqs
    s_vals, s_w = atoms.prompt_tokens, atoms.prompt_weights
    it = lumped_iteration(inst, s_vals, m, decode_seqs=n_d, max_batched_tokens=B)
    d_s = it.prompt_s
    # KV memory (Erlang C over mean-footprint slots).
    hold_s = b * m.iterations
    slots = M * m.iterations / m.lifetime_kv_token_steps
    offered = lam * hold_s
    kv_load = offered / slots
    c_mem = erlang_c(slots, offered)
    w_m = c_mem * hold_s / (max(int(slots), 1) - offered) if offered < int(slots) else math.inf
    if not math.isfinite(w_m):
        return _unbounded(lam)
    mean_d = float(np.dot(s_w, d_s))
    if m.chunk < chain.budget_tokens:  # the lone prompt's extra iterations with chunks of C
        whole = lumped_iteration(
            inst,
            s_vals,
            replace(m, chunk=B),
            decode_seqs=n_d,
            max_batched_tokens=B,
        )
        chunking = max(mean_d - float(np.dot(s_w, whole.prompt_s)), 0.0)
    else:
        chunking = 0.0
    p_busy = op.busy
    residual = p_busy * tag.residual_s
    # delay caused by the other prompts: those ahead, and those sharing its iteration
    others = max(tag.full_wait_s + tag.last_prefill_s + chunking - mean_d, 0.0)
    others *= (arrival_cv**2 + 1) / 2  # bursty arrivals (Allen–Cunneen)
    ttft = ttft_mixture(
        s_w, d_s, chain, p_busy=p_busy, others_s=others, memory_wait_s=w_m, c_mem=c_mem
    )
    n_pos = np.maximum(n_all, 1.0)
    noise = n_pos**2 * _batch_noise(inst, atoms, m, lam, op.decoders, n_pos, w_all)
    law = _TpotLaw(op, n_all, w_all, noise)
    _, p_multi, e2e_decode_s = law.mixture(np.zeros(n_all.size))  # the E2E mean: no variance
    ttft_mean = ttft.mean()
    return LatencyEstimate(
        rate_per_s=lam,
        stable=True,
        step_s=b,
        decode_batch=n_d,
        kv_load=kv_load,
        prefill_load=1.0 - float(chain.step_s[0]) / b,
        prefill_wait_s=residual + others,
        memory_wait_s=w_m,
        ttft_mean_s=ttft_mean,
        e2e_mean_s=ttft_mean + p_multi * e2e_decode_s,
        _ttft=ttft,
        _tpot_law=law,
        prefill_iteration_fraction=chain.prefill_fraction,
        full_iteration_fraction=chain.full_fraction,
        first_decode_step_s=float(tag.decode_step_s[0]),
        point=op,
    )


@dataclass(frozen=True)
class _TpotLaw:
    """The TPOT mixture of one estimate, computed when called: the chain's part of each
    atom's decode-time variance then (:func:`decode_variance`, a chain product per lag),
    the decode-batch noise given. Picklable, and holds only the operating point beyond
    the atoms: an estimate may be cached on disk before its TPOT law is read."""

    op: OperatingPoint
    n_all: Arr  # atoms of o − 1
    w_all: Arr
    noise_s2: Arr  # the decode-batch noise's variance per atom (:func:`_batch_noise`·n²)

    def mixture(self, var_n: Arr) -> tuple[Mixture, float, float]:
        """:func:`tpot_mixture` with the variance ``var_n`` of each atom's decode time."""
        op = self.op
        return tpot_mixture(op.tpot_s, self.n_all, self.w_all, op.decode_step_s, var_n)

    def __call__(self) -> Mixture:
        op, n_pos = self.op, np.maximum(self.n_all, 1.0)
        var_n = decode_variance(op.chain, op.tagged.start_law, op.decode_step_s, n_pos)
        return self.mixture(var_n + self.noise_s2)[0]


def _batch_noise(
    inst: Instance,
    atoms: _LengthAtoms,
    m: RequestMoments,
    lam: float,
    decoders: float,
    steps: Arr,
    weights: Arr,
) -> Arr:
    """Variance of a request's mean decode step from the decoding population ``N``.

    The chain holds ``N`` at its mean; ``N`` fluctuates, slowly (its members stay for
    hundreds of steps), and each member adds ``∂τ/∂N + ∂τ/∂K·ctx`` (its KV read) to
    every step: ``Var = Var N · window share · E[(∂τ/∂N + ∂τ/∂K·ctx)²]``
    (:func:`window_variance_factor`, contexts step-weighted as in the decode instance
    model). A member slows every step, so the population is that of a processor-sharing
    server, negative binomial for a linear step: ``Var N = N̄/(1 − ρ_b)``,
    ``ρ_b = λ·E[o − 1]·∂τ/∂N``. Matters where the per-sequence cost is a large share of
    the step (L40S: 0.3 ms per decoder of Llama-3.1-8B on a 23 ms step)."""
    ctx = m.decode_context_tokens / max(m.decode_steps, 1e-12)
    dn, dk = decode_sensitivities(inst, decoders, ctx)
    var_coef = noise_coefficient(dn, dk, ctx, atoms.ctx_sq_tokens2 / max(m.decode_steps, 1e-12))
    rho_b = min(lam * m.decode_steps * (dn + dk * ctx), 0.95)
    var_pop = decoders / (1.0 - max(rho_b, 0.0))
    return np.asarray(var_pop * window_variance_factor(steps, weights) * var_coef)


def _unbounded(lam: float) -> LatencyEstimate:
    inf = math.inf
    z = np.zeros(1)
    mix = Mixture(z + 1, z, z, z + 1, z, unbounded=True)
    return LatencyEstimate(lam, False, inf, inf, inf, inf, inf, inf, inf, inf, mix, mix)
