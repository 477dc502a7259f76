"""Speculative decoding: tokens per target pass and the wall-time speedup.

A draft proposes ``γ`` tokens; the target verifies them in one pass over ``γ + 1``
tokens per sequence (a prefill chunk of ``γ + 1`` tokens over the cached context).
With an i.i.d. per-token acceptance rate ``α`` the expected tokens produced per
verification are ``E = (1 − α^{γ+1}) / (1 − α)`` (Leviathan, Kalman & Matias, ICML 2023,
eq. 1; ``γ + 1`` when ``α = 1``). One iteration costs ``γ·t_draft + t_verify``, so

    speedup = E · t_target / (γ · t_draft + t_verify)

against plain decoding at ``t_target`` per token, with ``t_target`` the target's decode
step and ``t_verify`` its ``γ + 1``-token step (the instance's iteration time), and
``t_draft`` a draft model's decode step (or a given fraction of the target's on-device
decode step). Time that every target pass pays whatever its width — weights streamed
from host memory when they do not fit — is ``extra_step_s``, added to both
``t_target`` and ``t_verify`` (not to the draft, which runs from device memory).
The largest speedup any draft can give is at ``α = 1`` and a free draft:
``(γ + 1)·t_target / t_verify``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from perfmodel.errors import SpecError
from perfmodel.step.batch import Batch
from perfmodel.step.instance import Instance


def expected_tokens_per_pass(alpha: float, gamma: int) -> float:
    """``E = (1 − α^{γ+1})/(1 − α)``: tokens per verification (Leviathan et al., eq. 1)."""
    if not 0 <= alpha <= 1:
        raise SpecError(f"acceptance rate must be in [0, 1], got {alpha}")
    if gamma < 0:
        raise SpecError(f"draft length must be >= 0, got {gamma}")
    if alpha == 1:
        return float(gamma + 1)
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)


@dataclass(frozen=True)
class SpeculativeSpeedup:
    gamma: int
    alpha: float
    tokens_per_pass: float
    target_step_s: float
    verify_step_s: float
    draft_step_s: float
    iteration_s: float
    speedup: float
    bound: float  # α = 1, free draft

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def speculative_speedup(
    inst: Instance,
    *,
    gamma: int,
    alpha: float,
    batch: int = 1,
    context_len: int = 1024,
    draft: Instance | None = None,
    draft_cost_ratio: float | None = None,
    extra_step_s: float = 0.0,
) -> SpeculativeSpeedup:
    """Speedup of speculative over plain decoding (module docstring)."""
    if (draft is None) == (draft_cost_ratio is None):
        raise SpecError("give either a draft model or a draft cost ratio (not both)")
    if extra_step_s < 0:
        raise SpecError("extra step time must be >= 0 s")
    t_dev = float(inst.iteration_s(Batch.decode(batch, context_len)))
    t = t_dev + extra_step_s
    tv = float(inst.iteration_s(Batch.prefill(batch, gamma + 1, context_len)))
    tv += extra_step_s
    if draft is not None:
        td = float(draft.iteration_s(Batch.decode(batch, context_len)))
    else:
        assert draft_cost_ratio is not None
        if draft_cost_ratio < 0:
            raise SpecError("draft cost ratio must be >= 0")
        td = draft_cost_ratio * t_dev
    e = expected_tokens_per_pass(alpha, gamma)
    it = gamma * td + tv
    return SpeculativeSpeedup(
        gamma=gamma,
        alpha=alpha,
        tokens_per_pass=e,
        target_step_s=t,
        verify_step_s=tv,
        draft_step_s=td,
        iteration_s=it,
        speedup=e * t / it,
        bound=(gamma + 1) * t / tv,
    )
