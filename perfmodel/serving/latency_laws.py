"""The latency laws behind the percentiles of :mod:`perfmodel.serving.latency`.

``Mixture`` is a base plus a (possibly absent) Gamma per atom; the TTFT and TPOT laws of
one operating point are built here from the backlog chain (see that module's docstring).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from perfmodel.serving.prefill_chain import BacklogChain
from perfmodel.special import gammainc

Arr = NDArray[np.float64]


_TREE_DEPTH = 3  # halvings per vectorized CDF evaluation in Mixture.quantile (3: fastest)


def _bisection_tree(lo: float, hi: float, depth: int) -> list[float]:
    """Midpoints a bisection of ``[lo, hi]`` may visit in ``depth`` halvings, in heap order
    (node ``i``: left child ``2i + 1`` below its midpoint, right child ``2i + 2`` above),
    each computed as the bisection computes it, ``0.5·(lo + hi)``."""
    out: list[float] = []
    level = [(lo, hi)]
    for _ in range(depth):
        nxt = []
        for a, b in level:
            m = 0.5 * (a + b)
            out.append(m)
            nxt += [(a, m), (m, b)]
        level = nxt
    return out


def _descend(
    bracket: tuple[float, float], tree: list[float], below: list[float], q: float
) -> tuple[tuple[float, float], float | None]:
    """Down a :func:`_bisection_tree` of ``bracket`` with the CDF ``below`` at its nodes:
    the bracket after those halvings, and the quantile once the bracket is ~40 halvings
    narrow (``hi``), else None."""
    lo, hi = bracket
    node = 0
    for _ in range(_TREE_DEPTH):
        if not hi - lo > 1e-9 * max(hi, 1e-9):
            return (lo, hi), hi
        mid = tree[node]
        if below[node] < q:
            lo, node = mid, 2 * node + 2
        else:
            hi, node = mid, 2 * node + 1
    return (lo, hi), None


@dataclass(frozen=True)
class Mixture:
    """``X = base_i + Y_i`` with probability ``w_i``.

    ``Y_i`` is 0 with probability ``1 − p_i``, otherwise Gamma(``shape_i``, ``scale_i``)
    (shape 1 is the exponential wait of the TTFT model).
    """

    weights: Arr
    base: Arr
    p: Arr
    shape: Arr
    scale: Arr
    unbounded: bool = False

    def cdf(self, x: float) -> float:
        if self.unbounded:
            return 0.0
        return float(self._cdf_rows(np.array([x]))[0])

    def _cdf_rows(self, xs: Arr) -> list[float]:
        """The CDF at each of ``xs`` (one vectorized evaluation; each value is the one
        :meth:`cdf` returns, to the bit: the same element-wise terms and dot product)."""
        y = xs[:, None] - self.base
        # Gamma(shape, scale) CDF = regularized lower incomplete gamma P(shape, y/scale)
        inner = np.where(
            self.scale > 0,
            gammainc(self.shape, np.maximum(y, 0.0) / np.maximum(self.scale, 1e-300)),
            1.0,
        )
        f = np.where(y < 0, 0.0, (1 - self.p) + self.p * inner)
        return [float(np.dot(self.weights, row)) for row in f]

    def quantile(self, q: float) -> float:
        """Smallest ``x`` with ``cdf(x) ≥ q`` (:meth:`quantiles` of one)."""
        return self.quantiles((q,))[0]

    def quantiles(self, qs: Sequence[float]) -> list[float]:
        """Smallest ``x`` with ``cdf(x) ≥ q`` for each ``q``: ~40 halvings of a bracket,
        taken :data:`_TREE_DEPTH` at a time — the CDF at every midpoint those halvings may
        visit, for every ``q`` still searching, in one vectorized call, then each path down
        its tree — the same midpoints and answers as one halving per CDF evaluation and
        one ``q`` at a time (each CDF value is the one :meth:`cdf` returns, to the bit),
        in a third of the calls, and one call per round for all of ``qs``."""
        if self.unbounded:
            return [math.inf] * len(qs)
        lo = float(self.base.min())
        hi = float(self.base.max() + 50 * max(float((self.shape * self.scale).max()), 1e-9))
        brackets = [(lo, hi)] * len(qs)
        out: list[float | None] = [None] * len(qs)
        while live := [k for k, v in enumerate(out) if v is None]:
            trees = [_bisection_tree(*brackets[k], _TREE_DEPTH) for k in live]
            below = self._cdf_rows(np.asarray([m for tree in trees for m in tree]))
            size = len(trees[0])
            for j, k in enumerate(live):
                brackets[k], out[k] = _descend(
                    brackets[k], trees[j], below[j * size : (j + 1) * size], qs[k]
                )
        return [float(v) for v in out if v is not None]

    def mean(self) -> float:
        if self.unbounded:
            return math.inf
        return float(np.dot(self.weights, self.base + self.p * self.shape * self.scale))


def ttft_mixture(
    s_w: Arr,
    d_s: Arr,
    chain: BacklogChain,
    *,
    p_busy: float,
    others_s: float,
    memory_wait_s: float,
    c_mem: float,
) -> Mixture:
    """TTFT = lone prefill ``D(s)`` + residual ``R`` (engine busy) + queueing ``Q``.

    ``R``, the rest of the iteration in progress, is the length-biased iteration times a
    uniform: ``E[R] = E_π[τ²]/(2E_π[τ])``, ``E[R²] = E_π[τ³]/(3E_π[τ])`` (a Gamma with
    these moments). ``Q``, the delay from other prompts (and the KV wait), is positive
    only when prompt work is queued or shares the request's iteration: with probability
    ``ρ_p = 1 − τ(0)/b̄``, the engine-time fraction spent on prompt tokens — as the M/G/1
    wait is positive with probability ``ρ`` — or the Erlang-C probability of a KV wait,
    and then exponential with mean ``E[Q]/P(Q > 0)``. Three branches per prompt atom: no
    wait (idle engine), ``R`` alone, ``R + Q`` (a Gamma with the summed mean and variance).
    A single exponential over the whole wait (shape 1, positive with ``P(busy)``) has too
    light a tail: p90 TTFT 10 % short of the simulator at ρ = 0.7 (Llama-3.1-70B, chat).
    """
    tau, pi = chain.step_s, chain.stationary
    b = float(pi @ tau)
    r1 = float(pi @ tau**2) / (2 * b)
    r2 = float(pi @ tau**3) / (3 * b)
    r_var = max(r2 - r1 * r1, 1e-30 * r1 * r1)
    q_mean = others_s + memory_wait_s
    rho_p = max(1.0 - float(tau[0]) / b, 0.0)
    p_q = min(1.0 - (1.0 - rho_p) * (1.0 - c_mem), p_busy) if q_mean > 0 else 0.0
    q_cond = q_mean / p_q if p_q > 0 else 0.0
    # (probability, mean, variance) of the three wait branches
    branches = (
        (1.0 - p_busy, 0.0, 0.0),
        (p_busy - p_q, r1, r_var),
        (p_q, r1 + q_cond, r_var + q_cond * q_cond),
    )
    kept = [(w, m, v) for w, m, v in branches if w > 0]
    k = len(kept)
    weights = np.concatenate([s_w * w for w, _, _ in kept])
    mean = np.repeat([m for _, m, _ in kept], s_w.size)
    var = np.repeat([max(v, 1e-300) for _, _, v in kept], s_w.size)
    return Mixture(
        weights=weights,
        base=np.tile(d_s, k),
        p=np.where(mean > 0, 1.0, 0.0),
        shape=np.where(mean > 0, mean * mean / var, 1.0),
        scale=np.where(mean > 0, var / np.maximum(mean, 1e-300), 0.0),
    )


def tpot_mixture(
    tpot_s: Arr, n_all: Arr, w_all: Arr, tau_plus: Arr, sum_var_s2: Arr
) -> tuple[Mixture, float, float]:
    """TPOT as a mixture over output lengths: the first decode step plus a Gamma excess.

    ``sum_var_s2`` is, per atom of ``n = o − 1``, the variance of the request's ``n``
    decode iterations summed: the chain's autocovariance
    (:func:`perfmodel.serving.tagged.sum_variance`) and the spread of its start state
    (:func:`perfmodel.serving.tagged.start_dispersion`). Returns the mixture,
    ``P(o ≥ 2)`` and the mean decode time of a request with a TPOT (for the E2E mean).
    """
    keep = n_all >= 1
    p_multi = float(w_all[keep].sum())  # P(o >= 2): requests that have a TPOT
    if p_multi <= 0:  # every request emits one token: no decode step (TPOT 0, E2E = TTFT)
        keep, p_multi = n_all >= 0, 0.0
    n_vals, n_w = np.maximum(n_all[keep], 1.0), w_all[keep] / max(p_multi, 1e-300)
    tpot_n = tpot_s[keep]
    t0_seen = float(tau_plus[0])
    ex_mean = np.maximum(tpot_n - t0_seen, 0.0)
    ex_var = np.maximum(sum_var_s2[keep], 0.0) / n_vals**2
    with np.errstate(divide="ignore", invalid="ignore"):
        shape = np.where(ex_var > 0, ex_mean**2 / ex_var, 1.0)
        scale = np.where(ex_mean > 0, ex_var / np.maximum(ex_mean, 1e-300), 0.0)
    tpot = Mixture(
        weights=n_w,
        base=np.full(n_w.shape, t0_seen),
        p=np.where(ex_mean > 0, 1.0, 0.0),
        shape=shape,
        scale=scale,
    )
    if p_multi <= 0:
        z = np.zeros(1)
        tpot = Mixture(weights=z + 1, base=z, p=z, shape=z + 1, scale=z)
    return tpot, p_multi, float(np.dot(n_w, n_vals * (t0_seen + ex_mean)))


def window_variance_factor(steps: Arr, weights: Arr) -> Arr:
    """Share of ``Var N`` left in the mean of ``N`` over a window of ``L`` decode steps
    (``L`` each atom of ``steps``), for an M/G/∞ population whose members hold ``h``
    steps (``h`` ~ ``steps``/``weights``): ``2·E_h[J(L, h)]/(E[h]·L²)`` with ``J`` the
    integrated overlap ``L²h/2 − L³/6`` (``h ≥ L``) or ``Lh²/2 − h³/6`` (``h < L``)."""
    L = steps[:, None]
    h = steps[None, :]
    j = np.where(h >= L, L**2 * h / 2 - L**3 / 6, L * h**2 / 2 - h**3 / 6)
    return np.asarray(2.0 * (j @ weights) / (float(weights @ steps) * steps**2))


def sum_ctx_sq(s: NDArray[np.int64], n: NDArray[np.int64]) -> Arr:
    """``Σ_{j=1..n} (s + j − 1)²``: step-summed squared context of a request."""
    s_ = s.astype(float)
    n_ = n.astype(float)
    return n_ * s_**2 + s_ * n_ * (n_ - 1) + (n_ - 1) * n_ * (2 * n_ - 1) / 6
