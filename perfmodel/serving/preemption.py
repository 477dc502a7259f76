"""Recompute preemption in a full KV cache: how many prompt tokens are computed twice.

When the KV cache is the binding resource, an engine that reserves KV incrementally
(vLLM: blocks as a request grows) runs with the cache full. Memory comes back only when
a request completes; in between, every decoding request appends one token per
iteration. If that growth outruns the free space before the next completion, the
engine preempts the most recently admitted running request, frees its KV and later
recomputes it as a new prompt (vLLM ``preemption_mode = "recompute"``; V1 always
recomputes). The tokens it held are prefilled twice.

**The race.** Between two completions the decoders grow by ``X`` tokens. Completions of
a saturated engine are the departures of many requests at different ages, close to a
Poisson stream: one per ``1/r`` iterations (``r`` completions per iteration), while
``n_d = r·E[o − 1]`` requests decode (Little), so ``X = n_d·T`` with ``T`` exponential is
exponential with mean ``m = E[o − 1]`` tokens. The free space ``S`` at the start of the
gap is what the completing request leaves after the next prompt takes its place: the
replacement reuses the prompt's share, leaving the completed request's ``o`` decoded
tokens, and never less than the slack FIFO admission leaves (``a = E[c²]/(2E[c])``, the
renewal mean age of the first chunks: :func:`perfmodel.serving.classic_queues.renewal_mean_age`),
so ``S = max(o, a)``. The shortfall ``(X − S)⁺`` is freed by preemption and recomputed;
per completion, i.e. per request, with ``X ~ Exp(m)`` (memoryless):

    R = E[(X − S)⁺] = m · E_o[exp(−max(o, a)/m)]      tokens per request.

The recompute passes are prefill work like the prompts (they go through the same
chunks), so the memory-bound iteration time ``b̄`` is taken with ``1 + R/E[s]`` prompt
passes per request (:func:`perfmodel.serving.service.service_rate`); the KV they hold
while they ramp up again is ``~x²/(2C)`` per pass, negligible against ``E[g]``.

Against the simulator (which preempts the newest request and recomputes it in full,
``perfmodel.sim``): Llama-3-8B, ``M`` = 131,000, ``C = B`` = 512, ``s, o ~ U(10, 1600)``
and the 2:1 / 1:2 splits: ``R`` = 332 / 211 / 451 tokens against 316 / 245 / 402
simulated. Not modelled: several first chunks admitted at once when the budget is much
larger than the chunk (``B`` = 2048, ``C`` = 512: 563 simulated, more than this gives)
and the lumpiness of small caches (a few tens of requests), where both under-estimate;
a prefix cache makes the real recompute smaller than this full recompute (below).

**With a prefix cache** (vLLM V1, ``enable_prefix_caching`` on by default) a preempted
request's blocks keep their hashes in the free queue, an LRU list: allocations pop its
head, freed blocks join its tail, a request's in reverse order (its tail is evicted
first, so what survives is a prefix), and a re-admitted request takes its surviving
prefix back (``docs/design/prefix_caching.md``; :mod:`perfmodel.sim.prefix_cache`). The
preemption happened because the free queue was empty, so the victim's blocks are at its
head: every token the running requests grow by from then on evicts one of the victim's,
until it is re-admitted. It is re-admitted (it heads the waiting queue) at the first
completion after which the free space beyond its own blocks covers the watermark and a
first chunk, ``h = ⌊w·M⌋ + E[min(s, C)]``; completions free ``L = s + o`` tokens each, so
that is the ``K``-th completion, ``K = min{k : L₁ + … + L_k ≥ h}``. The growth until then
is ``K`` independent ``Exp(m)`` gaps, ``G ~ Gamma(K, m)``. A victim is the most recently
admitted request, which holds about its prompt, ``x ≈ s``; it loses ``min(x, G)``:

    φ = E_s[E_K[E[min(s, G_K)]]] / E[s],   E[min(x, Gamma(k, m))] = k·m·P(k+1, x/m) + x·Q(k, x/m)

(``P``, ``Q`` the regularized incomplete gamma functions; ``k = 1``: ``m(1 − e^{−x/m})``),
and ``φ·R`` tokens per request are recomputed. No fitted parameter. Nie–Si–Zhou
(``M`` = 131,000, ``C`` = 512, ``w`` = 0.01, 1:1 / 2:1 / 1:2): ``φ`` = 0.73 / 0.54 / 0.85
against 0.70 / 0.44 / 0.85 in the simulator with its prefix cache (3,000 requests;
the simulator's victims hold more than their prompt, about 1.2·E[s], which this ``x ≈ s``
leaves out and so over-states ``φ`` a little).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from perfmodel.errors import SpecError
from perfmodel.special import gammainc


def recompute_tokens_per_request(
    output_tokens: ArrayLike,
    weights: ArrayLike,
    *,
    decode_growth_tokens: float,
    admission_slack_tokens: float,
) -> float:
    """``R = m·E_o[exp(−max(o, a)/m)]``: tokens recomputed per request (module docstring).

    ``decode_growth_tokens`` is ``m = E[o − 1]`` (mean decode growth between two
    completions), ``admission_slack_tokens`` the FIFO admission slack ``a``.
    """
    o = np.asarray(output_tokens, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    if o.shape != w.shape or o.size == 0 or np.any(w < 0) or w.sum() <= 0:
        raise SpecError("output lengths and weights must be equal-length, non-negative arrays")
    if not (decode_growth_tokens >= 0 and admission_slack_tokens >= 0):
        raise SpecError("decode growth and admission slack must be non-negative token counts")
    m = float(decode_growth_tokens)
    if m == 0:  # single-token outputs: nothing grows between completions
        return 0.0
    free = np.maximum(o, float(admission_slack_tokens))
    return m * float(np.dot(w, np.exp(-free / m)) / w.sum())


#: resolution of the distribution of ``L₁ + … + L_k`` below the headroom (grid cells)
_HEADROOM_CELLS = 512


def completions_until_headroom(
    freed_tokens: ArrayLike, weights: ArrayLike, headroom_tokens: float
) -> np.ndarray:
    """``P(K = k)`` for ``k = 1, 2, …``: ``K`` is the first ``k`` with ``L₁+…+L_k ≥ h``.

    ``L`` (tokens freed by a completion) has the atoms ``freed_tokens`` with ``weights``;
    the partial sums are tracked on a grid of :data:`_HEADROOM_CELLS` cells below ``h``.
    """
    L = np.asarray(freed_tokens, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    if L.shape != w.shape or L.size == 0 or np.any(w < 0) or w.sum() <= 0 or np.any(L <= 0):
        raise SpecError("freed lengths must be positive and their weights non-negative")
    if not headroom_tokens > 0:
        return np.ones(1)
    cell = headroom_tokens / _HEADROOM_CELLS
    # a length lands in the cell of its floor: sums that reach h exactly count as reached
    idx = np.minimum(np.floor(L / cell).astype(np.int64), _HEADROOM_CELLS)
    step = np.bincount(idx, weights=w, minlength=_HEADROOM_CELLS + 1) / w.sum()
    below = step[:_HEADROOM_CELLS]  # P(L₁ < h) spread over the cells
    p = [1.0 - below.sum()]
    while below.sum() > 1e-12 and len(p) < 100_000:
        nxt = np.convolve(below, step)[:_HEADROOM_CELLS]
        p.append(below.sum() - nxt.sum())
        below = nxt
    return np.asarray(p)


def prefix_cache_evicted_fraction(
    victim_tokens: ArrayLike,
    victim_weights: ArrayLike,
    freed_tokens: ArrayLike,
    freed_weights: ArrayLike,
    *,
    decode_growth_tokens: float,
    headroom_tokens: float,
) -> float:
    """``φ``: the share of a preempted request's KV a prefix cache loses before it is
    re-admitted (module docstring), for victims holding ``victim_tokens``."""
    x = np.asarray(victim_tokens, dtype=np.float64)
    wx = np.asarray(victim_weights, dtype=np.float64)
    if x.shape != wx.shape or x.size == 0 or np.any(wx < 0) or wx.sum() <= 0 or np.any(x <= 0):
        raise SpecError("victim lengths must be positive and their weights non-negative")
    m = float(decode_growth_tokens)
    if not m >= 0:
        raise SpecError("decode growth must be a non-negative token count")
    if m == 0:
        return 0.0
    pk = completions_until_headroom(freed_tokens, freed_weights, headroom_tokens)
    k = np.arange(1, pk.size + 1, dtype=np.float64)[None, :]
    xx = x[:, None]
    lost = k * m * gammainc(k + 1, xx / m) + xx * (1.0 - gammainc(k, xx / m))  # E[min(x, G_k)]
    return float(np.dot(wx, lost @ pk) / np.dot(wx, x))
