"""KV reserved for the maximum length vs paged for actual lengths (the vLLM claim).

With ``M`` KV tokens on the device (from :func:`perfmodel.memory.memory_fit`):

* **Reserved for the maximum length** (Orca "Max"): every admitted request holds a
  contiguous slot of ``L_max`` tokens (default: the workload's largest ``s + o``), so
  ``B_max = ⌊M / L_max⌋`` requests run concurrently.
* **Reserved for the actual length** (Orca "Oracle"): a request holds ``s + o`` tokens for
  its whole life; averaged over its ``o`` decode steps the resident footprint is
  ``E[o·(s + o)] / E[o]``.
* **Paged** (vLLM PagedAttention): a request holds only the blocks of the tokens it has,
  ``⌈(s + j)/b⌉·b`` at decode step ``j``; its step-averaged footprint is
  ``E[o·s + o(o − 1)/2] / E[o] + (b − 1)/2`` (the last block is on average half empty).

In a saturated engine the KV is full, so the concurrent batch is ``M`` over the mean
footprint (Little's law over decode steps). Decode throughput is ``B / t(B, c̄)`` with
``t`` from :func:`perfmodel.step.step_time` on a decode batch at the step-averaged
context ``c̄ = E[o·s + o(o − 1)/2]/E[o]``; an engine cap ``max_num_seqs`` (vLLM: 256)
limits every scheme alike. Prefill is left out (the claim is about decode batching).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from perfmodel.errors import InfeasibleError, SpecError
from perfmodel.memory import DEFAULT_GPU_MEMORY_UTILIZATION
from perfmodel.step.batch import Batch
from perfmodel.step.instance import Instance
from perfmodel.workload.lengths import LengthDistribution

DEFAULT_BLOCK_TOKENS = 16  # vLLM's default KV block size


@dataclass(frozen=True)
class Scheme:
    """One KV allocation scheme at full memory."""

    name: str
    footprint_tokens: float  # mean KV tokens one resident request holds
    batch: float  # concurrent requests
    step_s: float  # decode iteration at that batch
    tokens_per_s: float  # decode throughput


@dataclass(frozen=True)
class PagingComparison:
    """Batch and decode throughput of the three schemes, and the paged/max ratios."""

    kv_capacity_tokens: int
    mean_context_tokens: float
    max_len_tokens: int
    reserved_max: Scheme
    reserved_actual: Scheme
    paged: Scheme

    @property
    def batch_ratio(self) -> float:
        return self.paged.batch / self.reserved_max.batch

    @property
    def throughput_ratio(self) -> float:
        """Paged over reserved-for-max decode throughput (the vLLM "2-4x")."""
        return self.paged.tokens_per_s / self.reserved_max.tokens_per_s

    @property
    def throughput_ratio_vs_actual(self) -> float:
        return self.paged.tokens_per_s / self.reserved_actual.tokens_per_s


def paging_vs_reservation(
    inst: Instance,
    lengths: LengthDistribution,
    *,
    max_len_tokens: int | None = None,
    block_tokens: int = DEFAULT_BLOCK_TOKENS,
    max_num_seqs: int | None = None,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
) -> PagingComparison:
    """Compare reserved-for-max, reserved-for-actual and paged KV (module docstring)."""
    if not (isinstance(block_tokens, int) and block_tokens >= 1):
        raise SpecError(f"block size must be a positive integer of tokens, got {block_tokens!r}")
    if max_num_seqs is not None and max_num_seqs < 1:
        raise SpecError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
    l_max = lengths.max_total_tokens if max_len_tokens is None else int(max_len_tokens)
    if l_max < lengths.max_total_tokens:
        raise SpecError(
            f"the reserved maximum length ({l_max}) is shorter than the longest request "
            f"({lengths.max_total_tokens} tokens); raise it"
        )
    fit = inst.memory_fit(gpu_memory_utilization=gpu_memory_utilization)
    M = fit.kv_capacity_tokens
    if l_max > M:
        raise InfeasibleError(
            f"{inst.model.id} on {inst.plan.tp}x {inst.device.id} has KV room for {M} tokens, "
            "less than one "
            f"request of the maximum length {l_max}; use more devices or a smaller KV dtype"
        )
    e_o = lengths.mean_output_tokens
    ctx = lengths.expect(lambda s, o: o * s + o * (o - 1) / 2) / e_o
    actual = lengths.expect(lambda s, o: o * (s + o)) / e_o
    paged = ctx + (block_tokens - 1) / 2
    cap = math.inf if max_num_seqs is None else float(max_num_seqs)

    def scheme(name: str, footprint: float, batch: float) -> Scheme:
        b = min(batch, cap)
        t = float(inst.iteration_s(Batch.decode(b, ctx)))
        return Scheme(name, footprint, b, t, b / t)

    return PagingComparison(
        kv_capacity_tokens=M,
        mean_context_tokens=ctx,
        max_len_tokens=l_max,
        reserved_max=scheme("reserved for max length", float(l_max), float(M // l_max)),
        reserved_actual=scheme("reserved for actual length", actual, M / actual),
        paged=scheme(f"paged ({block_tokens}-token blocks)", paged, M / paged),
    )
