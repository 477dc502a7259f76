"""The tagged request of the prefill backlog chain: its wait, its first chunk and its TTFT."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from perfmodel.serving.compound_poisson import cp_transform, fft_size
from perfmodel.serving.prefill_chain import PROFILE_STEPS, V_NODES, BacklogChain

Arr = NDArray[np.float64]


def _lump(z: Arr, n: int) -> Arr:
    """``z`` (non-negative part) on ``0 … n−1`` with the mass beyond lumped at ``n − 1``."""
    z = np.maximum(z, 0.0)
    out = z[:n].copy()
    out[-1] += z[n:].sum()
    return out


#: ``numpy.polynomial.legendre.leggauss(4)`` to the bit (tests/unit/test_tagged_nodes.py):
#: the 4-node rule without importing ``numpy.polynomial`` at start-up
_LEGGAUSS_4 = (
    (-0.8611363115940526, -0.33998104358485626, 0.33998104358485626, 0.8611363115940526),
    (0.34785484513745357, 0.6521451548625464, 0.6521451548625464, 0.34785484513745357),
)


def gauss_legendre(n: int) -> tuple[Arr, Arr]:
    """Gauss–Legendre nodes and weights on ``[−1, 1]`` (``numpy``'s ``leggauss``)."""
    if n == 4:
        return np.array(_LEGGAUSS_4[0]), np.array(_LEGGAUSS_4[1])
    x, w = np.polynomial.legendre.leggauss(n)
    return np.asarray(x, dtype=np.float64), np.asarray(w, dtype=np.float64)


@dataclass(frozen=True)
class TaggedRequest:
    """What a typical request sees (see the module docstring)."""

    residual_s: float  # E_π[τ²]/(2E_π[τ]) (before the busy probability)
    full_iterations: float  # E[m − 1]: full iterations before its last prefill iteration
    full_wait_s: float  # E[m − 1]·τ(B')
    last_prefill_s: float  # E[τ] of the iteration that emits its first token
    decode_step_s: Arr  # E_j, the mean time of its j-th decode iteration, j = 1 … J
    stationary_step_s: float  # E_∞, the limit of E_j
    tail_ratio: float = 0.0  # E_j − E_∞ = (E_J − E_∞)·r^{j−J} for j > J
    start_law: Arr = field(default_factory=lambda: np.zeros(0), repr=False)  # ξ: state of
    # the chain at its first decode iteration

    def mean_tpot_s(self, decode_steps: Arr) -> Arr:
        """``(1/n)·Σ_{j≤n} E_j`` for each ``n`` in ``decode_steps`` (``n ≥ 1``)."""
        e, lim, r = self.decode_step_s, self.stationary_step_s, self.tail_ratio
        cum = np.concatenate([[0.0], np.cumsum(e)])
        n = np.asarray(decode_steps, dtype=np.float64)
        k = np.minimum(n, e.size).astype(np.int64)
        extra = n - k  # steps beyond the computed profile
        excess = (e[-1] - lim) * r * (1 - r**extra) / (1 - r) if r > 0 else 0.0 * n
        return (cum[k] + extra * lim + excess) / n


def _position_transforms(
    rates: Arr, v: Arr, F: NDArray[np.complex128]
) -> tuple[NDArray[np.complex128], NDArray[np.complex128]]:
    """The transforms of ``CP(r·v_j)`` and ``CP(r·(1 − v_j))`` (the arrivals before and
    after a position ``v_j`` of an iteration with ``r`` expected arrivals), for every
    ``r`` in ``rates`` (axis 0) and position in ``v`` (axis 1). The Gauss–Legendre
    positions are symmetric (``v_{V−1−j} = 1 − v_j``), so the after-arrivals at ``v_j``
    are the before-arrivals at ``v_{V−1−j}``, and those of the upper half are
    ``CP(r)/CP(r·v_{V−1−j})`` — a division where :func:`cp_transform` takes a complex
    exponential: ``⌊V/2⌋ + 1`` (+1 for odd ``V``) exponentials per rate instead of
    ``2V`` (equal to ``cp_transform``'s within a few ulps, tested). Where the divisor is
    below :data:`_DIVISOR_FLOOR` in modulus (hundreds of arrivals per iteration: the
    exponential underflows), the exponential is taken instead."""
    V = v.size
    half = V // 2
    before = np.empty((rates.size, V, F.size), dtype=np.complex128)
    before[:, : V - half] = cp_transform(np.multiply.outer(rates, v[: V - half]), F)
    if half:
        low = before[:, half - 1 :: -1]  # column V − half + i mirrors column half − 1 − i
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            upper = cp_transform(rates, F)[:, None, :] / low
        r, j, k = np.nonzero(np.abs(low) < _DIVISOR_FLOOR)
        if r.size:
            upper[r, j, k] = np.exp(rates[r] * v[V - half + j] * (F[k] - 1.0))
        before[:, V - half :] = upper
    return before, before[:, ::-1]


#: the least divisor modulus :func:`_position_transforms` divides by: the quotient's
#: absolute error stays below 10⁻¹⁷³ however the dividend's subnormal bits round
_DIVISOR_FLOOR = 1e-150


def _leftover_transform(w_state: Arr, G: int, size: int) -> NDArray[np.complex128]:
    """The transforms (``rfft`` on ``size`` points) of what each class ``p = min(u, G)``
    of the arrival iteration leaves queued, weighted by ``w_state``: a class ``p < G``
    leaves nothing (its mass at 0: a constant transform, the FFT of that delta to the
    bit), class ``G`` the states ``u ≥ G`` shifted down by ``G`` (one FFT, not ``G + 1``)."""
    out = np.empty((G + 1, size // 2 + 1), dtype=np.complex128)
    out[:G] = w_state[:G, None]
    out[G] = np.fft.rfft(w_state[G:], size)
    return out


class TaggedStart:
    """What the tagged request's arrival and wait give, from the chain alone: its full
    iterations, the law of the state at its last prefill iteration and of the one its
    decode steps start from (``ξ``), and ``ξ·T^j`` as far as a profile has asked for
    them (kept: the operating point's fixed point evaluates profiles of new ``τ₊`` on
    the same chain, and each is then one product per step)."""

    def __init__(self, chain: BacklogChain) -> None:
        self.chain = chain
        self.full_iterations, self.start = _arrival(chain)
        self.last_prefill_s = float(self.start @ chain.step_s)
        self.laws = [chain.transition(self.start)]  # ξ·T^j, j = 0, 1, …

    def law(self, j: int) -> Arr:
        """``ξ·T^j``."""
        while len(self.laws) <= j:
            self.laws.append(self.chain.transition(self.laws[-1]))
        return self.laws[j]


def tagged_request(
    chain: BacklogChain,
    *,
    decode_step_s: Arr,
    max_steps: int,
    rel_tol: float = 1e-4,
    start: TaggedStart | None = None,
) -> TaggedRequest:
    """TTFT components and the decode-step profile of a typical request.

    ``decode_step_s`` is ``τ₊`` per state (the iteration time with the request itself
    among the decodes); ``max_steps`` bounds the profile (the largest ``o − 1``).
    ``start``: :class:`TaggedStart` of ``chain`` when the caller has it (the same answer).
    """
    if start is None or start.chain is not chain:
        start = TaggedStart(chain)
    G, pi, tau = chain.per_budget, chain.stationary, chain.step_s
    # decode profile: E_j = ξ·T^{j−1}·τ₊, ξ = start·T, until it reaches the stationary
    # value; after PROFILE_STEPS its remaining excess is extrapolated geometrically with
    # the ratio of the last two excesses (the chain's slowest mode)
    limit = float(pi @ decode_step_s)
    prof: list[float] = []
    ratio = 0.0
    for j in range(max(min(int(max_steps), PROFILE_STEPS), 1)):
        e = float(start.law(j) @ decode_step_s)
        prof.append(e)
        if abs(e - limit) <= rel_tol * limit:
            break
    else:
        if len(prof) >= 2 and abs(prof[-2] - limit) > 0:
            ratio = min(max((prof[-1] - limit) / (prof[-2] - limit), 0.0), 0.9999)
    return TaggedRequest(
        residual_s=chain.mean_residual_s,
        full_iterations=start.full_iterations,
        full_wait_s=start.full_iterations * float(tau[G]),
        last_prefill_s=start.last_prefill_s,
        decode_step_s=np.asarray(prof),
        stationary_step_s=limit,
        tail_ratio=ratio,
        start_law=start.laws[0],
    )


def _arrival(chain: BacklogChain) -> tuple[float, Arr]:
    """``E[m − 1]`` and the law of the state at the start of the request's last prefill
    iteration (see the module docstring of :mod:`perfmodel.serving.prefill_chain`)."""
    G, lam = chain.per_budget, chain.rate_per_s
    pi, tau, T, f = chain.stationary, chain.step_s, chain.transition, chain.prompt_pmf
    n = pi.size
    b = chain.mean_step_s
    # arrival iteration, by class p = min(u, G) (leftover u − p only in class G), time-weighted
    w_state = pi * tau / b
    tau_p = tau[: G + 1]
    nodes, wts = gauss_legendre(V_NODES)
    v, wv = (nodes + 1) / 2, wts / 2
    size = fft_size(2 * n + f.size)
    F = np.fft.rfft(f, size)
    L_hat = _leftover_transform(w_state, G, size)  # (G+1, size/2+1)
    # the arrivals before and after the request in its iteration, CP(λ·v·τ_p) and
    # CP(λ·(1 − v)·τ_p), as their transforms exp(r·(F − 1)) on the convolution grid (one
    # iteration's arrivals stay far below its 2n + |f| points: nothing wraps around)
    rate_pv = lam * np.outer(tau_p, 1 - v)  # (G+1, V)
    before_hat, A_hat = _position_transforms(lam * tau_p, v, F)
    Y = np.fft.irfft(L_hat[:, None, :] * before_hat * F, size, axis=2)
    Y = np.maximum(Y[:, :, :n], 0.0) * wv[None, :, None]
    # the request's last prefill iteration is the m-th from the next one, m = max(1, ⌈y/G⌉)
    m_of_y = np.maximum(1, np.ceil(np.arange(n) / G)).astype(np.int64)
    y_tot = Y.sum(axis=(0, 1))
    mass_m = np.bincount(m_of_y, weights=y_tot, minlength=2)
    total = float(mass_m.sum())
    full_iters = float(np.dot(np.maximum(np.arange(mass_m.size) - 1, 0), mass_m)) / total
    # Z_m: state law at the start of iteration k + 1 with R's prompt ending in iteration
    # k + m. m = 1 exactly (A_after depends on the arrival iteration and the position);
    # m ≥ 2: A_after is a small part of what arrives before R's last iteration, and its
    # rate is averaged over (u, v) given m (one convolution per m).
    # m = 1: y = 0 … G (the transform pads the rest with zeros)
    z1 = np.fft.irfft((np.fft.rfft(Y[:, :, : G + 1], size, axis=2) * A_hat).sum(axis=(0, 1)), size)
    zs = [_lump(z1, n)]
    top = int(np.nonzero(mass_m > 1e-9 * total)[0].max(initial=1))
    if top >= 2:
        # bucket m ≥ 2 holds y = (m − 1)·G + 1 … m·G (consecutive: sums by reduceat)
        edges = np.arange(1, top + 1) * G + 1  # bucket starts, then the end of bucket top
        w_pv = np.add.reduceat(Y[:, :, : min(edges[-1], n)], edges[:-1], axis=2)
        r_bar = (w_pv * rate_pv[:, :, None]).sum(axis=(0, 1))
        r_bar /= np.maximum(w_pv.sum(axis=(0, 1)), 1e-300)
        sel = m_of_y[None, :] == np.arange(2, top + 1)[:, None]  # (top − 1, n)
        ym = np.where(sel, y_tot[None, :], 0.0)
        # Z_m = y_m ∗ CP(r̄_m): the transform of CP(r̄_m) directly (what lies beyond the
        # grid is lumped at its top either way)
        zm = np.fft.irfft(np.fft.rfft(ym, size, axis=1) * cp_transform(r_bar, F), size)
        zs += [_lump(z, n) for z in zm]
    # start = Σ_m Z_m·T^{m−1} (Horner): the law at the start of its last prefill iteration
    start = zs[-1]
    for z in reversed(zs[:-1]):
        start = T(start) + z
    start /= start.sum()
    return full_iters, start


#: lags of the iteration-time autocovariance followed at most (it decays geometrically
#: with the chain's slowest mode: ~25 lags at ρ = 0.7 for Llama-3.1-70B chat on 4×H100)
MAX_COVARIANCE_LAGS = 400


def step_autocovariance(chain: BacklogChain, step_s: Arr, *, rel_tol: float = 1e-4) -> Arr:
    """``c_k = Cov_π(τ(U_0), τ(U_k))``, ``k = 0, 1, …`` until ``|c_k| ≤ rel_tol·c_0``.

    The iterations a decoding request sees are consecutive states of the backlog chain:
    a long iteration lets more prompts arrive, so the next one is long too. The variance
    of the sum of ``n`` of them is ``n·c_0 + 2·Σ_{k<n}(n − k)·c_k`` (a stationary Markov
    reward; Kemeny & Snell, *Finite Markov Chains*, 1960, §4.6), computed as
    ``c_k = (π∘f̃)·T^k·f̃`` with ``f̃ = τ − E_π[τ]`` (:func:`decode_variance`'s iterates).
    """
    return _DecodeSums(chain, step_s, rel_tol).covariance()


def sum_variance(cov: Arr, steps: Arr) -> Arr:
    """``Var[Σ_{j≤n} τ_j] = n·c_0 + 2·Σ_{1≤k<n}(n − k)·c_k`` for each ``n`` in ``steps``."""
    n = np.asarray(steps, dtype=np.float64)
    k = np.arange(cov.size, dtype=np.float64)
    c1 = np.concatenate([[0.0], np.cumsum(cov[1:])])  # Σ_{1≤k≤K} c_k
    c2 = np.concatenate([[0.0], np.cumsum(k[1:] * cov[1:])])  # Σ k·c_k
    top = np.clip(np.ceil(n) - 1, 0, cov.size - 1).astype(np.int64)
    return np.maximum(n * cov[0] + 2 * (n * c1[top] - c2[top]), 0.0)


def start_dispersion(chain: BacklogChain, start_law: Arr, step_s: Arr, steps: Arr) -> Arr:
    """The variance of a request's decode time that its start state adds, per ``n``.

    ``H_n(x) = Σ_{j<n} (T^j·τ₊)(x)`` is the mean time of ``n`` decode iterations from
    state ``x``. Under the stationary start the sum's variance is
    ``E_π[Var(Σ | X₁)] + Var_π(H_n)`` (what :func:`sum_variance` gives); a request starts
    from ``ξ`` instead — right behind the prompts that queued during its own wait, the
    backlog is large or not — so its variance is ``sum_variance − Var_π(H_n) +
    Var_ξ(H_n)``. Returns ``Var_ξ(H_n) − Var_π(H_n)`` for each ``n`` in ``steps``; it
    dominates when outputs are short (code: 70 % of outputs under 20 tokens). The
    variances are of ``H_n − n·E_π[τ₊]`` (the same, without the cancellation).
    """
    return _DecodeSums(chain, step_s).dispersion(start_law, steps)


def decode_variance(chain: BacklogChain, start_law: Arr, step_s: Arr, steps: Arr) -> Arr:
    """``Var`` of the total time of a request's ``n`` decode iterations, for each ``n`` in
    ``steps``: :func:`sum_variance` of :func:`step_autocovariance` plus
    :func:`start_dispersion`, both from one sequence of iterates ``T^k·f̃`` (the
    autocovariance's ``c_k = (π∘f̃)·T^k·f̃`` is the dot product of the dispersion's
    ``k``-th term with ``π∘f̃``): one backward product per lag instead of a forward and a
    backward one."""
    sums = _DecodeSums(chain, step_s)
    disp = sums.dispersion(start_law, steps)
    return sum_variance(sums.covariance(), steps) + disp


class _DecodeSums:
    """The iterates ``g_k = T^k·f̃``, ``f̃ = τ₊ − E_π[τ₊]``, as far as asked for."""

    def __init__(self, chain: BacklogChain, step_s: Arr, rel_tol: float = 1e-4) -> None:
        self.chain, self.rel_tol = chain, rel_tol
        self.mean = float(chain.stationary @ step_s)
        self.iterates = [step_s.astype(np.float64) - self.mean]

    def iterate(self, k: int) -> Arr:
        while len(self.iterates) <= k:
            self.iterates.append(self.chain.transition.backward(self.iterates[-1]))
        return self.iterates[k]

    def covariance(self) -> Arr:
        y = self.chain.stationary * self.iterates[0]
        c = [float(y @ self.iterates[0])]
        if c[0] <= 0:
            return np.zeros(1)
        for k in range(1, MAX_COVARIANCE_LAGS + 1):
            c.append(float(y @ self.iterate(k)))
            if abs(c[-1]) <= self.rel_tol * c[0]:
                break
        return np.asarray(c)

    def dispersion(self, start_law: Arr, steps: Arr) -> Arr:
        pi = self.chain.stationary
        n_max = int(min(max(float(np.max(steps, initial=1.0)), 1.0), PROFILE_STEPS))
        h = np.zeros_like(self.iterates[0])
        diff = np.zeros(n_max)
        for j in range(n_max):
            g = self.iterate(j)
            h = h + g
            var_xi = float(start_law @ (h * h)) - float(start_law @ h) ** 2
            var_pi = float(pi @ (h * h)) - float(pi @ h) ** 2
            diff[j] = var_xi - var_pi
            if float(np.max(np.abs(g))) <= 1e-6 * self.mean:
                diff[j + 1 :] = diff[j]
                break
        idx = np.clip(np.asarray(steps, dtype=np.int64) - 1, 0, n_max - 1)
        return np.asarray(diff[idx])
