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
a prefix cache (vLLM V1 keeps a preempted request's blocks until they are reused) makes
the real recompute smaller than this full recompute.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from perfmodel.errors import SpecError


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
