"""The prefill backlog of a continuous-batching engine as a Markov chain over iterations.

Chunked prefill with a token budget ``B`` per iteration serves prompts FIFO: each
iteration carries its ``n_d`` decodes and up to ``B' = B − n_d`` prompt tokens from the
front of the queue. Let ``U_k`` be the prompt tokens waiting (or part-done) at the start
of iteration ``k``. The iteration carries ``P_k = min(U_k, B')`` of them and lasts
``τ(P_k)`` (``perfmodel.step.step_time`` of ``n_d`` decodes and ``P_k`` prompt tokens);
the prompts that arrive meanwhile (Poisson, rate ``λ``) join the queue::

    U_{k+1} = U_k − min(U_k, B') + A_k,   A_k ~ compound Poisson(λ·τ(P_k), prompt sizes)

— a bulk-service queue observed at iteration starts (Bailey 1954; Chaudhry & Templeton,
*A First Course in Bulk Queues*, 1983), with a service time that depends on the
batch. On a grid of ``δ = B'/G`` tokens it is a finite Markov chain; its stationary law
``π`` (per iteration) gives the iteration mix. Prompt sizes are put on the grid by
splitting each atom's mass between its two neighbours (keeps ``E[s]``).

**Tagged request** (Palm calculus). A Poisson arrival finds iteration ``k`` in state ``u``
with probability ``π(u)·τ(u)/E_π[τ]`` (PASTA: time-stationary), at a uniform position
``v`` in it (Gauss–Legendre quadrature over ``v``). By the Slivnyak–Mecke theorem the
other arrivals of that iteration are an independent compound Poisson stream, split at
``v`` into ``A_before ~ CP(λvτ)`` and ``A_after ~ CP(λ(1 − v)τ)``. FIFO, so the request
(``s`` tokens) waits for ``Y = (u − P(u)) + A_before + s`` tokens: it gets its first token
at the end of iteration ``k + m``, ``m = ⌈Y/B'⌉``. Iterations ``k+1 … k+m−1`` are full
(``τ(B')``), and the state at the start of ``k+1`` is ``Z = Y + A_after``, so the state
at the start of its last prefill iteration is ``Z`` moved ``m − 1`` steps by the chain
(those steps are exactly ``U → U − B' + A``). Hence

    E[TTFT] = P(busy)·E_π[τ²]/(2E_π[τ]) + E[(m − 1)]·τ(B') + E[τ(P) at that state],

and the law of the state one step later is where its decode steps start: its ``j``-th
decode iteration has mean ``ξ·T^{j−1}·τ₊`` (``ξ`` that law, ``T`` the transition matrix,
``τ₊`` the step time with the request itself among the decodes). Short outputs decode
right behind the prompts that queued up during their own wait — the iterations a
decoding request sees carry prefill more often than the average iteration.

Numerics: ``π`` from one linear solve (:mod:`perfmodel.serving.stationary`); ``G = 32`` points per
budget (64 moves the latency means by < 0.5 %), halved when the backlog spans more than
``COARSE_LEVELS`` budgets; the decode profile is followed for ``PROFILE_STEPS``
iterations and then extrapolated geometrically; for ``m ≥ 2`` the arrivals after the
request in its arrival iteration use the rate averaged over ``(u, v)`` given ``m``.

Assumptions, stated once: ``n_d`` is fixed at its mean (Little); prompt lengths are
independent of output lengths in the tagged computation; a prompt may take the whole
remaining budget in one iteration (chunk ``C ≥ B'``; a smaller ``C`` is applied in
:mod:`perfmodel.latency`); the step time of ``P`` prompt tokens takes them as one prompt
if ``P ≤ ℓ = E[s²]/E[s]`` (length-biased mean) and as ``P/ℓ`` prompts of ``ℓ`` otherwise
(this sets the attention pairs and logit rows only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import partial

import numpy as np
from numpy.typing import ArrayLike, NDArray

from perfmodel.serving.chain_tail import TAIL_MASS, regrown_levels, tail_rate
from perfmodel.serving.compound_poisson import compound_poisson, fft_size
from perfmodel.serving.servemix import RequestMoments
from perfmodel.serving.stationary import stationary
from perfmodel.step.batch import Batch
from perfmodel.step.instance import Instance
from perfmodel.workload.lengths import LengthDistribution, distinct_weights

Arr = NDArray[np.float64]


GRID_PER_BUDGET = 32  # G: grid points per budget B' (64 changes the means by < 0.5 %)


MAX_LEVELS = 128  # the state space is at most this many budgets


V_NODES = 4  # Gauss–Legendre nodes for the arrival position (8 moves the means < 0.1 %)


PROFILE_STEPS = 150  # decode iterations followed exactly (then a geometric tail)


COARSE_LEVELS = 24  # beyond this many budgets of backlog, G is halved


def grid_pmf(values: NDArray[np.int64], weights: Arr, grid_tokens: float) -> Arr:
    """Prompt sizes on the grid ``0, δ, 2δ, …``, each atom split between its neighbours."""
    x = values.astype(np.float64) / grid_tokens
    lo = np.floor(x).astype(np.int64)
    frac = x - lo
    n = int(lo.max()) + 2
    f = np.bincount(lo, weights=weights * (1 - frac), minlength=n)
    f += np.bincount(lo + 1, weights=weights * frac, minlength=n)
    return f / f.sum()


@dataclass(frozen=True)
class PromptLaw:
    """The prompt-length marginal: distinct lengths, their probabilities and two moments."""

    tokens: NDArray[np.int64]
    weights: Arr
    mean_tokens: float  # E[s]
    biased_mean_tokens: float  # ℓ = E[s²]/E[s]: mean length of the prompt a token is in


def prompt_law(lengths: LengthDistribution) -> PromptLaw:
    """The marginal law of the input lengths of ``lengths``."""
    u, w = distinct_weights(lengths.input_tokens, lengths.weights)
    s = u.astype(np.float64)
    mean = float(w @ s)
    return PromptLaw(u, w, mean, float(w @ (s * s)) / mean)


class Transition:
    """``x ↦ x·T`` without forming ``T`` (``n × n``): rows ``i ≤ G`` are the arrival laws
    ``A_i`` of an iteration carrying ``i·δ`` prompt tokens; a row ``i > G`` is ``A_G``
    shifted by ``i − G`` (a full iteration serves ``B'`` and leaves ``U − B'``), applied as
    one FFT convolution. Mass beyond the grid is lumped at its top state.
    """

    def __init__(self, arrivals: Arr) -> None:
        self.arrivals = arrivals  # (G + 1, n)
        self.per_budget = arrivals.shape[0] - 1
        self.states = arrivals.shape[1]
        self._size = fft_size(2 * self.states)
        self._full_hat = np.fft.rfft(arrivals[-1], self._size)
        self._back_size = fft_size(2 * self.states)  # backward: no wrap below 2n
        self._back_hat: NDArray[np.complex128] | None = None  # conj(Â_G), when first asked

    def __call__(self, x: Arr) -> Arr:
        """``x·T`` for a law (a non-negative row vector, or the rows of a 2-D array) over
        the states: the FFT's round-off below zero is clipped, which a signed vector
        would not survive (its products go through :meth:`backward`: ``(x·T)·f = x·(T·f)``)."""
        G, n = self.per_budget, self.states
        # an explicit product-sum (no BLAS call: its threads stall on a busy machine)
        y = (x[..., : G + 1, None] * self.arrivals).sum(axis=-2)
        tail = np.zeros((*x.shape[:-1], n - G))
        tail[..., 1:] = x[..., G + 1 :]  # state G + k leaves k grid steps
        conv = np.fft.irfft(np.fft.rfft(tail, self._size) * self._full_hat, self._size)
        y += np.maximum(conv[..., :n], 0.0)
        y[..., -1] += np.maximum(conv[..., n:], 0.0).sum(axis=-1)
        return y

    def backward(self, f: Arr) -> Arr:
        """``T·f`` for a function over the states: ``(T·f)(i) = E[f(U_{k+1}) | U_k = i]``."""
        G, n = self.per_budget, self.states
        out = np.empty(n)
        out[: G + 1] = self.arrivals @ f
        # state G + k leaves k grid steps: E[f(min(k + A, n − 1))], a correlation with A_G:
        # corr[k] = Σ_t A_G[t]·f_ext[t + k] reads f_ext below 2n − G − 1 for the k ≤ n − G − 1
        # kept, so a circular correlation on 2n points wraps none of them
        f_ext = np.concatenate([f, np.full(n, f[-1])])
        size = self._back_size
        if self._back_hat is None:
            self._back_hat = np.conj(np.fft.rfft(self.arrivals[-1], size))
        corr = np.fft.irfft(self._back_hat * np.fft.rfft(f_ext, size), size)
        out[G + 1 :] = corr[1 : n - G]
        return out


def per_state(at_grid: Arr, states: int) -> Arr:
    """A function of ``P = min(U, B')``, given at the grid's ``G + 1`` points
    ``0, δ, …, B'``, at every state ``U`` of a chain of ``states`` (constant above ``B'``)."""
    G = at_grid.size - 1
    return np.concatenate([at_grid, np.full(states - G - 1, at_grid[G])])


@dataclass(frozen=True)
class BacklogChain:
    """The prefill-backlog chain at one operating point (see the module docstring)."""

    rate_per_s: float
    decode_seqs: float  # n_d
    budget_tokens: float  # B' = B − n_d
    grid_tokens: float  # δ = B'/G
    per_budget: int  # G
    step_s: Arr  # τ(min(U, B')) per state
    prompt_pmf: Arr  # prompt sizes on the grid
    transition: Transition  # x ↦ x·T
    stationary: Arr  # π (per iteration)
    plus_step_s: Arr | None = None  # τ at P = 0, δ, …, B' with backlog_chain's plus decodes
    wanted_levels: int = 0  # > 0: the tail needs this many budgets, past solve_chain's max

    @property
    def states(self) -> int:
        return int(self.stationary.size)

    @property
    def prompt_grid_tokens(self) -> Arr:
        """``P = 0, δ, …, B'``: the prompt tokens an iteration may carry, on the grid."""
        return np.arange(self.per_budget + 1, dtype=np.float64) * self.grid_tokens

    @property
    def levels(self) -> int:
        """Budgets ``B'`` the grid spans."""
        return (self.states - 1) // self.per_budget

    @property
    def mean_step_s(self) -> float:
        """``E_π[τ]``: the mean iteration time (per iteration)."""
        return float(self.stationary @ self.step_s)

    @property
    def mean_residual_s(self) -> float:
        """``E_π[τ²]/(2E_π[τ])``: mean remaining time of the iteration a random instant sees."""
        return float(self.stationary @ self.step_s**2) / (2 * self.mean_step_s)

    @property
    def prefill_fraction(self) -> float:
        """Fraction of iterations carrying prompt tokens: ``1 − π(0)``."""
        return float(1.0 - self.stationary[0])

    @property
    def full_fraction(self) -> float:
        """Fraction of iterations whose prompt tokens fill the budget: ``π(U ≥ B')``."""
        return float(self.stationary[self.per_budget :].sum())


def prefill_step_s(
    inst: Instance,
    m: RequestMoments,
    prompts: PromptLaw,
    *,
    prompt_tokens: ArrayLike,
    decode_seqs: ArrayLike,
) -> Arr:
    """``τ(P)``: iteration time with ``decode_seqs`` decodes (one count, or one per
    ``P``) and ``P`` prompt tokens."""
    ell = prompts.biased_mean_tokens
    p = np.asarray(prompt_tokens, dtype=np.float64)
    per_prompt = np.minimum(p, ell)  # tokens of one prompt in the iteration
    ctx = m.decode_context_tokens / max(m.decode_steps, 1e-12)
    kv_per_token = m.prefill_kv_read_tokens / m.input_tokens
    n_d = np.asarray(decode_seqs, dtype=np.float64)
    batch = Batch(
        prefill_tokens=p,
        prefill_seqs=np.where(p > 0, np.maximum(p / ell, 1.0), 0.0),
        prefill_pairs=p * (per_prompt + 1) / 2,
        prefill_kv_read=p * kv_per_token,
        decode_seqs=np.broadcast_to(n_d, p.shape).copy(),
        decode_context=np.broadcast_to(n_d * ctx, p.shape).copy(),
    )
    return np.asarray(inst.iteration_s(batch), dtype=np.float64)


def backlog_chain(
    inst: Instance,
    prompts: PromptLaw,
    m: RequestMoments,
    *,
    rate_per_s: float,
    decode_seqs: float,
    max_batched_tokens: int,
    per_budget: int = GRID_PER_BUDGET,
    min_levels: int = 4,
    plus_decode_seqs: float | None = None,
) -> BacklogChain | None:
    """The stationary chain, or ``None`` when the prompts alone overload full iterations.

    The chain is positive recurrent iff the prompt tokens arriving during a full iteration
    are fewer than it serves: ``λ·τ(B')·E[s] < B'`` (the drift of ``U`` above ``B'``).
    The grid covers enough budgets that the top one holds < ``TAIL_MASS`` of ``π``
    (at most ``MAX_LEVELS``; beyond, the backlog is lumped at the top of the grid).
    ``plus_decode_seqs``: also tabulate ``τ`` with that many decodes on the same grid
    (:attr:`BacklogChain.plus_step_s`, one step-time evaluation for both).
    """
    lam = rate_per_s
    b_prime = max(max_batched_tokens - decode_seqs, 1.0)
    G = per_budget
    delta = b_prime / G
    f = grid_pmf(prompts.tokens, prompts.weights, delta)
    grid = np.arange(G + 1) * delta
    both = prefill_step_s(
        inst,
        m,
        prompts,
        prompt_tokens=grid if plus_decode_seqs is None else np.concatenate([grid, grid]),
        decode_seqs=decode_seqs
        if plus_decode_seqs is None
        else np.repeat([decode_seqs, plus_decode_seqs], G + 1),
    )
    tau, plus = both[: G + 1], (None if plus_decode_seqs is None else both[G + 1 :])
    # near the compute edge the backlog spans many budgets: halve the grid (every other
    # point of the same τ) so the state space stays ≤ MAX_LEVELS·G/2 + 1 — when the drift
    # says so before a solve, or when a solve's tail asks for more than COARSE_LEVELS
    drift = lam * tau[G] * prompts.mean_tokens / b_prime
    halvable = G % 2 == 0 and drift < 1

    def halved() -> tuple[int, float, Arr, Arr | None, Arr]:
        return (
            G // 2, 2 * delta, tau[::2], None if plus is None else plus[::2],
            grid_pmf(prompts.tokens, prompts.weights, 2 * delta),
        )  # fmt: skip

    if halvable and start_levels(min_levels, f.size, G, drift) > COARSE_LEVELS:
        G, delta, tau, plus, f = halved()
        halvable = False
    solve = partial(solve_chain, rate_per_s=lam, decode_seqs=decode_seqs, budget_tokens=b_prime)
    cap = COARSE_LEVELS if halvable else MAX_LEVELS
    chain = solve(tau, f, min_levels=min_levels, max_levels=cap)
    if chain is not None and chain.wanted_levels:
        G, delta, tau, plus, f = halved()
        chain = solve(tau, f, min_levels=chain.wanted_levels)
    return chain if chain is None or plus is None else replace(chain, plus_step_s=plus)


def start_levels(min_levels: int, prompt_steps: int, per_budget: int, drift: float) -> int:
    """Budgets of a chain's first grid: ``min_levels``, twice the budgets a prompt spans
    (``prompt_steps`` grid steps) plus 2, and the backlog's mean above ``B'``, about
    ``1/(1 − drift)`` budgets, twice over (at most :data:`MAX_LEVELS`)."""
    by_prompt = 2 * math.ceil(prompt_steps / per_budget) + 2
    return max(min_levels, by_prompt, min(math.ceil(2 / (1 - drift)), MAX_LEVELS))


def solve_chain(
    step_s: ArrayLike,
    prompt_pmf: Arr,
    *,
    rate_per_s: float,
    decode_seqs: float,
    budget_tokens: float,
    min_levels: int = 4,
    max_levels: int = MAX_LEVELS,
) -> BacklogChain | None:
    """The chain from its inputs on the grid: ``τ`` at ``P = 0, δ, …, B'`` (``G + 1``
    values, ``δ = B'/G``) and the prompt-size pmf on the grid; None if not recurrent.
    ``max_levels`` below :data:`MAX_LEVELS`: a grid regrown past it is not solved; the
    chain solved last says how many budgets the next would have
    (:attr:`BacklogChain.wanted_levels`)."""
    lam, tau, f = rate_per_s, np.asarray(step_s, dtype=np.float64), prompt_pmf
    G = tau.size - 1
    drift = lam * tau[G] * float(np.dot(np.arange(f.size), f)) / G
    if drift >= 1:
        return None
    # the backlog above B' is a random walk with drift −(1 − drift)·G per iteration: its
    # stationary mean is O(1/(1 − drift)) budgets; start there and regrow the grid by its
    # tail (regrown_levels) until the top budget holds a negligible mass
    levels = start_levels(min_levels, f.size, G, drift)
    theta: float | None = None  # the tail's decay rate, if a grid is regrown
    wanted = 0
    while True:
        n = levels * G + 1
        arrivals = compound_poisson(lam * tau, f, n)
        pi = stationary(arrivals)
        if pi[n - G :].sum() < TAIL_MASS or levels >= MAX_LEVELS:
            break
        if theta is None:
            theta = tail_rate(lam * float(tau[G]), f, G)
        nxt = min(regrown_levels(pi, levels, G, theta), MAX_LEVELS)
        if nxt > max_levels:
            wanted = nxt
            break
        levels = nxt
    return BacklogChain(
        rate_per_s=lam,
        decode_seqs=decode_seqs,
        budget_tokens=budget_tokens,
        grid_tokens=budget_tokens / G,
        per_budget=G,
        step_s=per_state(tau, n),
        prompt_pmf=f,
        transition=Transition(arrivals),
        stationary=pi,
        wanted_levels=wanted,
    )
