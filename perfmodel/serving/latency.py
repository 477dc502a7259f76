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
  λ·E[TTFT]))`` (residents as in M/G/∞); solved as a fixed point with secant steps.
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
  prompt-length atoms) plus a wait that is 0 with probability
  ``(1 − P(busy))(1 − C_mem)`` and otherwise exponential, with the mean above; TPOT is the
  decode-only step plus a Gamma extra with the mean above and variance
  ``λ·b̄·E[Δ²]/n`` (``Δ(s)``: a prompt's extra iteration time), mixed over ``n``.
* **Bursty arrivals** (renewal, inter-arrival CV ``c_a``): the TTFT delay caused by other
  prompts is scaled by ``(c_a² + 1)/2`` (Allen–Cunneen); the chain itself is Poisson.

Approximations, stated once: ``n_d`` is its mean; the prompt lengths of a request are
independent of its output length; preemptions and the decode-batch fluctuations are
ignored; with ``C < B'`` the iteration mix is computed as if ``C = B'``.
The simulator (:mod:`perfmodel.simulate`) measures what this neglects
(``benchmarks/validate_queueing.py``, ``tests/test_latency_vs_sim.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import NDArray
from scipy.special import gammainc

from perfmodel.serving.classic_queues import erlang_c
from perfmodel.serving.operating_point import operating_point
from perfmodel.serving.prefill_chain import PromptLaw, prompt_law
from perfmodel.serving.servemix import (
    PROMPT_BINS,
    RequestMoments,
    compress_atoms,
    lumped_iteration,
)
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
    atoms = _LengthAtoms(prompts, n_all, w_all, s_vals, s_w)
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
    prefill_iteration_fraction: float = 1.0  # iterations carrying prompt tokens: 1 − π(0)
    full_iteration_fraction: float = 1.0  # iterations whose prompt tokens fill B − n_d
    first_decode_step_s: float = math.inf  # E[τ₊] of a request's first decode iteration

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
        # Gamma(shape, scale) CDF = regularized lower incomplete gamma P(shape, y/scale)
        inner = np.where(
            self.scale > 0,
            gammainc(self.shape, np.maximum(y, 0.0) / np.maximum(self.scale, 1e-300)),
            1.0,
        )
        f = np.where(y < 0, 0.0, (1 - self.p) + self.p * inner)
        return float(np.dot(self.weights, f))

    def quantile(self, q: float) -> float:
        if self.unbounded:
            return math.inf
        lo = float(self.base.min())
        hi = float(self.base.max() + 50 * max(float((self.shape * self.scale).max()), 1e-9))
        while hi - lo > 1e-9 * max(hi, 1e-9):  # ~40 halvings
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
) -> LatencyEstimate:
    """TTFT/TPOT at ``rate_per_s`` (see the module docstring for the model).

    ``full_step_s`` (the iteration time at a full token budget, from
    ``queueing.service_rate``) is kept for callers; the chain computes its own.
    ``stable=False`` (the rate is at or above the service rate) returns unbounded
    latencies without evaluating the model.
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
    )
    if op is None:
        return _unbounded(lam)
    chain, tag, tau_plus = op.chain, op.tagged, op.decode_step_s
    b = chain.mean_step_s
    n_d = chain.decode_seqs
    s_vals, s_w = atoms.prompt_tokens, atoms.prompt_weights
    it = lumped_iteration(inst, s_vals, m, decode_seqs=n_d, max_batched_tokens=B)
    d_s, delta = it.prompt_s, it.prompt_extra_s
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
    w_total = residual + others + w_m
    p_wait = 1 - (1 - p_busy) * (1 - c_mem)
    theta = w_total / p_wait if p_wait > 0 else 0.0
    ttft = _Mixture(
        weights=s_w,
        base=d_s,
        p=np.full(s_w.shape, p_wait if w_total > 0 else 0.0),
        shape=np.ones_like(s_w),
        scale=np.full(s_w.shape, theta),
    )
    tpot, p_multi, e2e_decode_s = _tpot_mixture(
        op.tpot_s, n_all, w_all, tau_plus, lam * b * float(np.dot(s_w, delta**2))
    )
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
        ttft_p50_s=ttft.quantile(0.5),
        ttft_p90_s=ttft.quantile(0.9),
        ttft_p99_s=ttft.quantile(0.99),
        tpot_mean_s=tpot.mean(),
        tpot_p50_s=tpot.quantile(0.5),
        tpot_p90_s=tpot.quantile(0.9),
        tpot_p99_s=tpot.quantile(0.99),
        e2e_mean_s=ttft_mean + p_multi * e2e_decode_s,
        _ttft=ttft,
        _tpot=tpot,
        prefill_iteration_fraction=chain.prefill_fraction,
        full_iteration_fraction=chain.full_fraction,
        first_decode_step_s=float(tag.decode_step_s[0]),
    )


def _tpot_mixture(
    tpot_s: Arr, n_all: Arr, w_all: Arr, tau_plus: Arr, var_per_step_s2: float
) -> tuple[_Mixture, float, float]:
    """TPOT as a mixture over output lengths: the first decode step plus a Gamma excess.

    ``var_per_step_s2`` is ``λ·b̄·E[Δ²]``, the variance the prompts joining a decode
    iteration add to it. Returns the mixture, ``P(o ≥ 2)`` and the mean decode time of a
    request with a TPOT (for the E2E mean).
    """
    keep = n_all >= 1
    p_multi = float(w_all[keep].sum())  # P(o >= 2): requests that have a TPOT
    if p_multi <= 0:  # every request emits one token: no decode step (TPOT 0, E2E = TTFT)
        keep, p_multi = n_all >= 0, 0.0
    n_vals, n_w = np.maximum(n_all[keep], 1.0), w_all[keep] / max(p_multi, 1e-300)
    tpot_n = tpot_s[keep]
    t0_seen = float(tau_plus[0])
    ex_mean = np.maximum(tpot_n - t0_seen, 0.0)
    ex_var = var_per_step_s2 / n_vals
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
    if p_multi <= 0:
        z = np.zeros(1)
        tpot = _Mixture(weights=z + 1, base=z, p=z, shape=z + 1, scale=z)
    return tpot, p_multi, float(np.dot(n_w, n_vals * (t0_seen + ex_mean)))


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
