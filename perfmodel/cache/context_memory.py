"""KV bytes one sequence holds at a context length: full, sliding-window and recurrent layers.

A model whose layers differ in what they cache (hybrid SSM/attention, sliding-window
attention) holds, per sequence at context ``L``:

    bytes(L) = f_full·k·L + f_window·k·min(L, W) + S

with ``k`` the KV bytes per token of all layers as if every one were full attention
(:func:`perfmodel.memory.kv_bytes_per_token_per_device`), ``f_full`` and ``f_window``
the fractions of layers with full and windowed (window ``W`` tokens) attention, and
``S`` the fixed recurrent-state bytes of the SSM / linear-attention layers. A dense
transformer is ``f_full = 1``. The sequences that fit together at ``L`` are
``⌊budget / bytes(L)⌋``.
"""

from __future__ import annotations

import math

from perfmodel.errors import SpecError


def sequence_kv_bytes(
    kv_bytes_per_token: float,
    context_len: float,
    *,
    full_fraction: float = 1.0,
    window_fraction: float = 0.0,
    window_tokens: float = 0.0,
    state_bytes: float = 0.0,
) -> float:
    """``bytes(L)`` of the module docstring."""
    for name, v in (("full_fraction", full_fraction), ("window_fraction", window_fraction)):
        if not 0 <= v <= 1:
            raise SpecError(f"{name} must be in [0, 1], got {v}")
    if full_fraction + window_fraction > 1 + 1e-9:
        raise SpecError("full and windowed layer fractions add up to more than 1")
    if min(kv_bytes_per_token, context_len, window_tokens, state_bytes) < 0:
        raise SpecError("bytes, context and window must be >= 0")
    k, L = kv_bytes_per_token, context_len
    return full_fraction * k * L + window_fraction * k * min(L, window_tokens) + state_bytes


def concurrent_sequences(budget_bytes: float, per_sequence_bytes: float) -> int:
    """``⌊budget / bytes(L)⌋`` (0 when the budget is negative)."""
    if per_sequence_bytes <= 0:
        raise SpecError("bytes per sequence must be > 0")
    return max(0, math.floor(budget_bytes / per_sequence_bytes))
