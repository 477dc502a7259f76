"""The average iteration of continuous batching with chunked prefill, per unit of throughput.

If an engine completes ``r`` requests per iteration in steady state, every iteration
carries on average ``r`` times each request's per-iteration share of work: its prompt
tokens, its ``o − 1`` decode steps (the prefill emits the first token), the causal
attention pairs of its prompt (``s(s+1)/2`` whatever the chunking), the KV its chunks
and decode steps read, and its prefill chunks. :func:`mix_batch` turns ``r`` into the
``Batch`` that ``perfmodel.step.step_time`` costs. Averaging the features of the
iterations (rather than averaging their times) is the approximation; the discrete-event
simulator checks it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from perfmodel.batch import Batch
from perfmodel.classic_queues import lifetime_kv_token_steps, prefill_kv_token_steps
from perfmodel.errors import SpecError
from perfmodel.workload import LengthDistribution


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
