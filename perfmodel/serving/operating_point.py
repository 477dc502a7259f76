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
    per_state,
    prefill_step_s,
)
from perfmodel.serving.servemix import (
    RequestMoments,
    decode_only,
)
from perfmodel.serving.tagged import TaggedRequest, TaggedStart, tagged_request
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


#: relative tolerance of the fixed point: of ``n_d``'s equation and of the tagged request's
#: TTFT and decode excess
TOL = 1e-3

#: relative tolerance of ``N̄``'s equation on one chain (its evaluations are cheap)
DECODERS_TOL = 1e-6

#: secant steps of ``N̄``'s equation on one chain at most
DECODER_STEPS = 8

#: a secant step of ``n_d`` goes at most this many fixed-point steps at once
GROW = 4.0


MAX_CHAIN_EVALUATIONS = 80


@dataclass(frozen=True)
class _Side:
    """One end of ``n_d``'s bracket: a value and its residual ``h`` (None: not evaluated,
    known only to lie on this side of the root)."""

    n_d: float
    h: float | None = None


@dataclass(frozen=True)
class _Eval:
    """``n_d``'s equation at one ``n_d``: the chain, ``N̄`` solving its own equation on
    it, and the residual ``h = λ·b̄·E[o − 1]/P(busy) − n_d``."""

    n_d: float
    chain: BacklogChain
    decoders: float  # N̄
    tau_plus: Arr  # τ₊ per state, with N̄ + 1 decodes
    e_inf: float  # π·τ₊
    busy: float
    h: float


class _FixedPoint:
    """``(n_d, N̄)`` at given tagged-request terms (decode excess, mean TTFT): ``N̄``'s
    equation solved on each chain (it changes only ``τ₊``: step-time evaluations, no
    chain), ``n_d``'s by a bracketed secant (each evaluation one chain, cached by
    ``n_d``: a restart at new tagged-request terms re-evaluates the current ``n_d``
    without a chain)."""

    def __init__(
        self,
        inst: Instance,
        prompts: PromptLaw,
        m: RequestMoments,
        *,
        rate_per_s: float,
        max_batched_tokens: int,
        mean_steps: float,
        levels: int,
    ) -> None:
        self.inst, self.prompts, self.m = inst, prompts, m
        self.lam, self.B, self.mean_n = rate_per_s, max_batched_tokens, mean_steps
        self.levels = levels
        self.excess, self.ttft = 0.0, 0.0
        self.chains: dict[float, tuple[BacklogChain, Arr]] = {}  # n_d → (chain, τ₊ at n_d)
        #: exact evaluations by (n_d, excess, TTFT): :meth:`solve`'s check of a point is
        #: also the first point of its exact search
        self.exact: dict[tuple[float, float, float], _Eval | None] = {}

    def _chain(self, n_d: float) -> tuple[BacklogChain, Arr] | None:
        """The chain at ``n_d`` and its ``τ₊`` at ``N̄ = n_d`` (cached by ``n_d``)."""
        hit = self.chains.get(n_d)
        if hit is not None:
            return hit
        chain = backlog_chain(
            self.inst,
            self.prompts,
            self.m,
            rate_per_s=self.lam,
            decode_seqs=n_d,
            max_batched_tokens=self.B,
            min_levels=self.levels,
            plus_decode_seqs=n_d + 1,
        )
        if chain is None or chain.plus_step_s is None:
            return None
        self.levels = max(self.levels, chain.levels)
        self.chains[n_d] = hit = (chain, per_state(chain.plus_step_s, chain.states))
        return hit

    def evaluate(self, n_d: float, *, exact: bool) -> _Eval | None:
        """``h(n_d)``; None if the chain at ``n_d`` is not recurrent (or ``n_d ≥ B − 1``).

        ``exact``: ``N̄`` solves its equation on the chain, ``N̄ = λ·(E[n]·π·τ₊(N̄) +
        excess)``, by secant steps from ``N̄ = n_d`` (near the root: the two counts
        differ by the idle iterations' share); ``τ₊`` steps where the engine pads the
        decode batch, so the map may jump over the diagonal, and the steps stop after
        :data:`DECODER_STEPS`. Otherwise ``N̄`` is that map's first step, with ``τ₊`` at
        ``N̄ = n_d`` (tabulated with the chain): ``h`` depends on ``N̄`` only through
        ``P(busy)``, so the search for ``n_d`` takes no step time of its own until its
        last point, which is evaluated exactly (:meth:`solve`). Either way a function of
        ``n_d`` alone, as the search needs."""
        if n_d >= self.B - 1:
            return None
        if exact:
            key = (n_d, self.excess, self.ttft)
            if key not in self.exact:
                self.exact[key] = self._evaluate(n_d, exact=True)
            return self.exact[key]
        return self._evaluate(n_d, exact=False)

    def _evaluate(self, n_d: float, *, exact: bool) -> _Eval | None:
        """:meth:`evaluate`, not cached."""
        hit = self._chain(n_d)
        if hit is None:
            return None
        chain, tau_plus = hit
        pi, lam, nb = chain.stationary, self.lam, n_d

        def phi(tp: Arr, nb: float) -> tuple[float, float]:
            e_inf = float(pi @ tp)
            return lam * (self.mean_n * e_inf + self.excess) - nb, e_inf

        g, e_inf = phi(tau_plus, nb)
        prev: tuple[float, float] | None = None
        for _ in range(DECODER_STEPS if exact else 0):
            if abs(g) <= DECODERS_TOL * max(nb, 1e-2):
                break
            nxt = nb + g  # fixed-point step; secant when two points are known
            if prev is not None and prev[1] != g:
                sec = nb - g * (nb - prev[0]) / (g - prev[1])
                nxt = sec if sec >= 0 else nxt
            prev, nb = (nb, g), max(nxt, 0.0)
            tau_plus = _plus_step_s(self.inst, self.prompts, self.m, chain, nb)
            g, e_inf = phi(tau_plus, nb)
        if not exact:
            nb = max(nb + g, 0.0)
        busy = max(1.0 - math.exp(-(nb + lam * self.ttft)), 1e-12)
        h = lam * chain.mean_step_s * self.m.decode_steps / busy - n_d
        return _Eval(n_d, chain, nb, tau_plus, e_inf, busy, h)

    def solve(self, n_d: float) -> _Eval | None:
        """The root of ``h`` nearest above the light-load side, from ``n_d``; None if
        there is none below the budget (the decodes alone would fill it). Searched with
        the first-step ``N̄``, then its point evaluated exactly; if that moved ``h`` out
        of the tolerance, searched again exactly from there."""
        e = self._search(n_d, exact=False)
        if e is None:
            return None
        ex = self.evaluate(e.n_d, exact=True)
        if ex is not None and abs(ex.h) <= max(TOL * max(ex.n_d, 1e-2), abs(e.h)):
            return ex
        return self._search(e.n_d, exact=True)

    def _search(self, n_d: float, *, exact: bool) -> _Eval | None:
        """The search for the root of ``h`` (see :meth:`solve`).

        A secant step that keeps the residual's sign but loses its trend (from below,
        ``h`` grew; from above, it fell) is not taken: it may have passed a second
        crossing (an MoE step's spurious one), and a fixed-point step follows instead."""
        lo, hi = _Side(0.0), _Side(math.inf)
        below: list[_Eval] = []  # the accepted points with h > 0, in order
        above: list[_Eval] = []  # and with h < 0
        best: _Eval | None = None
        x, secant, illinois = n_d, False, 0
        for _ in range(MAX_CHAIN_EVALUATIONS):
            e = self.evaluate(x, exact=exact)
            rejected = False
            if e is None:
                hi = _Side(x)
            else:
                if best is None or abs(e.h) < abs(best.h):
                    best = e
                if abs(e.h) <= TOL * max(e.n_d, 1e-2):
                    return e
                if secant and _lost_trend(e, lo, hi):
                    rejected = True
                elif e.h > 0:
                    illinois = illinois + 1 if illinois > 0 else 1
                    lo = _Side(x, e.h)
                    below.append(e)
                else:
                    illinois = illinois - 1 if illinois < 0 else -1
                    hi = _Side(x, e.h)
                    above.append(e)
            if hi.n_d - lo.n_d <= TOL * max(lo.n_d, 1e-2):
                # the bracket closed on a jump of h (the decode batch's padding, the grid's
                # coarsening), or on overload
                return best if hi.h is not None else None
            x, secant = _next_n_d(lo, hi, below, above, illinois, self.B, not rejected)
        return best  # not converged in MAX_CHAIN_EVALUATIONS: the point of least |h|


def _lost_trend(e: _Eval, lo: _Side, hi: _Side) -> bool:
    """``e`` kept the sign of the side it stepped from but not the residual's trend."""
    if e.h > 0 and lo.h is not None:
        return e.h >= lo.h
    if e.h < 0 and hi.h is not None:
        return e.h <= hi.h
    return False


def _next_n_d(
    lo: _Side,
    hi: _Side,
    below: list[_Eval],
    above: list[_Eval],
    illinois: int,
    budget: int,
    secant: bool,
) -> tuple[float, bool]:
    """Where ``n_d``'s next chain goes, and whether it is a secant step: a fixed-point
    step (``n_d + h``: it does not pass the root when the map rises with ``n_d``), sped
    up by the secant through the last two points of one side (at most :data:`GROW`
    steps) until the root is bracketed; then Illinois false position between two
    evaluated ends, or a fixed-point step limited to the bracket's middle when one end
    is only a bound (overload)."""
    if lo.h is not None and hi.h is not None:
        h_lo, h_hi = lo.h, hi.h  # Illinois: the end kept twice in a row counts half
        if illinois >= 2:
            h_hi *= 0.5 ** (illinois - 1)
        elif illinois <= -2:
            h_lo *= 0.5 ** (-illinois - 1)
        x = (lo.n_d * h_hi - hi.n_d * h_lo) / (h_hi - h_lo)
        return min(x, lo.n_d + GROW * lo.h), False  # the lowest root first
    if lo.h is not None:  # from below
        step = lo.h
        if secant and len(below) >= 2 and below[-2].h > below[-1].h:
            a, b = below[-2], below[-1]
            step = min(max(b.h * (b.n_d - a.n_d) / (a.h - b.h), lo.h), GROW * lo.h)
        cap = budget - 1 if math.isinf(hi.n_d) else hi.n_d
        step = min(step, 0.5 * (cap - lo.n_d))
        return lo.n_d + step, step > lo.h
    if hi.h is not None:  # from above
        step = hi.h
        if secant and len(above) >= 2 and above[-2].h < above[-1].h:
            a, b = above[-2], above[-1]
            step = max(min(b.h * (b.n_d - a.n_d) / (a.h - b.h), hi.h), GROW * hi.h)
        step = max(step, -0.5 * (hi.n_d - lo.n_d))
        return hi.n_d + step, step < hi.h
    return 0.5 * (lo.n_d + hi.n_d), False


def _plus_step_s(
    inst: Instance, prompts: PromptLaw, m: RequestMoments, chain: BacklogChain, decoders: float
) -> Arr:
    """``τ₊`` per state of ``chain``: its iteration with ``decoders + 1`` decodes (the
    request itself and the others), on the chain's grid and constant above ``B'``."""
    grid = chain.prompt_grid_tokens
    t = prefill_step_s(inst, m, prompts, prompt_tokens=grid, decode_seqs=decoders + 1)
    return per_state(t, chain.states)


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
    M/G/∞). The chain also "iterates" (decode-only, ``τ(0)``) through idle time, so its
    ``b̄`` is below the mean busy iteration at low load and ``n_d`` is low there
    (``n_d`` 1.2 vs 1.9 simulated for Mixtral-8x7B on 2×A100, ``code``, ρ = 0.3; the
    latencies stay within 8 %). ``decode_steps``/``decode_weights`` are the atoms of
    ``o − 1`` (all requests).

    The chain depends on ``n_d`` only, so the fixed point is solved nested
    (:class:`_FixedPoint`): on each chain ``N̄``'s equation (``τ₊`` changes with ``N̄``:
    step times, no chain); ``n_d``'s equation by a bracketed secant in ``n_d`` alone,
    each evaluation one chain; around both, the tagged request, which is costly: between
    its evaluations ``E[n·TPOT(n)]`` is taken as ``E[n]·E_∞ + excess`` (``E_∞ = π·τ₊``
    from the current chain, the excess ``E[Σ_{j≤n}(E_j − E_∞)]`` and ``E[TTFT]`` from the
    last tagged request), and after it the current ``n_d`` is evaluated again on its
    cached chain. The fixed point may not be unique — an MoE step grows fast with the
    decodes as more experts are read, and a second, spurious crossing lies above the
    physical one; near the critical rate the engine's padding of the decode batch makes
    ``b̄`` step with ``n_d`` and the residual cross zero several times (three crossings
    between 725 and 830 decodes for Llama-3.1-8B, 128/184 tokens, at 97 % of μ) — and
    the search finds the lowest, where a load rising from zero settles: the light-load
    guess and a lower rate's point are below it, its fixed-point steps do not pass it,
    its secant steps go at most :data:`GROW` fixed-point steps (8 passed the lowest
    crossing above; 4 is the largest that did not, with 1.07-1.7x fewer chains than the
    old iteration), a secant step that keeps the residual's sign but not its trend is
    not taken, and a bracket's false position is held to the same reach from its low
    end. Overload (no recurrent chain) is a bound, not instability (the old
    per-coordinate iteration overshot into it and called such rates unstable). Which
    crossing is found is itself a tolerance near μ: goodputs there move by up to 5 %
    against that iteration's (42 of 400 cells of a 20 × 20 length diagram, none
    changing regime).

    ``warm``: the point at a lower rate of the same instance and workload (continuation in
    the rate: a search evaluates nearby rates one after another); it starts from the
    larger of its point and the light-load guess (both below the root: the decode
    population grows with the rate); a point at a rate ``≥ rate_per_s`` is not used.
    """
    lam, B = rate_per_s, max_batched_tokens
    ctx = m.decode_context_tokens / max(m.decode_steps, 1e-12)
    one = float(inst.iteration_s(decode_only(1.0, ctx, 1))[0])
    pos = decode_steps >= 1
    w_n = decode_weights[pos]
    n_pos = decode_steps[pos]
    n_d = lam * one * m.decode_steps
    fp = _FixedPoint(
        inst, prompts, m, rate_per_s=lam, max_batched_tokens=B,
        mean_steps=float(np.dot(w_n, n_pos)), levels=4,
    )  # fmt: skip
    if warm is not None and warm.chain.rate_per_s < lam:
        n_d = max(n_d, warm.chain.decode_seqs)
        fp.excess, fp.ttft, fp.levels = warm.excess_s, warm.ttft_s, warm.chain.levels
    point: OperatingPoint | None = None
    start: TaggedStart | None = None  # the last chain's, for the next tagged request
    for _ in range(20):
        e = fp.solve(n_d)
        if e is None:
            return None
        if start is None or start.chain is not e.chain:
            start = TaggedStart(e.chain)
        tag = tagged_request(e.chain, decode_step_s=e.tau_plus, max_steps=max_steps, start=start)
        tpot = tag.mean_tpot_s(np.maximum(decode_steps, 1.0))
        ttft = e.busy * tag.residual_s + tag.full_wait_s + tag.last_prefill_s
        excess = float(np.dot(w_n, n_pos * (tpot[pos] - e.e_inf)))
        point = OperatingPoint(e.chain, tag, e.tau_plus, e.decoders, e.busy, ttft, tpot, excess)
        if (
            abs(lam * (excess - fp.excess)) <= TOL * max(e.decoders, 1e-2)
            and abs(ttft - fp.ttft) <= TOL * ttft
        ):
            break
        fp.excess, fp.ttft, n_d = excess, ttft, e.n_d
    return point
