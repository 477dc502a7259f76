"""Cache hit-rate models for experts and adapters, and the exact simulations that check them.

Distinct experts per batch
    Each token of a batch of ``B`` picks ``k`` distinct experts of ``E``; expert ``i``
    is picked by one token with probability ``π_i`` (``Σ π_i = k``). Tokens route
    independently, so the expected number of distinct experts the batch touches is
    exactly ``D(B) = Σ_i (1 − (1 − π_i)^B)``; uniform routing (``π_i = k/E``) gives
    ``D(B) = E·(1 − (1 − k/E)^B)`` (seed_claims.md, "Expert offloading").

Inclusion probabilities of skewed routing
    Routing by popularity ``p`` draws the ``k`` experts without replacement ∝ ``p``
    (Plackett–Luce, the Gumbel-top-k sampler of :mod:`perfmodel.routing`). With keys
    ``X_j = log p_j + Gumbel``, ``U_i = e^{−X_i} ~ Exp(p_i)`` and, given ``U_i = u``,
    another expert beats ``i`` with probability ``1 − e^{−p_j u}``; so
    ``π_i = ∫_0^∞ p_i e^{−p_i u} · P(N_{−i}(u) ≤ k − 1) du`` (``N_{−i}`` Poisson-binomial),
    evaluated by Gauss–Legendre quadrature in ``log u`` (``k = 1`` gives ``π = p``).

Static-optimal residency
    Keep the ``C`` most popular objects: hit ratio ``Σ_{top C} λ_i / Σ λ_i`` — the
    best any policy can do under independent requests (IRM).

LRU: Che's approximation (Che, Tung, Wang, JSAC 2002; Fricker, Robert, Roberts 2012)
    The characteristic time ``T_C`` solves ``Σ_i (1 − e^{−λ_i T_C}) = C``; object ``i``
    hits with probability ``h_i = 1 − e^{−λ_i T_C}``; the hit ratio is
    ``Σ λ_i h_i / Σ λ_i`` (formal_models.md §6.4, test T11).
    *Per-step* form for expert caches: a step activates expert ``i`` with probability
    ``a_i = 1 − (1 − π_i)^B`` and all of a step's experts are used together; with
    Bernoulli instead of Poisson arrivals, ``T`` (steps) solves
    ``Σ_i (1 − (1 − a_i)^T) = C`` and ``h_i = 1 − (1 − a_i)^T``.

Everything is checked against exact LRU simulations (:func:`simulate_lru`,
:func:`simulate_lru_steps`) in the tests.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from perfmodel.errors import SpecError
from perfmodel.model import ModelSpec
from perfmodel.moe.routing import expert_popularity

Arr = NDArray[np.float64]


_QUAD_NODES = 96


def _rates(rates: ArrayLike, what: str = "popularity") -> Arr:
    r = np.asarray(rates, dtype=np.float64).ravel()
    if r.size == 0:
        raise SpecError(f"{what} is empty; give one value per object")
    if not np.all(np.isfinite(r)) or np.any(r < 0):
        raise SpecError(f"{what} must be finite and >= 0")
    if r.sum() <= 0:
        raise SpecError(
            f"{what} is zero for every object (a zero-popularity catalog has no requests "
            "to cache); give at least one positive count or rate"
        )
    return r


def _capacity(capacity: float, n: int) -> float:
    if not (np.isfinite(capacity) and capacity >= 0):
        raise SpecError(f"cache capacity must be >= 0 objects, got {capacity}")
    return float(capacity)


def step_activation(activation: ArrayLike, tokens: float) -> Arr:
    """``a_i = 1 − (1 − π_i)^B``: probability a step of ``B`` tokens uses expert ``i``."""
    pi = np.minimum(np.asarray(activation, dtype=np.float64), 1.0)
    if tokens < 0:
        raise SpecError("tokens per step must be >= 0")
    return 1.0 - (1.0 - pi) ** float(tokens)


def inclusion_probabilities(popularity: ArrayLike, top_k: int) -> Arr:
    """``π_i``: probability a token's top-k (Plackett–Luce ∝ ``p``) includes expert ``i``.

    Quadrature of ``∫ p_i e^{−p_i u} P(N_{−i}(u) ≤ k−1) du`` over log-spaced ``u`` with
    the Poisson-binomial tail computed by dynamic programming (module docstring).
    ``Σ π_i = k``.
    """
    p = _rates(popularity, "expert popularity")
    p = p / p.sum()
    pos = np.flatnonzero(p > 0)
    if not (isinstance(top_k, int | np.integer) and top_k >= 1):
        raise SpecError(f"top_k must be a positive integer, got {top_k!r}")
    if top_k > pos.size:
        raise SpecError(
            f"top-{top_k} routing needs at least {top_k} experts with positive popularity, "
            f"got {pos.size}"
        )
    out = np.zeros_like(p)
    if top_k == pos.size:
        out[pos] = 1.0
        return out
    k = int(top_k)
    ps = p[pos]
    u_lo, u_hi = _quadrature_range(ps, k)
    x, w = np.polynomial.legendre.leggauss(_QUAD_NODES)
    half = 0.5 * (np.log(u_hi) - np.log(u_lo))
    u = np.exp(np.log(u_lo) + half * (x + 1.0))  # nodes in u, log-spaced
    g = np.ones((ps.size, u.size, 1)) * np.eye(1, k)[None]  # P(N_{-i} = m), m < k
    for j, pj in enumerate(ps):
        q = np.broadcast_to(-np.expm1(-pj * u), (ps.size, u.size)).copy()
        q[j] = 0.0  # expert i does not compete with itself
        new = g * (1.0 - q)[..., None]
        new[..., 1:] += g[..., :-1] * q[..., None]
        g = new
    tail = g.sum(axis=-1)  # P(N_{-i}(u) <= k - 1)
    # density of U_i in log u: p u e^{-p u}; below u_lo the tail is 1 (exactly integrated)
    dens = ps[:, None] * u[None, :] * np.exp(-ps[:, None] * u[None, :])
    out[pos] = -np.expm1(-ps * u_lo) + half * (dens * tail) @ w
    return out


def _poibin_cdf(q: Arr, k: int) -> float:
    """P(at most k successes) of independent Bernoulli(q)."""
    d = np.zeros(k + 1)
    d[0] = 1.0
    for qj in q:
        d[1:] = d[1:] * (1.0 - qj) + d[:-1] * qj
        d[0] *= 1.0 - qj
    return float(d.sum())


def _quadrature_range(p: Arr, k: int) -> tuple[float, float]:
    """[u_lo, u_hi] holding all but ~1e-13 of every expert's inclusion integral."""
    u_hi = 1.0
    while _poibin_cdf(-np.expm1(-p * u_hi), k) > 1e-14:
        u_hi *= 2.0
        if u_hi > 1e18:  # pragma: no cover - p sums to 1, so this never triggers
            break
    u_lo = 1e-7 / float(p.max())
    return u_lo, u_hi


def static_hit_ratio(rates: ArrayLike, capacity: float) -> float:
    """Hit ratio of keeping the ``capacity`` most popular objects (fractional: linear)."""
    r = _rates(rates)
    c = _capacity(capacity, r.size)
    srt = np.sort(r)[::-1]
    n = min(int(np.floor(c)), srt.size)
    hit = srt[:n].sum() + (srt[n] * (c - n) if n < srt.size else 0.0)
    return float(min(hit / srt.sum(), 1.0))


@dataclass(frozen=True)
class CheResult:
    """Che's approximation: characteristic time, per-object and overall hit ratio."""

    characteristic_time: float  # in units of 1/rate (steps for the per-step form); inf if all fit
    hit_prob: Arr  # per object
    hit_ratio: float  # request-weighted
    miss_rate: float  # Σ λ_i (1 − h_i): misses per unit time (per step)


def _solve_t(filled: Callable[[float], float], capacity: float) -> float:
    """The ``T`` where the expected number of resident objects ``filled(T)`` is ``capacity``."""
    from scipy.optimize import brentq

    hi = 1.0
    while filled(hi) < capacity:
        hi *= 2.0
        if hi > 1e300:  # pragma: no cover - guarded by the capacity < objects check
            raise SpecError("Che characteristic time did not converge")
    return float(brentq(lambda t: filled(t) - capacity, 0.0, hi, xtol=1e-12, rtol=1e-12))


def _trivial(lam: Arr, c: float) -> CheResult | None:
    """The cache that holds every requested object (all hits), or nothing (all misses)."""
    if c >= int(np.count_nonzero(lam)):
        return CheResult(float("inf"), (lam > 0).astype(float), 1.0, 0.0)
    if c == 0:
        return CheResult(0.0, np.zeros_like(lam), 0.0, float(lam.sum()))
    return None


def che_lru(rates: ArrayLike, capacity: float) -> CheResult:
    """LRU under independent Poisson requests at ``rates`` (Che's approximation)."""
    lam = _rates(rates, "request rates")
    c = _capacity(capacity, lam.size)
    if (done := _trivial(lam, c)) is not None:
        return done
    t = _solve_t(lambda x: float(np.sum(-np.expm1(-lam * x))), c)
    h = -np.expm1(-lam * t)
    return CheResult(t, h, float(lam @ h / lam.sum()), float(lam @ (1.0 - h)))


def che_lru_steps(step_probs: ArrayLike, capacity: float) -> CheResult:
    """LRU of a cache used in steps: object ``i`` is needed in a step with prob. ``a_i``.

    Bernoulli form of Che: ``Σ_i (1 − (1 − a_i)^T) = C``, ``h_i = 1 − (1 − a_i)^T``;
    ``miss_rate`` is the expected number of misses (fetches) per step.
    """
    a = _rates(step_probs, "step activation probabilities")
    if np.any(a > 1 + 1e-12):
        raise SpecError("step activation probabilities must be <= 1")
    a = np.minimum(a, 1.0)
    c = _capacity(capacity, a.size)
    if (done := _trivial(a, c)) is not None:
        return done
    always = a >= 1.0
    if always.sum() >= c:
        # The cache cannot even hold the experts every step needs: only C stay, and an
        # LRU order refreshed every step keeps C of the always-used ones resident.
        h = np.where(always, c / always.sum(), 0.0)
        return CheResult(1.0, h, float(a @ h / a.sum()), float(a @ (1.0 - h)))
    log1m = np.log1p(-np.where(always, 0.0, a))

    def filled(t: float) -> float:
        return float(np.sum(np.where(always, 1.0, -np.expm1(log1m * t))))

    t = _solve_t(filled, c)
    h = np.where(always, 1.0, -np.expm1(log1m * t))
    return CheResult(t, h, float(a @ h / a.sum()), float(a @ (1.0 - h)))


@dataclass(frozen=True)
class SimResult:
    """Exact cache simulation: hits and requests after the warm-up."""

    hits: int
    requests: int
    steps: int

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.requests if self.requests else 0.0

    @property
    def misses_per_step(self) -> float:
        return (self.requests - self.hits) / self.steps if self.steps else 0.0


def irm_requests(rates: ArrayLike, n: int, rng: np.random.Generator) -> NDArray[np.int64]:
    """``n`` independent requests, object ``i`` with probability ∝ ``rates[i]``."""
    r = _rates(rates)
    return rng.choice(r.size, size=n, p=r / r.sum()).astype(np.int64)


def simulate_lru(requests: Iterable[int], capacity: int, *, warmup: int = 0) -> SimResult:
    """Exact LRU of ``capacity`` equal-size objects over a request sequence."""
    if capacity < 0:
        raise SpecError(f"cache capacity must be >= 0, got {capacity}")
    cache: OrderedDict[int, None] = OrderedDict()
    hits = reqs = 0
    for n, x in enumerate(requests):
        hit = x in cache
        if hit:
            cache.move_to_end(x)
        elif capacity > 0:
            cache[x] = None
            if len(cache) > capacity:
                cache.popitem(last=False)
        if n >= warmup:
            reqs += 1
            hits += hit
    return SimResult(hits, reqs, reqs)


def simulate_lru_steps(
    steps: Iterable[Iterable[int]], capacity: int, *, warmup: int = 0
) -> SimResult:
    """Exact LRU where each step needs a set of objects at once (an MoE layer's experts).

    A step's objects hit if resident at its start; afterwards they are all most-recent
    (in their given order) and the least recently used are evicted down to ``capacity``.
    """
    if capacity < 0:
        raise SpecError(f"cache capacity must be >= 0, got {capacity}")
    cache: OrderedDict[int, None] = OrderedDict()
    hits = reqs = n_steps = 0
    for n, need in enumerate(steps):
        need = list(need)
        h = sum(1 for x in need if x in cache)
        for x in need:
            cache[x] = None
            cache.move_to_end(x)
        while len(cache) > capacity:
            cache.popitem(last=False)
        if n >= warmup:
            hits += h
            reqs += len(need)
            n_steps += 1
    return SimResult(hits, reqs, n_steps)


def simulate_static_steps(steps: Iterable[Iterable[int]], resident: Iterable[int]) -> SimResult:
    """Hits of a fixed resident set over steps of needed objects."""
    res = set(resident)
    hits = reqs = n = 0
    for need in steps:
        need = list(need)
        hits += sum(1 for x in need if x in res)
        reqs += len(need)
        n += 1
    return SimResult(hits, reqs, n)


def activation_from_counts(counts: ArrayLike, tokens: ArrayLike) -> Arr:
    """Per-token activation probability of each expert from recorded counts.

    ``counts`` is (rows, E) token rows per expert, ``tokens`` the tokens of each row;
    ``π_i = Σ counts_i / Σ tokens`` (counts of a token's top-k are distinct experts, so
    ``π_i <= 1``). Raises on an all-zero record.
    """
    c = np.asarray(counts, dtype=np.float64)
    t = np.asarray(tokens, dtype=np.float64).ravel()
    if c.ndim != 2 or c.shape[0] != t.size:
        raise SpecError("counts must be (rows, experts) with one token count per row")
    _rates(c.sum(axis=0), "recorded expert counts")
    if t.sum() <= 0:
        raise SpecError("recorded counts have zero tokens; check the top-k given for the CSV")
    pi = c.sum(axis=0) / t.sum()
    if np.any(pi > 1 + 1e-9):
        raise SpecError(
            "an expert received more rows than there were tokens; top_k is wrong for this CSV"
        )
    return np.minimum(pi, 1.0)


def popularity_activation(model: ModelSpec, zipf_exponent: float, *, seed: int = 0) -> Arr:
    """π per token for Zipf(``s``)-popular experts (ranks seeded-permuted, as in routing)."""
    if model.moe is None:
        raise SpecError(f"{model.id} is not a mixture-of-experts model")
    p = expert_popularity(model.moe.num_experts, dist="zipf", exponent=zipf_exponent, seed=seed)
    return inclusion_probabilities(p, model.moe.top_k)
