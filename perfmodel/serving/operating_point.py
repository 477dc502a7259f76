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

    ``warm``: the point at a lower rate of the same instance and workload (continuation in
    the rate: a search evaluates nearby rates one after another). The fixed point may not
    be unique — an MoE step grows fast with the decodes as more experts are read, and a
    second, spurious crossing lies above the physical one — and the iteration finds the
    physical one from below: the light-load guess and a lower rate's point are both below
    it (the decode population grows with the rate), and it starts from the larger of
    the two; a point at a rate ``≥ rate_per_s`` is not used. Same answer to the
    tolerance (1e-3), ~10 % fewer chains in a goodput search.
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
        x = np.maximum(x, [warm.chain.decode_seqs, warm.decoders])  # both below the root
        excess, ttft = warm.excess_s, warm.ttft_s
    prev: tuple[NDArray[np.float64], NDArray[np.float64]] | None = None
    point: OperatingPoint | None = None
    levels = 4 if warm is None else warm.chain.levels
    for _ in range(80):
        n_d, n_bar = float(x[0]), float(x[1])
        if n_d >= B - 1:
            return None
        chain = backlog_chain(
            inst,
            prompts,
            m,
            rate_per_s=lam,
            decode_seqs=n_d,
            max_batched_tokens=B,
            min_levels=levels,
            plus_decode_seqs=n_bar + 1,
        )
        if chain is None or chain.plus_step_s is None:
            return None
        levels = chain.levels
        G = chain.per_budget
        tau_plus = chain.plus_step_s
        tau_plus = np.concatenate([tau_plus, np.full(chain.states - G - 1, tau_plus[G])])
        e_inf = float(chain.stationary @ tau_plus)

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
            excess, ttft, prev = new_excess, new_ttft, None  # a new map: restart the secant
            busy = max(1.0 - math.exp(-(n_bar + lam * ttft)), 1e-12)
            g = np.array([per_iteration / busy, lam * (mean_n * e_inf + excess)]) - x
        nxt = x + g  # fixed-point step; per-coordinate secant when it is well posed
        if prev is not None:
            dg = g - prev[1]
            ok = np.abs(dg) > 1e-15
            sec = np.where(ok, x - g * (x - prev[0]) / np.where(ok, dg, 1.0), nxt)
            nxt = np.where((sec >= 0) & (sec < B - 1), sec, nxt)
        prev, x = (x, g), np.maximum(nxt, 0.0)
        last = (chain, tau_plus, busy, n_bar)
    if point is None:  # not converged (has not happened in validation): the last iterate
        chain, tau_plus, busy, n_bar = last
        tag = tagged_request(chain, decode_step_s=tau_plus, max_steps=max_steps)
        ttft = busy * tag.residual_s + tag.full_wait_s + tag.last_prefill_s
        tpot = tag.mean_tpot_s(np.maximum(decode_steps, 1.0))
        excess = float(np.dot(w_n, n_pos * (tpot[pos] - float(chain.stationary @ tau_plus))))
        point = OperatingPoint(chain, tag, tau_plus, n_bar, busy, ttft, tpot, excess)
    return point
