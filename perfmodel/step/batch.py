"""What one engine iteration processes, as sums that are enough to cost it.

A batch mixes prefill chunks and decode requests (continuous batching with chunked
prefill). Every field may be a numpy array, so one ``Batch`` describes many
configurations at once (vectorized evaluation).

For a prefill chunk of ``s`` new tokens on top of ``c`` cached tokens the causal
attention touches ``s·c + s(s+1)/2`` (query, key) pairs and reads ``c + s`` KV tokens;
a decode request with context ``c`` touches ``c + 1`` pairs and reads ``c + 1`` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from perfmodel.errors import SpecError

Arr = NDArray[np.float64]


def _arr(x: ArrayLike, name: str) -> Arr:
    a = np.asarray(x, dtype=np.float64)
    if np.any(~np.isfinite(a)) or np.any(a < 0):
        raise SpecError(f"{name} must be finite and >= 0")
    return a


@dataclass(frozen=True)
class Batch:
    """Sums over the sequences of one iteration (all per whole model, before sharding)."""

    prefill_tokens: Arr  # new prompt tokens computed this step
    prefill_seqs: Arr  # sequences with a prefill chunk this step
    prefill_pairs: Arr  # causal (query, key) pairs of the prefill chunks
    prefill_kv_read: Arr  # KV tokens read by the prefill attention (context + chunk)
    decode_seqs: Arr  # requests generating one token this step
    decode_context: Arr  # sum of their KV lengths (tokens read)

    @property
    def tokens(self) -> Arr:
        """Rows through every linear layer: prefill tokens + one per decode request."""
        return self.prefill_tokens + self.decode_seqs

    @property
    def attn_pairs(self) -> Arr:
        return self.prefill_pairs + self.decode_context + self.decode_seqs

    @property
    def kv_read_tokens(self) -> Arr:
        return self.prefill_kv_read + self.decode_context

    @property
    def logit_rows(self) -> Arr:
        """Rows through the LM head: one per decoding request and per prefilled sequence."""
        return self.decode_seqs + self.prefill_seqs

    @staticmethod
    def prefill(batch: ArrayLike, input_len: ArrayLike, context: ArrayLike = 0) -> Batch:
        """``batch`` sequences each computing ``input_len`` new tokens over ``context``."""
        b = _arr(batch, "batch")
        s = _arr(input_len, "input length")
        c = _arr(context, "context")
        z = np.zeros(np.broadcast(b, s, c).shape)
        return Batch(
            prefill_tokens=b * s + z,
            prefill_seqs=b + z,
            prefill_pairs=b * (s * c + s * (s + 1) / 2) + z,
            prefill_kv_read=b * (c + s) + z,
            decode_seqs=z,
            decode_context=z,
        )

    @staticmethod
    def decode(batch: ArrayLike, context_len: ArrayLike) -> Batch:
        """``batch`` requests each generating one token with ``context_len`` cached tokens."""
        b = _arr(batch, "batch")
        c = _arr(context_len, "context length")
        z = np.zeros(np.broadcast(b, c).shape)
        return Batch(z, z, z, z, b + z, b * c + z)

    def __add__(self, other: Batch) -> Batch:
        """A mixed batch: the prefill chunks and decode requests of both."""
        return Batch(
            self.prefill_tokens + other.prefill_tokens,
            self.prefill_seqs + other.prefill_seqs,
            self.prefill_pairs + other.prefill_pairs,
            self.prefill_kv_read + other.prefill_kv_read,
            self.decode_seqs + other.decode_seqs,
            self.decode_context + other.decode_context,
        )
