"""Prefill-prioritizing scheduling without chunking: decodes stall for whole prefills.

The policy of vLLM before chunked prefill and of Orca: a waiting prompt is prefilled
whole in an iteration of its own, ahead of the running decodes. At arrival rate ``λ``
(Poisson) with prompt prefill times ``t_p(s)`` (the instance's iteration of
one ``s``-token prefill):

* the engine spends the fraction ``ρ_p = λ·E[t_p]`` of its time prefilling;
* ``n`` requests decode together at step time ``t_d(n) = t(decode n at c̄)``, with
  ``c̄ = E[o·s + o(o−1)/2]/E[o]`` the step-averaged context; a request produces one
  token per decode step and decode steps get ``1 − ρ_p`` of the time, so the mean time
  per output token is ``TPOT = t_d(n)/(1 − ρ_p)`` and Little's law gives the fixed
  point ``n = λ·E[o]·t_d(n)/(1 − ρ_p)`` — its smallest root, the limit of the
  iteration from ``n = 0``, found on a log grid of ``t_d`` (linear in between); no
  root below the batch cap and the KV room ``M/c̄`` means unstable;
* the gap between two tokens (TBT) is ``t_d`` when no prompt arrived during the
  decode step (probability ``p₀ = e^{−λ·t_d}``), else ``t_d`` plus the prefill busy
  period that arrival starts — approximated by one prompt's ``t_p`` stretched by
  ``1/(1 − ρ_p)`` (mean-matching the M/G/1 busy period): the ``q`` quantile is ``t_d``
  if ``q ≤ p₀``, else ``t_d + Q_{t_p}((q − p₀)/(1 − p₀))/(1 − ρ_p)``;
* prompts see only other prompts (prefill priority): an M/G/1 queue, mean wait
  ``λE[t_p²]/(2(1 − ρ_p))`` (Pollaczek–Khinchine); the ``q`` quantile of TTFT is taken
  as ``W_q + Q_{t_p}(q)`` with ``P(W > x) = ρ_p·exp(−ρ_p·x/E[W])`` (exponential tail
  matched to ``P(W > 0) = ρ_p`` and the mean) — a sum of quantiles, so conservative.

Chunked prefill (Sarathi-Serve) is the project's default engine model
(:mod:`perfmodel.serving.service`): every iteration is at most a full token budget ``B``, so
its TBT never exceeds ``t(B)``; :func:`tbt_budget` picks the largest budget whose full
iteration meets a TBT target, which is how Sarathi-Serve sizes its chunks — every rate
below that engine's ``μ`` then meets the TBT target at every percentile.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from perfmodel.errors import SpecError
from perfmodel.serving.classic_queues import pollaczek_khinchine_wait_s
from perfmodel.serving.search import max_rate
from perfmodel.serving.servemix import PROMPT_BINS, compress_atoms
from perfmodel.serving.service import ServiceRate, service_rate
from perfmodel.step.batch import Batch
from perfmodel.step.instance import Instance
from perfmodel.workload.lengths import LengthDistribution
from perfmodel.workload.presets import Workload

DECODE_GRID_POINTS = 64
BUDGET_CANDIDATES = (128, 256, 512, 1024, 2048, 4096, 8192, 16384)


@dataclass(frozen=True)
class PrefillTimes:
    """Prefill time of each prompt-length atom (one prompt per iteration)."""

    tokens: np.ndarray
    weights: np.ndarray
    seconds: np.ndarray
    decode_context: float
    mean_output: float
    decode_seqs: np.ndarray  # grid of decode batch sizes n (log-spaced, from 1)
    decode_step_s: np.ndarray  # t_d(n) on that grid

    def decode_s(self, n: float) -> float:
        """``t_d(n)``, linear between grid points (n < 1 costs a batch of one)."""
        return float(np.interp(max(n, 1.0), self.decode_seqs, self.decode_step_s))

    @property
    def mean_s(self) -> float:
        return float(np.dot(self.weights, self.seconds))

    @property
    def second_moment_s2(self) -> float:
        return float(np.dot(self.weights, self.seconds**2))

    def quantile_s(self, q: float) -> float:
        order = np.argsort(self.seconds)
        cdf = np.cumsum(self.weights[order])
        i = min(int(np.searchsorted(cdf, min(max(q, 0.0), 1.0) - 1e-12)), cdf.size - 1)
        return float(self.seconds[order][i])


def prefill_times(
    inst: Instance,
    lengths: LengthDistribution,
    *,
    max_decode_seqs: float = 4096,
) -> PrefillTimes:
    """Prefill time per prompt atom and the decode step on a grid of batch sizes."""
    s, w = compress_atoms(lengths.input_tokens, lengths.weights, PROMPT_BINS)
    t = np.asarray(inst.iteration_s(Batch.prefill(1, s)))
    e_o = lengths.mean_output_tokens
    ctx = lengths.expect(lambda s_, o: o * s_ + o * (o - 1) / 2) / e_o
    n = np.geomspace(1.0, max(max_decode_seqs, 2.0), DECODE_GRID_POINTS)
    td = np.asarray(inst.iteration_s(Batch.decode(n, ctx)), float)
    return PrefillTimes(s, w, np.broadcast_to(t, s.shape).astype(float), ctx, e_o, n, td)


@dataclass(frozen=True)
class StallOperatingPoint:
    rate_per_s: float
    stable: bool
    prefill_utilization: float
    decode_seqs: float
    decode_step_s: float
    tpot_mean_s: float
    ttft_mean_s: float
    tbt_quantile_s: float
    ttft_quantile_s: float
    percentile: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def stall_operating_point(
    pt: PrefillTimes,
    rate_per_s: float,
    *,
    kv_capacity_tokens: int,
    max_num_seqs: int = 256,
    percentile: float = 0.99,
) -> StallOperatingPoint:
    """Latencies of prefill-prioritizing scheduling at ``rate_per_s`` (module docstring)."""
    if rate_per_s <= 0 or not 0 < percentile < 1:
        raise SpecError("rate must be > 0 and percentile in (0, 1)")
    lam = rate_per_s
    rho = lam * pt.mean_s
    n_max = min(float(max_num_seqs), kv_capacity_tokens / pt.decode_context)
    inf = math.inf
    unstable = StallOperatingPoint(lam, False, rho, n_max, inf, inf, inf, inf, inf, percentile)
    if rho >= 1:
        return unstable

    # smallest root of h(n) = c·t_d(n) − n (the iteration from n = 0 converges to it)
    c = lam * pt.mean_output / (1 - rho)
    grid = np.concatenate([[0.0], pt.decode_seqs])
    h = c * np.concatenate([[pt.decode_step_s[0]], pt.decode_step_s]) - grid
    neg = np.flatnonzero(h <= 0)
    if neg.size == 0:
        return unstable
    i = int(neg[0])
    n = float(grid[i - 1] + (grid[i] - grid[i - 1]) * h[i - 1] / (h[i - 1] - h[i]))
    if n > n_max:
        return unstable
    td = pt.decode_s(n)
    p0 = math.exp(-lam * td)
    q = percentile
    tbt = td if q <= p0 else td + pt.quantile_s((q - p0) / (1 - p0)) / (1 - rho)
    w_mean = pollaczek_khinchine_wait_s(lam, pt.mean_s, pt.second_moment_s2)
    w_q = 0.0 if q <= 1 - rho or w_mean == 0 else (w_mean / rho) * math.log(rho / (1 - q))
    return StallOperatingPoint(
        rate_per_s=lam,
        stable=True,
        prefill_utilization=rho,
        decode_seqs=n,
        decode_step_s=td,
        tpot_mean_s=td / (1 - rho),
        ttft_mean_s=w_mean + pt.mean_s,
        tbt_quantile_s=tbt,
        ttft_quantile_s=w_q + pt.quantile_s(q),
        percentile=q,
    )


def stall_goodput(
    inst: Instance,
    lengths: LengthDistribution,
    *,
    kv_capacity_tokens: int,
    tbt_slo_s: float,
    ttft_slo_s: float,
    percentile: float = 0.99,
    max_num_seqs: int = 256,
    rel_tol: float = 1e-2,
) -> float:
    """Largest rate whose ``percentile`` TBT and TTFT meet their targets (0 if none)."""
    pt = prefill_times(inst, lengths, max_decode_seqs=max_num_seqs)

    def ok(lam: float) -> bool:
        op = stall_operating_point(
            pt,
            lam,
            kv_capacity_tokens=kv_capacity_tokens,
            max_num_seqs=max_num_seqs,
            percentile=percentile,
        )
        return op.stable and op.tbt_quantile_s <= tbt_slo_s and op.ttft_quantile_s <= ttft_slo_s

    hi = 1.0 / pt.mean_s
    lo = hi * 1e-4
    if not ok(lo):
        return 0.0
    return max_rate(ok, hi, lo=lo, rel_tol=rel_tol)


def tbt_budget(
    inst: Instance,
    workload: Workload,
    *,
    tbt_slo_s: float,
    kv_capacity_tokens: int | None = None,
    candidates: tuple[int, ...] = BUDGET_CANDIDATES,
    rates: dict[int, ServiceRate] | None = None,
) -> ServiceRate | None:
    """The chunked-prefill engine with the largest token budget whose full iteration
    meets ``tbt_slo_s`` (None if even the smallest does not). ``rates``: a memo of the
    engines by budget, filled in, for callers that try several targets."""
    best = None
    memo = {} if rates is None else rates
    for b in sorted(candidates):
        if b not in memo:
            memo[b] = service_rate(
                inst,
                workload,
                kv_capacity_tokens=kv_capacity_tokens,
                max_batched_tokens=b,
            )
        sr = memo[b]
        if sr.full_step_s > tbt_slo_s:
            break
        best = sr
    return best
