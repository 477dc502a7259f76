"""Closed-form queueing results used by the serving model, each with its source.

Pure functions of numbers (no models, no devices): Pollaczek–Khinchine, Allen–Cunneen
(Kingman) for bursty arrivals, Erlang C, DistServe's M/D/1 prefill formulas, Li–Dai–Peng
work-conserving capacity and Nie–Si–Zhou's memory-constrained service rate. Unstable
inputs return ``math.inf`` (an unbounded wait), never NaN.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray

from perfmodel.errors import SpecError

Arr = NDArray[np.float64]


def pollaczek_khinchine_wait_s(
    rate_per_s: float, mean_service_s: float, second_moment_service_s2: float
) -> float:
    """Mean wait in queue of an M/G/1 FCFS queue.

    ``W_q = λ·E[S²] / (2·(1 − ρ))`` with ``ρ = λ·E[S]`` (Pollaczek 1930, Khinchine 1932;
    any queueing text, e.g. Kleinrock, *Queueing Systems* Vol. 1, eq. 5.105).
    M/M/1: ``E[S²] = 2/μ²`` gives ``ρ/(μ − λ)``; M/D/1: ``E[S²] = D²`` gives
    ``ρ·D / (2(1 − ρ))``. Returns ``inf`` when ``ρ >= 1``.
    """
    _nonneg(rate_per_s=rate_per_s, mean_service_s=mean_service_s)
    if second_moment_service_s2 < mean_service_s**2 * (1 - 1e-12):
        raise SpecError("E[S²] must be at least E[S]²")
    rho = rate_per_s * mean_service_s
    if rho >= 1:
        return math.inf
    return rate_per_s * second_moment_service_s2 / (2.0 * (1.0 - rho))


def allen_cunneen_wait_s(
    rate_per_s: float, mean_service_s: float, *, cv_arrival: float, cv_service: float
) -> float:
    """Mean wait of a GI/G/1 queue, Allen–Cunneen / Kingman approximation.

    ``W_q ≈ (c_a² + c_s²)/2 · ρ/(1 − ρ) · E[S]`` (Kingman 1961 heavy-traffic form;
    Allen 1978). Exact for M/G/1 (``c_a = 1``: reduces to Pollaczek–Khinchine).
    """
    _nonneg(rate_per_s=rate_per_s, mean_service_s=mean_service_s)
    rho = rate_per_s * mean_service_s
    if rho >= 1:
        return math.inf
    return (cv_arrival**2 + cv_service**2) / 2.0 * rho / (1.0 - rho) * mean_service_s


def erlang_c(servers: float, offered_load: float) -> float:
    """Probability of waiting in an M/M/c queue with ``c = servers`` and ``a = λ/μ``.

    Computed with the stable Erlang-B recursion ``B_k = a·B_{k−1}/(k + a·B_{k−1})``
    and ``C = c·B / (c − a·(1 − B))``; non-integer ``c`` is floored (at least 1).
    Returns 1 when ``a >= c`` (every arrival waits; the queue is unstable).
    """
    c = max(1, int(servers))
    if offered_load >= c:
        return 1.0
    if offered_load <= 0:
        return 0.0
    b = 1.0
    for k in range(1, c + 1):
        b = offered_load * b / (k + offered_load * b)
    return c * b / (c - offered_load * (1.0 - b))


def distserve_ttft_single_s(rate_per_s: float, exec_s: float) -> float:
    """DistServe eq. 1: prefill on one device as M/D/1, ``D + R·D² / (2(1 − R·D))``.

    Zhong et al., *DistServe*, OSDI 2024, §3.1 (FCFS, no batching, deterministic
    prefill time ``D``, Poisson rate ``R``). ``inf`` when ``R·D >= 1``.
    """
    _nonneg(rate_per_s=rate_per_s, exec_s=exec_s)
    if rate_per_s * exec_s >= 1:
        return math.inf
    return exec_s + pollaczek_khinchine_wait_s(rate_per_s, exec_s, exec_s**2)


def distserve_ttft_inter_op_s(rate_per_s: float, exec_s: float) -> float:
    """DistServe eq. 2: 2-way pipeline (inter-op), ``D + R·D² / (4(2 − R·D))``.

    The request still takes ``D_s = D`` but the slowest stage is ``D_m = D/2``, so the
    queue is M/D/1 with service ``D/2``. ``inf`` when ``R·D >= 2``.
    """
    _nonneg(rate_per_s=rate_per_s, exec_s=exec_s)
    if rate_per_s * exec_s >= 2:
        return math.inf
    return exec_s + pollaczek_khinchine_wait_s(rate_per_s, exec_s / 2, (exec_s / 2) ** 2)


def distserve_ttft_intra_op_s(rate_per_s: float, exec_s: float, speedup: float) -> float:
    """DistServe eq. 3: 2-way tensor (intra-op) parallelism with speed-up ``K`` (1 < K < 2).

    ``D/K + R·D² / (2K(K − R·D))``: M/D/1 with service ``D/K``. ``inf`` when ``R·D >= K``.
    """
    _nonneg(rate_per_s=rate_per_s, exec_s=exec_s)
    if speedup <= 0:
        raise SpecError("speed-up K must be > 0")
    d = exec_s / speedup
    if rate_per_s * d >= 1:
        return math.inf
    return d + pollaczek_khinchine_wait_s(rate_per_s, d, d**2)


def work_conserving_capacity_tokens_per_s(max_batched_tokens: float, full_step_s: float) -> float:
    """Li–Dai–Peng Theorem 2: no scheduler processes more than ``b_max / t_{b_max}`` tokens/s.

    Every work-conserving scheduler (e.g. Sarathi-Serve chunked prefill, Orca) is stable
    when ``λ·(m_p + m_d) < b_max / t_{b_max}`` and none is when it exceeds it (Li, Dai,
    Peng, arXiv 2504.07347, §3). ``full_step_s`` is the time of a full iteration.
    """
    if max_batched_tokens <= 0 or full_step_s <= 0:
        raise SpecError("token budget and full-iteration time must be > 0")
    return max_batched_tokens / full_step_s


def nie_memory_rate_per_s(
    kv_capacity_tokens: float, step_s: float, mean_lifetime_kv_token_steps: float
) -> float:
    """Nie–Si–Zhou memory-constrained service rate ``μ = M / (b̄ · E[g(s, o)])``.

    ``M`` KV capacity (tokens), ``b̄`` representative iteration time (s), ``E[g]`` the
    mean lifetime KV demand of a request (token·iterations). λ > μ is unstable under any
    policy; λ < μ(1 − δ) is stable under every work-conserving one (Nie, Si, Zhou,
    arXiv 2605.04595, Thms 4.1–4.2 as summarized in formal_models.md §1.1).
    """
    if kv_capacity_tokens <= 0 or step_s <= 0 or mean_lifetime_kv_token_steps <= 0:
        raise SpecError("KV capacity, iteration time and E[g] must be > 0")
    return kv_capacity_tokens / (step_s * mean_lifetime_kv_token_steps)


def renewal_mean_age(sizes: ArrayLike, weights: ArrayLike) -> float:
    """Mean age (= mean residual) of a stationary renewal process: ``E[X²] / (2·E[X])``.

    A point thrown at random on a line cut into consecutive pieces of i.i.d. sizes ``X``
    lands in a piece with probability proportional to its size (length bias) and
    uniformly within it, so its mean distance to the piece's start is
    ``E[X²]/(2E[X])`` (the inspection paradox; e.g. Kleinrock, *Queueing Systems* Vol. 1,
    §5.2, mean residual life; Ross, *Stochastic Processes*, §3.4). Deterministic ``X``
    gives ``X/2``, exponential ``X`` gives ``E[X]``.
    """
    x = np.asarray(sizes, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    if x.shape != w.shape or x.size == 0 or np.any(x < 0) or np.any(w < 0) or w.sum() <= 0:
        raise SpecError("renewal sizes and weights must be equal-length, non-negative arrays")
    mean = float(np.dot(w, x) / w.sum())
    if mean <= 0:
        raise SpecError("renewal sizes must have a positive mean")
    return float(np.dot(w, x * x) / w.sum()) / (2.0 * mean)


def lifetime_kv_token_steps(input_tokens: ArrayLike, output_tokens: ArrayLike, chunk: int) -> Arr:
    """``g(s, o)``: KV tokens a request holds, summed over the iterations it occupies.

    Prefill in ``k = ⌈s/C⌉`` chunks holds ``min(jC, s)`` after chunk ``j``; the prefill
    emits the first output token, then decode step ``j = 1 … o−1`` writes token ``j``'s
    KV and holds ``s + j``; memory is freed when the request finishes::

        g = Σ_{j=1..k} min(jC, s) + (o − 1)·s + (o − 1)·o/2

    (Nie et al.'s approximation is ``o·(s + o/2)``; this is the exact sum with chunked
    prefill, formal_models.md §1.1.) Vectorized over ``s`` and ``o``.
    """
    if chunk < 1:
        raise SpecError("chunk size must be >= 1 token")
    s = np.asarray(input_tokens, dtype=np.float64)
    o = np.asarray(output_tokens, dtype=np.float64)
    return prefill_kv_token_steps(s, chunk) + (o - 1) * s + (o - 1) * o / 2.0


def prefill_kv_token_steps(input_tokens: ArrayLike, chunk: int) -> Arr:
    """``Σ_{j=1..k} min(jC, s)`` with ``k = ⌈s/C⌉``: ``C·k(k−1)/2 + s`` (full chunks + last)."""
    s = np.asarray(input_tokens, dtype=np.float64)
    k = np.ceil(s / chunk)
    return chunk * k * (k - 1) / 2.0 + s


def _nonneg(**values: float) -> None:
    for name, v in values.items():
        if not (math.isfinite(v) and v >= 0):
            raise SpecError(f"{name} must be a finite number >= 0, got {v}")
