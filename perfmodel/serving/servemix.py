"""The average iteration of continuous batching with chunked prefill, per unit of throughput.

If an engine completes ``r`` requests per iteration in steady state, every iteration
carries on average ``r`` times each request's per-iteration share of work: its prompt
tokens, its ``o − 1`` decode steps (the prefill emits the first token), the causal
attention pairs of its prompt (``s(s+1)/2`` whatever the chunking), the KV its chunks
and decode steps read, and its prefill chunks. :func:`mix_batch` turns ``r`` into the
``Batch`` that ``perfmodel.step.step_time`` costs: averaging the *features* of the
iterations. That is right when every iteration is alike — a full token budget, as at
the compute bound.

When iterations are not full (KV-memory bound, moderate load) prompts are not spread
thinly over all iterations: each arrives as whole chunks in a few of them, next to the
decodes. :func:`lumped_iteration` averages the *times* instead: with ``n_d`` decoding
requests, a decode-only iteration takes ``t₀ = t(n_d)``, and a prompt of ``s`` tokens
adds ``Δ(s) = Σ_chunks [t(n_d + chunk) − t₀]`` (each chunk of ``min(C, B − n_d)`` tokens
alone with the decodes). If ``r`` prompts start per iteration, the mean iteration lasts
``t₀ + r·E[Δ(s)]``. Step time is a max of affine terms in the tokens (roofline, tile
padding), so by Jensen's inequality the mean of the times is at least the time of the
mean batch; the gap is large when a lone prompt turns a memory-bound decode step into
a compute-bound one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from perfmodel.errors import SpecError
from perfmodel.serving.classic_queues import lifetime_kv_token_steps, prefill_kv_token_steps
from perfmodel.serving.poisson import poisson_ppf
from perfmodel.step.batch import Batch
from perfmodel.step.instance import Instance
from perfmodel.workload.lengths import LengthDistribution, distinct_weights

Arr = NDArray[np.float64]
PROMPT_BINS = 48  # prompt-length atoms kept by the per-prompt iteration model
# Admission watermark: the engine admits a request only while the KV in use stays below
# (1 − watermark)·M (vLLM V0 block manager, ``watermark=0.01``); shared by the simulator
# and the memory bound.
DEFAULT_WATERMARK = 0.01


@dataclass(frozen=True)
class RequestMoments:
    """Per-request expectations under a length distribution and a prefill chunk size."""

    chunk: int
    input_tokens: float  # E[s]
    decode_steps: float  # E[o − 1]
    decode_context_tokens: float  # E[Σ_j (s + j − 1)]: KV read by its decode steps
    prefill_pairs: float  # E[s(s+1)/2]
    prefill_kv_read_tokens: float  # E[Σ_chunks (context + chunk)]
    prefill_chunks: float  # E[⌈s/C⌉]
    lifetime_kv_token_steps: float  # E[g(s, o)]
    max_total_tokens: int  # ess sup (s + o)
    input_cv: float  # std(s)/E[s]

    @property
    def tokens(self) -> float:
        """Tokens through the model per request: ``E[s] + E[o] − 1``."""
        return self.input_tokens + self.decode_steps

    @property
    def iterations(self) -> float:
        """Iterations a request is resident if never delayed: chunks + decode steps."""
        return self.prefill_chunks + self.decode_steps


def request_moments(lengths: LengthDistribution, chunk: int) -> RequestMoments:
    """Exact expectations over the atoms of ``lengths`` with prefill chunk ``chunk``."""
    if not (isinstance(chunk, int | np.integer) and chunk >= 1):
        raise SpecError(f"chunk size must be a positive integer, got {chunk!r}")
    c = int(chunk)
    e = lengths.expect
    mean_s = e(lambda s, o: s)
    var_s = max(e(lambda s, o: s * s) - mean_s**2, 0.0)
    return RequestMoments(
        chunk=c,
        input_tokens=mean_s,
        decode_steps=e(lambda s, o: o - 1),
        decode_context_tokens=e(lambda s, o: (o - 1) * s + (o - 1) * (o - 2) / 2),
        prefill_pairs=e(lambda s, o: s * (s + 1) / 2),
        prefill_kv_read_tokens=e(lambda s, o: prefill_kv_token_steps(s, c)),
        prefill_chunks=e(lambda s, o: np.ceil(s / c)),
        lifetime_kv_token_steps=e(lambda s, o: lifetime_kv_token_steps(s, o, c)),
        max_total_tokens=lengths.max_total_tokens,
        input_cv=float(np.sqrt(var_s) / mean_s),
    )


def mix_batch(requests_per_step: ArrayLike, m: RequestMoments) -> Batch:
    """The average iteration when ``requests_per_step`` requests complete per iteration."""
    r = np.asarray(requests_per_step, dtype=np.float64)
    return Batch(
        prefill_tokens=r * m.input_tokens,
        prefill_seqs=r * m.prefill_chunks,
        prefill_pairs=r * m.prefill_pairs,
        prefill_kv_read=r * m.prefill_kv_read_tokens,
        decode_seqs=r * m.decode_steps,
        decode_context=r * m.decode_context_tokens,
    )


def decode_batch(requests_per_step: ArrayLike, m: RequestMoments) -> Batch:
    """Only the decode part of :func:`mix_batch` (the iterations without a prefill chunk)."""
    r = np.asarray(requests_per_step, dtype=np.float64)
    return Batch(
        prefill_tokens=np.zeros_like(r),
        prefill_seqs=np.zeros_like(r),
        prefill_pairs=np.zeros_like(r),
        prefill_kv_read=np.zeros_like(r),
        decode_seqs=r * m.decode_steps,
        decode_context=r * m.decode_context_tokens,
    )


def compress_atoms(values: NDArray[np.int64], weights: Arr, bins: int) -> tuple[Arr, Arr]:
    """At most ``bins`` (value, weight) atoms: probability-weighted means of quantile bins."""
    u, w = distinct_weights(values, weights)
    if u.size <= bins:
        return u.astype(np.float64), w.astype(np.float64)
    cdf = np.cumsum(w) - 0.5 * w
    b = np.minimum((cdf * bins).astype(int), bins - 1)
    bw = np.bincount(b, weights=w, minlength=bins)
    bv = np.bincount(b, weights=w * u, minlength=bins)
    keep = bw > 0
    return np.rint(bv[keep] / bw[keep]).astype(np.float64), bw[keep].astype(np.float64)


@dataclass(frozen=True)
class Chunks:
    """Every prefill chunk of every prompt atom: owner, tokens, cached context."""

    owner: NDArray[np.int64]
    tokens: Arr
    context: Arr


def prompt_chunks(s: Arr, chunk: Arr) -> Chunks:
    """Chunks of each prompt ``s[i]`` with chunk size ``chunk`` (same shape as ``s``)."""
    k = np.ceil(s / chunk).astype(np.int64)
    owner = np.repeat(np.arange(s.size), k)
    j = np.arange(owner.size) - np.repeat(np.cumsum(k) - k, k)
    ctx = j * chunk[owner]
    return Chunks(owner, np.minimum(chunk[owner], s[owner] - ctx), ctx.astype(float))


def decode_only(n_d: float, ctx_per_seq: float, size: int) -> Batch:
    """``size`` copies of a decode-only batch of ``n_d`` requests of mean context ``ctx``."""
    return Batch.decode(np.full(size, n_d), np.full(size, ctx_per_seq))


def decode_sensitivities(inst: Instance, decoders: float, ctx: float) -> tuple[float, float]:
    """``(∂τ/∂N, ∂τ/∂K)`` of a decode-only iteration of ``N = decoders`` requests holding
    ``K = N·ctx`` cached tokens: what one more decoder and one more cached token add.

    ``∂τ/∂N`` is the one-decoder step up from ``N``, or the one down to it where that is
    smaller: a step up that crosses a GEMM row tile (``hardware.roofline.padded_rows``:
    512 → 513 rows start a fifth 128-row tile) jumps by a whole tile's compute — 3.0 ms
    against 8 µs per decoder around it, 13 % of a compute-bound Llama-3.1-8B iteration on
    one H100 at 512 decoders — and the decode-batch noise built on it then gave a p90
    TPOT of half its mean. The step down is taken only where it is the smaller
    (otherwise the step up, to the bit)."""
    n = max(decoders, 1.0)
    k0 = n * ctx
    z = np.zeros(4)
    pts = Batch(z, z, z, z, np.array([n, n + 1, n, n - 1]), np.array([k0, k0, k0 + ctx, k0]))
    t = np.asarray(inst.iteration_s(pts))
    up, down = float(t[1] - t[0]), float(t[0] - t[3])
    dn = down if n >= 2 and up > down * (1 + 1e-9) else up
    return dn, float(t[2] - t[0]) / max(ctx, 1e-12)


def noise_coefficient(dn: float, dk: float, ctx: float, ctx_sq: float) -> float:
    """``E[(∂τ/∂N + ∂τ/∂K·c)²]`` over a member's contexts ``c`` (mean ``ctx``, mean square
    ``ctx_sq``): the variance one decoding request adds to a step per unit of ``Var N``."""
    return dn * dn + 2 * dn * dk * ctx + dk * dk * ctx_sq


@dataclass(frozen=True)
class LumpedIteration:
    """Iteration times with ``n_d`` decoders and whole prompts (see the module docstring)."""

    decode_seqs: float  # n_d
    chunk_tokens: float  # min(C, B − ⌈n_d⌉), at least 1
    decode_step_s: float  # t₀: decode-only iteration
    prompt_s: Arr  # D(s): Σ over the prompt's chunks of t(n_d + chunk), per prompt atom
    prompt_extra_s: Arr  # Δ(s) = Σ_chunks [t(n_d + chunk) − t₀] (≥ 0), per prompt atom
    chunks: Chunks  # the chunks of every prompt atom

    def mean_step_s(self, prompts_per_step: float, weights: Arr) -> float:
        """``t₀ + r·E[Δ(s)]``: mean iteration when ``r`` prompts start per iteration."""
        return self.decode_step_s + prompts_per_step * float(np.dot(weights, self.prompt_extra_s))


def lumped_iteration(
    inst: Instance,
    prompts: Arr,
    m: RequestMoments,
    *,
    decode_seqs: float,
    max_batched_tokens: int,
) -> LumpedIteration:
    """Decode-only and per-prompt iteration times with ``decode_seqs`` decoding requests.

    ``prompts`` are prompt-length atoms (e.g. from :func:`compress_atoms`); the decoders
    have the mean decode context of ``m``. All times from ``perfmodel.step.step_time``.
    """
    n_d = decode_seqs
    ctx_per_seq = m.decode_context_tokens / max(m.decode_steps, 1e-12)
    c_eff = float(min(m.chunk, max(max_batched_tokens - math.ceil(n_d), 1)))
    ch = prompt_chunks(prompts, np.full(prompts.shape, c_eff))
    dec = decode_only(n_d, ctx_per_seq, ch.tokens.size)
    per_chunk = inst.iteration_s(Batch.prefill(1, ch.tokens, ch.context) + dec)
    t0 = float(inst.iteration_s(decode_only(n_d, ctx_per_seq, 1))[0])
    d_s = np.bincount(ch.owner, weights=per_chunk, minlength=prompts.size).astype(np.float64)
    delta = np.bincount(ch.owner, weights=per_chunk - t0, minlength=prompts.size)
    return LumpedIteration(
        decode_seqs=n_d,
        chunk_tokens=c_eff,
        decode_step_s=t0,
        prompt_s=d_s,
        prompt_extra_s=np.maximum(delta.astype(np.float64), 0.0),
        chunks=ch,
    )


def poisson_iteration_s(
    inst: Instance,
    prompts: Arr,
    weights: Arr,
    m: RequestMoments,
    *,
    prompts_per_step: float,
    decode_seqs: float,
    max_batched_tokens: int,
    samples: int = 4096,
    seed: int = 0,
) -> float:
    """Mean iteration time when prompt chunks join the decodes as a Poisson stream.

    ``r = prompts_per_step`` prompts start per iteration; their chunks (of
    ``min(C, B − ⌈n_d⌉)`` tokens) arrive ``K ~ Poisson(r·E[chunks])`` per iteration, each
    drawn from the chunk distribution of the prompt atoms, next to ``Poisson(n_d)`` decodes
    (the M/G/∞ occupancy of the decode stage):
    ``b̄ = E_K[t(n_d decodes + K chunks)]``, a numerical integral over ``samples``
    iterations: ``K`` at the Poisson mid-quantiles and the chunks at the mid-quantiles of
    their distribution, grouped into iterations by a permutation with a fixed ``seed``
    (the same inputs give the same value). With ``r ≪ 1`` this is ``t₀ + r·E[Δ]`` of
    :func:`lumped_iteration`; with many prompts per iteration it tends to the mean batch
    of :func:`mix_batch`.
    """
    it = lumped_iteration(
        inst,
        prompts,
        m,
        decode_seqs=decode_seqs,
        max_batched_tokens=max_batched_tokens,
    )
    ch = it.chunks
    per_prompt = np.bincount(ch.owner, minlength=prompts.size).astype(np.float64)
    p_chunk = weights[ch.owner]
    p_chunk = p_chunk / p_chunk.sum()
    rate = prompts_per_step * float(np.dot(weights, per_prompt))
    # stratified: K at the mid-quantiles of Poisson(rate), chunks at the mid-quantiles of
    # their distribution; only the grouping of chunks into iterations is random
    k = poisson_ppf((np.arange(samples) + 0.5) / samples, rate)
    n_c = int(k.sum())
    u = (np.random.default_rng(seed).permutation(n_c) + 0.5) / max(n_c, 1)
    pick = np.minimum(np.searchsorted(np.cumsum(p_chunk), u), ch.tokens.size - 1)
    where = np.repeat(np.arange(samples), k)
    c, ctx = ch.tokens[pick], ch.context[pick]

    def per_iteration(x: Arr) -> Arr:
        return np.bincount(where, weights=x, minlength=samples).astype(np.float64)

    ctx_per_seq = m.decode_context_tokens / max(m.decode_steps, 1e-12)
    # decoding requests per iteration: the occupancy of the decode stage fed by a Poisson
    # stream of prompts is Poisson(n_d) (M/G/∞), at its mid-quantiles; a fixed n_d would
    # put every iteration on the same side of a GEMM row-tile boundary, so the mean step
    # time (and μ) would jump as n_d crosses 128·j
    n_dec = poisson_ppf((np.arange(samples) + 0.5) / samples, decode_seqs).astype(np.float64)
    n_dec = np.minimum(np.random.default_rng(seed + 1).permutation(n_dec), max_batched_tokens - 1)
    batch = Batch(
        prefill_tokens=per_iteration(c),
        prefill_seqs=k.astype(np.float64),
        prefill_pairs=per_iteration(c * ctx + c * (c + 1) / 2),
        prefill_kv_read=per_iteration(ctx + c),
        decode_seqs=n_dec,
        decode_context=n_dec * ctx_per_seq,
    )
    return float(inst.iteration_s(batch).mean())
