"""The operating point of an instance at an arrival rate: decode occupancy, prefill chain.

The fixed point :func:`operating_point` solves (decoding requests ``n_d``, the prefill
backlog chain, the tagged request) is what :func:`perfmodel.serving.latency.estimate_latency`
turns into TTFT/TPOT means and percentiles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from perfmodel.serving.prefill_chain import (
    BacklogChain,
    PromptLaw,
    backlog_chain,
)
from perfmodel.serving.servemix import (
    RequestMoments,
    decode_only,
)
from perfmodel.serving.tagged import TaggedRequest, tagged_request
from perfmodel.step.instance import Instance

Arr = NDArray[np.float64]


@dataclass(frozen=True)
class OperatingPoint:
    chain: BacklogChain
    tagged: TaggedRequest
    decode_step_s: Arr  # τ₊ per state: the iteration of a decoding request
    decoders: float  # N̄: time-average number of decoding requests
    busy: float  # P(engine busy) = P(at least one request resident)
    ttft_s: float  # mean TTFT without the KV-memory wait
    tpot_s: Arr  # mean TPOT per decode-step atom
    excess_s: float = 0.0  # E[Σ_{j≤n}(E_j − E_∞)]: the tagged request's decode excess


def operating_point(
    inst: Instance,
    prompts: PromptLaw,
    m: RequestMoments,
    *,
    rate_per_s: float,
    max_batched_tokens: int,
    decode_steps: Arr,
    decode_weights: Arr,
    max_steps: int,
    warm: OperatingPoint | None = None,
) -> OperatingPoint | None:
    """Solve the decode population and the chain together; None if unbounded.

    Little's law twice. Per iteration: the engine iterates only while busy, so the
    ``λ·E[o − 1]`` decode tokens per second are spread over ``P(busy)/b̄`` iterations per
    second, ``n_d = λ·b̄·E[o − 1]/P(busy)``. In time: ``N̄ = λ·E[(o − 1)·TPOT(o)]``
    requests are decoding on average, and a decoding request shares its iterations with
    ``N̄`` others (Poisson arrivals see time averages). The engine is busy while a
    request is resident: ``P(busy) = 1 − exp(−(N̄ + λ·E[TTFT]))`` (residents as in
    M/G/∞). ``(n_d, N̄)`` is the fixed point of these maps (per-coordinate secant
    iterations); TTFT and TPOT come from the tagged request. The chain also "iterates"
    (decode-only, ``τ(0)``) through idle time, so its ``b̄`` is below the mean busy
    iteration at low load and ``n_d`` is low there (``n_d`` 1.2 vs 1.9 simulated for
    Mixtral-8x7B on 2×A100, ``code``, ρ = 0.3; the latencies stay within 8 %).
    ``decode_steps``/``decode_weights`` are the atoms of ``o − 1`` (all requests).

    ``warm``: the point at a lower rate of the same instance and workload, where the
    iteration starts (continuation in the rate: a search evaluates nearby rates one after
    another). The fixed point may not be unique — an MoE step grows fast with the decodes
    as more experts are read, and a second, spurious crossing appears above the physical
    one — and the iteration finds the physical one from below: the cold start is a
    light-load guess, and a warm point at a lower rate is below it (the decode population
    grows with the rate); a warm point at a rate ``≥ rate_per_s`` is not used.
    """
    lam, B = rate_per_s, max_batched_tokens
    ctx = m.decode_context_tokens / max(m.decode_steps, 1e-12)
    one = float(inst.iteration_s(decode_only(1.0, ctx, 1))[0])
    pos = decode_steps >= 1
    x = np.array([lam * one * m.decode_steps] * 2)  # (n_d, N̄)
    w_n = decode_weights[pos]
    n_pos = decode_steps[pos]
    mean_n = float(np.dot(w_n, n_pos))
    # the tagged request is costly: between its evaluations, E[n·TPOT(n)] is taken as
    # E[n]·E_∞ + excess, with E_∞ = π·τ₊ from the current chain and the excess
    # E[Σ_{j≤n}(E_j − E_∞)] and E[TTFT] from the last tagged request
    excess, ttft = 0.0, 0.0
    if warm is not None and warm.chain.rate_per_s < lam:
        x = np.array([warm.chain.decode_seqs, warm.decoders])
        excess, ttft = warm.excess_s, warm.ttft_s
    prev: tuple[float, float] | None = None  # (n_d, g₁) of the last iterate
    below, above = 0.0, math.inf  # the root of g₁ lies between (n_d)
    point: OperatingPoint | None = None
    levels = 4 if warm is None else warm.chain.levels
    for _ in range(80):
        n_d, n_bar = float(x[0]), float(x[1])
        if n_d >= B - 1:
            return None
        probe = max(2.0, 0.05 * n_bar)  # N̄ step of the slope of E_∞
        chain = backlog_chain(
            inst,
            prompts,
            m,
            rate_per_s=lam,
            decode_seqs=n_d,
            max_batched_tokens=B,
            min_levels=levels,
            plus_decode_seqs=(n_bar + 1, n_bar + 1 + probe),
        )
        if chain is None or chain.plus_step_s is None:
            return None
        levels = chain.levels
        G = chain.per_budget
        tail = np.repeat(chain.plus_step_s[:, G:], chain.states - G - 1, axis=1)
        taus = np.concatenate([chain.plus_step_s, tail], axis=1)
        tau_plus = taus[0]
        e_inf, e_probe = (float(v) for v in taus @ chain.stationary)

        per_iteration = lam * chain.mean_step_s * m.decode_steps  # n_d·P(busy)
        busy = max(1.0 - math.exp(-(n_bar + lam * ttft)), 1e-12)
        g = np.array([per_iteration / busy, lam * (mean_n * e_inf + excess)]) - x
        if np.all(np.abs(g) <= 1e-3 * np.maximum(x, 1e-2)):
            tag = tagged_request(chain, decode_step_s=tau_plus, max_steps=max_steps)
            tpot = tag.mean_tpot_s(np.maximum(decode_steps, 1.0))
            new_ttft = busy * tag.residual_s + tag.full_wait_s + tag.last_prefill_s
            new_excess = float(np.dot(w_n, n_pos * (tpot[pos] - e_inf)))
            point = OperatingPoint(chain, tag, tau_plus, n_bar, busy, new_ttft, tpot, new_excess)
            if (
                abs(lam * (new_excess - excess)) <= 1e-3 * max(n_bar, 1e-2)
                and abs(new_ttft - ttft) <= 1e-3 * new_ttft
            ):
                return point
            excess, ttft = new_excess, new_ttft
            below, above = 0.0, math.inf  # P(busy) moved: g₁ is another map
            busy = max(1.0 - math.exp(-(n_bar + lam * ttft)), 1e-12)
            g = np.array([per_iteration / busy, lam * (mean_n * e_inf + excess)]) - x
        x, prev, below, above = _step(x, g, prev, below, above, B)
        # N̄: Newton on g₂ at this chain (π depends on n_d only), the slope of E_∞ from
        # the probe; the fixed-point step where g₂ is not clearly decreasing
        slope = lam * mean_n * (e_probe - e_inf) / probe - 1.0
        x[1] = max(n_bar - g[1] / slope if slope < -0.05 else n_bar + g[1], 0.0)
        last = (chain, tau_plus, busy, n_bar)
    if point is None:  # not converged (has not happened in validation): the last iterate
        chain, tau_plus, busy, n_bar = last
        tag = tagged_request(chain, decode_step_s=tau_plus, max_steps=max_steps)
        ttft = busy * tag.residual_s + tag.full_wait_s + tag.last_prefill_s
        tpot = tag.mean_tpot_s(np.maximum(decode_steps, 1.0))
        e_inf = float(chain.stationary @ tau_plus)
        excess = float(np.dot(w_n, n_pos * (tpot[pos] - e_inf)))
        point = OperatingPoint(chain, tag, tau_plus, n_bar, busy, ttft, tpot, excess)
    return point


def _step(
    x: Arr, g: Arr, prev: tuple[float, float] | None, below: float, above: float, B: int
) -> tuple[Arr, tuple[float, float], float, float]:
    """The next ``n_d``: a secant step on ``g₁`` kept inside the bracket of its root (``g₁``
    falls with ``n_d`` in small steps — GEMM tile padding — so a secant through two
    close points may point anywhere), halving the bracket when it leaves it."""
    n_d = float(x[0])
    if g[0] > 0:
        below = max(below, n_d)
    else:
        above = min(above, n_d)
    nxt = n_d + float(g[0])
    if prev is not None and abs(g[0] - prev[1]) > 1e-15:
        sec = n_d - float(g[0]) * (n_d - prev[0]) / (float(g[0]) - prev[1])
        nxt = sec if 0 <= sec < B - 1 else nxt
    if not below <= nxt <= above and math.isfinite(above):
        nxt = 0.5 * (below + above)
    return np.array([max(nxt, 0.0), x[1]]), (n_d, float(g[0])), below, above
