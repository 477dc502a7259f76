"""Per-phase instance models for prefill/decode disaggregation (DistServe-style).

A disaggregated deployment runs prompts on *prefill instances* and generation on
*decode instances*; the KV cache of each prompt moves from one to the other over a
link. Every time below comes from the cost layer: prefill and decode iterations from
``perfmodel.step.step_time``, the KV transfer from ``hardware.comm.collective_time_s``
(``p2p``). Requests are routed to the instances of a pool at random with probability
proportional to each instance's goodput, so every instance sees a Poisson stream and
``n`` instances of goodput ``g`` serve ``n·g`` (DistServe Alg. 1: ``n = ⌈R/goodput⌉``).

**Prefill instance** (DistServe §3.1, eq. 1, generalized from M/D/1 to M/G/1): FCFS,
one prompt at a time, ``D(s)`` = one prefill iteration of an ``s``-token prompt on the
instance's TP group (its all-reduces included: the TP speed-up ``K`` of eq. 3 is not a
parameter, it falls out of ``step_time``). The KV transfer ``X(s)`` follows on the
instance's link, overlapped with the next prompt's prefill, so the pair is a tandem
whose bottleneck occupancy per request is ``S(s) = max(D(s), X(s))``. The queue in front
is M/G/1 with service ``S``; its waiting time has the Cramér–Lundberg tail
``P(W > x) ≈ min(ρ, C·e^{−γx})`` where ``γ > 0`` solves ``λ(E[e^{γS}] − 1) = γ`` and
``C = (1 − ρ)/(λ·E[S·e^{γS}] − 1)`` (exact for M/M/1: ``γ = μ − λ``, ``C = ρ``; Asmussen,
*Applied Probability and Queues*, XIII.5). ``TTFT = W + D(s) + X(s)``: the first token
counts as delivered when the decode instance holds the KV (vLLM-style disaggregated
serving; it is the conservative reading of DistServe's TTFT). Prompts shorter than the
critical length ``L_m`` are batched until the batch reaches ``L_m`` tokens (DistServe
§3.1): past it a batch of prompts costs the sum of its prompts, below it they share one
weight read. How full the batches are depends on the queue (Pollaczek–Khinchine wait,
:meth:`PrefillProfile.at_rate`), so short prompts occupy the server for ``D(s)`` at light
load and for their token share of a full batch near saturation
(:func:`prefill_profile`, :func:`prefill_batch_tokens`).

**Cost of an iteration**: :func:`phase_time_s` — the roofline ``step_time`` of the
batch on the TP group, or, when the configuration carries a calibrated ``profile``
(a ``MaxAffine`` over :data:`PHASE_FEATURES`, e.g. DistServe's measured
``a + b·Σl + c·Σl²`` prefill and ``a + b·Σ(ctx+1) + c·N`` decode), that profile.

**Decode instance**: continuous batching of decode steps; a request reserves its final
KV (``s + o`` tokens) on admission (no preemption) and admission is FIFO while the KV
capacity ``M`` and the batch cap allow. With ``N̄`` resident requests the step takes
``t(N̄)`` (``step_time`` of a decode batch at the step-weighted mean context), and
Little's law gives the fixed point ``N̄ = r·E[o − 1]·t(N̄)``. Admission is an M/G/c
queue with ``c = min(cap, M / E[s + o])`` slots (Erlang C, Allen–Cunneen factor
``(1 + c_H²)/2``). A tagged request's TPOT is its mean step time, normal around
``t(N̄ + 1)`` with the variance of the M/G/∞ batch (``Var N = N̄``) averaged over its
``o − 1`` steps, plus its admission wait spread over those steps.

Assumptions, stated once: no pipeline parallelism; prompts batch only below ``L_m``;
the decode admission reserves the final KV; the receiver side of the link is not contended (its
load is a capacity constraint of the planner, not a delay); step-time fluctuations
from context lengths enter through the batch only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import optimize, stats

from hardware.comm import collective_time_s, link_for_group
from hardware.device import Device, Link
from hardware.maxaffine import MaxAffine
from perfmodel.batch import Batch
from perfmodel.classic_queues import erlang_c
from perfmodel.errors import InfeasibleError, SpecError
from perfmodel.memory import kv_bytes_per_token_per_device, memory_fit
from perfmodel.model import ModelSpec
from perfmodel.parallel import ParallelPlan
from perfmodel.servemix import compress_atoms
from perfmodel.step import step_time
from perfmodel.workload import PRESETS, SLO, LengthDistribution, TruncLogNormal, lognormal_lengths

Arr = NDArray[np.float64]
PHASES = ("prefill", "decode")
KV_PLACEMENTS = ("auto", "scale-up", "scale-out")
PLANNER_ATOMS = 64  # mid-quantiles per marginal when a preset is discretized for planning
_MAX_ATOMS = 96
_RATE_ITERS = 40


# ---- configurations and the KV link ----------------------------------------------------------


#: Features a calibrated phase profile may use, each a sum over the iteration's sequences:
#: ``prefill_tokens`` Σl, ``prefill_tokens_sq`` Σ(l² + 2·l·c) (= Σl² for fresh prompts),
#: ``prefill_seqs`` the prompts, ``decode_seqs`` the decoding requests, ``decode_tokens``
#: Σ(context + 1) over them (DistServe's ``Σ(context_len + 1)``).
PHASE_FEATURES = (
    "prefill_tokens",
    "prefill_tokens_sq",
    "prefill_seqs",
    "decode_seqs",
    "decode_tokens",
)


def phase_features(batch: Batch) -> dict[str, Arr]:
    """The :data:`PHASE_FEATURES` of a batch (``prefill_tokens_sq = 2·pairs − tokens``)."""
    return {
        "prefill_tokens": batch.prefill_tokens,
        "prefill_tokens_sq": 2.0 * batch.prefill_pairs - batch.prefill_tokens,
        "prefill_seqs": batch.prefill_seqs,
        "decode_seqs": batch.decode_seqs,
        "decode_tokens": batch.decode_context + batch.decode_seqs,
    }


@dataclass(frozen=True)
class PhaseConfig:
    """One instance type of a phase: a device, a TP degree and (decode) a batch cap.

    ``profile``: a calibrated cost profile of this phase's iterations on this TP group
    (a :class:`hardware.maxaffine.MaxAffine` over :data:`PHASE_FEATURES`, e.g. DistServe's
    measured prefill ``a + b·Σl + c·Σl²`` as one piece); when set it is evaluated instead
    of the roofline ``step_time`` for every iteration of this configuration.
    """

    phase: str
    device: Device
    plan: ParallelPlan
    batch_cap: int | None = None  # decode: most concurrent requests; None = KV memory only
    profile: MaxAffine | None = field(default=None, compare=False)
    kv_capacity_tokens: int | None = None  # decode: measured KV capacity; None = memory_fit

    def __post_init__(self) -> None:
        if self.phase not in PHASES:
            raise SpecError(f"phase must be one of {PHASES}, got {self.phase!r}")
        if self.batch_cap is not None and self.batch_cap < 1:
            raise SpecError(f"batch cap must be a positive integer, got {self.batch_cap}")
        if self.kv_capacity_tokens is not None and self.kv_capacity_tokens < 1:
            raise SpecError(
                f"KV capacity must be a positive number of tokens, got {self.kv_capacity_tokens}"
            )
        if self.profile is not None:
            bad = [f for f in self.profile.features if f not in PHASE_FEATURES]
            if bad:
                raise SpecError(
                    f"{self.phase} profile feature(s) {', '.join(bad)} unknown; a phase "
                    f"profile uses {', '.join(PHASE_FEATURES)}"
                )

    @property
    def gpus(self) -> int:
        return self.plan.tp

    @property
    def label(self) -> str:
        cap = f" cap{self.batch_cap}" if self.batch_cap else ""
        cal = " (calibrated)" if self.profile is not None else ""
        return f"{self.device.id} TP{self.plan.tp}{cap}{cal}"


def phase_time_s(model: ModelSpec, config: PhaseConfig, batch: Batch) -> Arr:
    """Seconds of one iteration of ``batch`` on an instance of ``config``.

    The calibrated ``config.profile`` when there is one, else the roofline
    ``perfmodel.step.step_time`` of the batch on the instance's TP group.
    """
    if config.profile is not None:
        feats = phase_features(batch)
        return np.asarray(config.profile(**{f: feats[f] for f in config.profile.features}))
    return step_time(model, config.device, batch, plan=config.plan).total_s


@dataclass(frozen=True)
class KVLink:
    """Where the KV goes: the sender's and the receiver's link (per direction)."""

    kind: str  # "scale-up" | "scale-out"
    prefill_link: Link
    decode_link: Link

    @property
    def name(self) -> str:
        a, b = self.prefill_link.name, self.decode_link.name
        return f"{self.kind} ({a})" if a == b else f"{self.kind} ({a} -> {b})"


def _scale_out(device: Device) -> Link:
    # a group larger than any scale-up domain resolves to the NIC (or host PCIe)
    return link_for_group(device, 1 << 20)


def kv_link(prefill: PhaseConfig, decode: PhaseConfig, placement: str = "auto") -> KVLink:
    """The link a prefill instance sends KV to a decode instance over.

    ``scale-up``: both instances sit in one scale-up domain (same device type and
    ``tp_p + tp_d`` devices reachable over NVLink/xGMI/...), as in DistServe's
    low-node-affinity placement. ``scale-out``: across nodes over the NIC (host PCIe
    when the device has none). ``auto``: scale-up when possible, else scale-out.
    """
    if placement not in KV_PLACEMENTS:
        raise SpecError(f"KV placement must be one of {KV_PLACEMENTS}, got {placement!r}")
    group = prefill.plan.tp + decode.plan.tp
    dev = prefill.device
    up = link_for_group(dev, group) if dev == decode.device else None
    in_node = up is not None and not any(up is x for x in (dev.scale_out, dev.host_link))
    if placement == "scale-up" and not in_node:
        raise SpecError(
            f"a {prefill.label} prefill and a {decode.label} decode instance cannot share a "
            "scale-up domain (different devices or too many GPUs); use --kv-link scale-out"
        )
    if in_node and placement != "scale-out":
        assert up is not None
        return KVLink("scale-up", up, up)
    return KVLink("scale-out", _scale_out(prefill.device), _scale_out(decode.device))


def kv_transfer_time_s(
    model: ModelSpec,
    tokens: ArrayLike,
    *,
    prefill: PhaseConfig,
    decode: PhaseConfig,
    link: KVLink,
) -> Arr:
    """Seconds to move the KV of ``tokens``-token prompts from prefill to decode.

    Every prefill rank sends its shard while every decode rank receives its own, in
    parallel: the slower side sets the time, ``max(p2p(s·kv_p), p2p(s·kv_d))`` with
    ``kv_·`` the KV bytes per token one device of that side stores
    (``memory.kv_bytes_per_token_per_device``) and ``p2p`` costed by
    ``hardware.comm.collective_time_s`` on that side's link.
    """
    if prefill.plan.kv_dtype != decode.plan.kv_dtype:
        raise SpecError("prefill and decode instances must store the KV in the same dtype")
    s = np.asarray(tokens, dtype=np.float64)
    send = s * kv_bytes_per_token_per_device(model, prefill.plan)
    recv = s * kv_bytes_per_token_per_device(model, decode.plan)
    return np.maximum(
        collective_time_s("p2p", send, group=2, link=link.prefill_link),
        collective_time_s("p2p", recv, group=2, link=link.decode_link),
    )


def receive_time_s(
    model: ModelSpec, tokens: ArrayLike, *, decode: PhaseConfig, link: KVLink
) -> Arr:
    """Seconds the decode side's link is busy receiving the KV of each prompt."""
    recv = np.asarray(tokens, dtype=np.float64) * kv_bytes_per_token_per_device(model, decode.plan)
    return collective_time_s("p2p", recv, group=2, link=link.decode_link)


# ---- workloads ---------------------------------------------------------------------------------


def planner_lengths(name: str, atoms: int = PLANNER_ATOMS) -> LengthDistribution:
    """A built-in workload (``chat``, ``code``, ``sharegpt``) discretized for planning.

    ``chat``/``code`` are the Azure-trace presets of ``perfmodel.workload`` at ``atoms``
    mid-quantiles per marginal. ``sharegpt`` is a parametric stand-in for DistServe's
    ShareGPT set (mean input ≈ 755, mean output ≈ 200 tokens, Zhong et al. OSDI 2024):
    truncated log-normals with the log-spreads of the Azure conversation trace (0.8265,
    0.7728), truncated to OPT's 2048-token context as input ≤ 1536 and output ≤ 512,
    and ``mu`` chosen so the truncated means are 755 and 200.
    """
    if name == "sharegpt":
        return lognormal_lengths(*_SHAREGPT, name="sharegpt", n=atoms)
    if name not in PRESETS:
        raise SpecError(f"unknown workload {name!r}; valid: chat, code, sharegpt (or --trace CSV)")
    i, o = PRESETS[name]
    return lognormal_lengths(i, o, name=name, n=atoms)


def _trunc_lognormal_mean(mu: float, sigma: float, lo: int, hi: int) -> float:
    a, b = ((math.log(v) - mu) / sigma for v in (lo, hi))
    z = stats.norm.cdf(b) - stats.norm.cdf(a)
    return math.exp(mu + sigma**2 / 2) * (stats.norm.cdf(b - sigma) - stats.norm.cdf(a - sigma)) / z


def _fit_mu(mean: float, sigma: float, lo: int, hi: int) -> float:
    return float(
        optimize.brentq(lambda mu: _trunc_lognormal_mean(mu, sigma, lo, hi) - mean, 0.0, 12.0)
    )


_SHAREGPT = (
    TruncLogNormal(_fit_mu(755.0, 0.8265, 4, 1536), 0.8265, 4, 1536),
    TruncLogNormal(_fit_mu(200.0, 0.7728, 4, 512), 0.7728, 4, 512),
)


# ---- results -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PhaseGoodput:
    """Largest Poisson rate one instance serves within its phase's SLO percentile."""

    config: PhaseConfig
    feasible: bool
    rate_per_s: float  # 0 when infeasible
    per_gpu_rate_per_s: float
    capacity_rate_per_s: float  # stability limit of the instance (1/E[S] or slots/hold)
    link_capacity_per_s: float  # KV egress (prefill) or ingress (decode) limit of the link
    limiter: str  # prefill: ttft | kv-link; decode: tpot | kv-memory | batch-cap
    floor_s: float  # the percentile latency with no load: the smallest SLO that can be met
    quantile_at_goodput_s: float
    kv_capacity_tokens: int
    note: str


def _max_rate(ok: Callable[[float], bool], hi: float, rel_tol: float = 1e-3) -> float:
    """Largest rate in (0, hi) with ``ok`` true (``ok`` monotone: true below a threshold)."""
    lo = 0.0
    for _ in range(_RATE_ITERS):
        if hi - lo <= rel_tol * hi:
            break
        mid = 0.5 * (lo + hi)
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo


def _weighted_quantile(x: Arr, w: Arr, q: float) -> float:
    order = np.argsort(x, kind="stable")
    cdf = np.cumsum(w[order])
    return float(x[order][min(int(np.searchsorted(cdf, q - 1e-12)), x.size - 1)])


# ---- prefill -----------------------------------------------------------------------------------


def mg1_wait_tail(rate_per_s: float, service_s: Arr, weights: Arr) -> tuple[float, float, float]:
    """``(ρ, C, γ)`` of the M/G/1 FCFS wait tail ``P(W > x) ≈ min(ρ, C·e^{−γx})``.

    Cramér–Lundberg: ``γ > 0`` solves ``λ(E[e^{γS}] − 1) = γ``, and
    ``C = (1 − ρ)/(λ·E[S·e^{γS}] − 1)``. Requires ``ρ = λE[S] < 1``.
    """
    lam = rate_per_s
    mean = float(np.dot(weights, service_s))
    rho = lam * mean
    if not 0 <= rho < 1:
        raise SpecError("the M/G/1 wait tail needs 0 <= λ·E[S] < 1")
    if lam == 0:
        return 0.0, 0.0, math.inf
    smax = float(service_s.max())

    def f(g: float) -> float:
        return lam * (float(np.dot(weights, np.exp(g * service_s))) - 1.0) - g

    hi = 1.0 / smax
    while f(hi) <= 0:
        hi *= 2.0
    gamma = float(optimize.brentq(f, hi / 2 if f(hi / 2) < 0 else 1e-12 / smax, hi, xtol=1e-12))
    deriv = lam * float(np.dot(weights, service_s * np.exp(gamma * service_s))) - 1.0
    c = (1.0 - rho) / deriv if deriv > 0 else rho
    return rho, c, gamma


@dataclass(frozen=True)
class PrefillProfile:
    """Prefill and KV-transfer times of a prefill instance over the prompt lengths."""

    config: PhaseConfig
    input_tokens: Arr
    weights: Arr
    prefill_s: Arr  # D_b(s): a full batch of batch_size(s) such prompts (alone: D(s))
    transfer_s: Arr  # X(s)
    link: KVLink
    alone_s: Arr  # D(s): the prompt's iteration alone (the unloaded TTFT)
    batch_size: Arr  # k(s) = ⌈L_m/s⌉ prompts per full batch below L_m, else 1
    batch_tokens: int  # L_m

    @property
    def occupancy_s(self) -> Arr:
        """Server time per prompt in full batches: ``D_b(s)/k(s)`` (saturation)."""
        return self.prefill_s / self.batch_size

    @property
    def service_s(self) -> Arr:
        return np.maximum(self.occupancy_s, self.transfer_s)

    @property
    def capacity_rate_per_s(self) -> float:
        return 1.0 / float(np.dot(self.weights, self.service_s))

    @property
    def link_capacity_per_s(self) -> float:
        return 1.0 / float(np.dot(self.weights, self.transfer_s))

    def at_rate(self, rate_per_s: float) -> tuple[Arr, Arr]:
        """``(own iteration, server time per prompt)`` at a Poisson rate.

        A short prompt finds ``m = λ·P(short)·W`` short companions queued behind it when
        its iteration starts (the short arrivals during its wait; ``W = λE[S²]/(2(1−ρ))``,
        Pollaczek–Khinchine), so it runs in a batch of ``n = min(k, 1 + m)`` prompts
        lasting ``D(s) + (n − 1)/(k − 1)·(D_b(s) − D(s))`` (linear in the batch: exact for
        additive costs, above a roofline's flat part) and occupies the server for that
        over ``n``. Fixed point in ``m``; full batches as ``ρ → 1``.
        """
        short = self.batch_size > 1
        p_short = float(self.weights[short].sum())
        span = np.where(short, self.batch_size - 1, 1.0)
        own, svc = self.alone_s, np.maximum(self.alone_s, self.transfer_s)
        if p_short == 0 or rate_per_s <= 0:
            return own, svc
        m = 0.0
        for _ in range(100):
            n = np.minimum(self.batch_size, 1.0 + m)
            own = self.alone_s + (n - 1.0) / span * (self.prefill_s - self.alone_s)
            svc = np.maximum(own / n, self.transfer_s)
            rho = rate_per_s * float(np.dot(self.weights, svc))
            if rho >= 1:
                new = float(self.batch_size.max())
            else:
                wait = rate_per_s * float(np.dot(self.weights, svc**2)) / (2 * (1 - rho))
                new = rate_per_s * p_short * wait
            if abs(new - m) <= 1e-6 * max(new, 1.0):
                break
            m = new
        return own, svc

    def ttft_cdf(self, rate_per_s: float, x_s: float) -> float:
        """``P(TTFT ≤ x)`` at a Poisson rate (0 when unstable)."""
        own, svc = self.at_rate(rate_per_s)
        if rate_per_s * float(np.dot(self.weights, svc)) >= 1:
            return 0.0
        rho, c, g = mg1_wait_tail(rate_per_s, svc, self.weights)
        y = x_s - own - self.transfer_s
        with np.errstate(over="ignore"):
            tail = np.minimum(rho, c * np.exp(-g * np.maximum(y, 0.0)))
        return float(np.dot(self.weights, np.where(y < 0, 0.0, 1.0 - tail)))

    def ttft_quantile_s(self, rate_per_s: float, q: float) -> float:
        lo = float((self.alone_s + self.transfer_s).min())
        if self.ttft_cdf(rate_per_s, lo) >= q:
            return lo
        if rate_per_s * float(np.dot(self.weights, self.at_rate(rate_per_s)[1])) >= 1:
            return math.inf
        hi = 2.0 * lo + 1.0
        while self.ttft_cdf(rate_per_s, hi) < q:
            hi *= 2.0
        for _ in range(60):
            mid = 0.5 * (lo + hi)
            if self.ttft_cdf(rate_per_s, mid) < q:
                lo = mid
            else:
                hi = mid
        return hi


def prefill_profile(
    model: ModelSpec,
    config: PhaseConfig,
    lengths: LengthDistribution,
    *,
    decode: PhaseConfig,
    placement: str = "auto",
) -> PrefillProfile:
    """Tabulate ``D(s)`` and ``X(s)`` over (at most 96) prompt-length atoms.

    Prompt batching (DistServe §3.1, ``formal_models.md`` §2.2): prompts shorter than
    ``L_m`` (:func:`prefill_batch_tokens`) share an iteration with the short prompts
    waiting behind them until the batch reaches ``L_m`` tokens, ``k(s) = ⌈L_m/s⌉`` like
    prompts when full. ``D_b(s)`` is that full batch; how full it is at a rate is
    :meth:`PrefillProfile.at_rate`.
    """
    s, w = compress_atoms(lengths.input_tokens, lengths.weights, _MAX_ATOMS)
    link = kv_link(config, decode, placement)
    lm = prefill_batch_tokens(model, config)
    alone = phase_time_s(model, config, Batch.prefill(1, s))
    k = np.where(s < lm, np.ceil(lm / s), 1.0)
    full = np.where(k > 1, phase_time_s(model, config, Batch.prefill(k, s)), alone)
    x = kv_transfer_time_s(model, s, prefill=config, decode=decode, link=link)
    return PrefillProfile(config, s, w, np.asarray(full), np.asarray(x), link, alone, k, lm)


def prefill_batch_tokens(model: ModelSpec, config: PhaseConfig) -> int:
    """``L_m``: the prompt length past which prefill is compute-bound (DistServe §3.1).

    ``L_m = √2·L*`` with ``L*`` the shortest prompt whose time grows by at least √2
    when it doubles, ``t(2L) ≥ √2·t(L)`` (elasticity ½ over an octave). For a roofline
    that is flat (one weight read) up to its ridge ``R`` and linear after, ``L_m = R``;
    for an affine ``a + b·L``, ``L_m = a/b`` (fixed cost = per-token cost). Batching
    prompts beyond ``L_m`` tokens saves little and delays every prompt in the batch.
    """
    grid = np.unique(np.rint(np.geomspace(1.0, 1 << 17, 241)))
    t = phase_time_s(model, config, Batch.prefill(1, np.concatenate([grid, 2 * grid])))
    t1, t2 = t[: grid.size], t[grid.size :]
    hit = np.flatnonzero(t2 >= math.sqrt(2.0) * t1)
    return round(math.sqrt(2.0) * float(grid[hit[0]])) if hit.size else int(grid[-1])


def prefill_goodput(profile: PrefillProfile, slo: SLO, *, model: ModelSpec) -> PhaseGoodput:
    """Largest rate with ``P(TTFT ≤ slo.ttft_s) ≥ slo.percentile`` on one prefill instance."""
    q = slo.percentile
    cfg = profile.config
    floor = _weighted_quantile(profile.alone_s + profile.transfer_s, profile.weights, q)
    cap = profile.capacity_rate_per_s
    link_cap = profile.link_capacity_per_s
    link_bound = link_cap <= 1.0 / float(np.dot(profile.weights, profile.occupancy_s))
    kv_cap = memory_fit(model, cfg.device, cfg.plan).kv_capacity_tokens
    if floor > slo.ttft_s:
        x_q = _weighted_quantile(profile.transfer_s, profile.weights, q)
        return PhaseGoodput(
            cfg,
            False,
            0.0,
            0.0,
            cap,
            link_cap,
            "kv-link" if link_bound else "ttft",
            floor,
            floor,
            kv_cap,
            f"unloaded p{q * 100:g} TTFT is {floor * 1e3:.1f} ms (KV transfer "
            f"{x_q * 1e3:.1f} ms of it over {profile.link.name})",
        )
    rate = _max_rate(lambda r: profile.ttft_cdf(r, slo.ttft_s) >= q, cap)
    quant = profile.ttft_quantile_s(rate, q)
    return PhaseGoodput(
        cfg,
        rate > 0,
        rate,
        rate / cfg.gpus,
        cap,
        link_cap,
        "kv-link" if link_bound else "ttft",
        floor,
        quant,
        kv_cap,
        f"{rate:.3g} req/s at {rate / cap:.0%} of the prefill capacity {cap:.3g} req/s",
    )


# ---- decode ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DecodeProfile:
    """What sets TPOT on a decode instance: step times, KV slots and output lengths."""

    config: PhaseConfig
    kv_capacity_tokens: int
    slots: float  # c = min(cap, M / E[s + o])
    slot_limit: str  # kv-memory | batch-cap
    multi_fraction: float  # P(o >= 2): requests that decode at all
    steps: Arr  # atoms of n = o − 1 (o >= 2 only)
    step_weights: Arr
    mean_context_tokens: float  # step-weighted mean context
    batch_grid: Arr  # N values where the step time is tabulated
    step_s: Arr  # t(N) at the mean context
    var_coef_s2: float  # E[(∂t/∂N + ∂t/∂K·ctx)²] per resident (batch-noise variance / N̄)
    floor_tpot: Arr  # unloaded TPOT per (s, o) atom (o >= 2)
    floor_weights: Arr
    receive_s_mean: float  # E[receive time]: the ingress link's occupancy per request

    def step_at(self, n: float) -> float:
        return float(np.interp(n, self.batch_grid, self.step_s))

    def mean_batch(self, rate_per_s: float, limit: float | None = None) -> float | None:
        """Fixed point ``N̄ = r·E[o−1]·t(N̄)``; None when it reaches the slots (unstable)."""
        en = float(np.dot(self.step_weights, self.steps))
        lam = rate_per_s * self.multi_fraction
        lim = self.slots if limit is None else float(limit)
        n = 0.0
        for _ in range(500):
            new = lam * en * self.step_at(n)
            if new >= lim:
                return None
            if abs(new - n) <= 1e-9 * max(new, 1.0):
                return new
            n = new
        return n

    def tpot_cdf(self, rate_per_s: float, x_s: float, *, slot_limit: bool = True) -> float:
        """``P(TPOT ≤ x)`` over decoding requests at a Poisson rate (0 when unstable).

        ``slot_limit=False`` lifts the KV/batch-cap admission limit (no admission wait;
        the batch may grow to the end of the tabulated grid).
        """
        nbar = self.mean_batch(rate_per_s, self.slots if slot_limit else self.batch_grid[-1] - 1)
        if nbar is None:
            return 0.0
        n = self.steps
        w = self.step_weights
        t_bar = self.step_at(nbar)
        en = float(np.dot(w, n))
        # batch-noise: M/G/∞ correlation over the request's window of L = n steps
        hold = n  # holding times of the others, in steps
        ehold = en
        L = n[:, None]
        h = hold[None, :]
        j = np.where(h >= L, L**2 * h / 2 - L**3 / 6, L * h**2 / 2 - h**3 / 6)
        var_avg = nbar * 2.0 * (j @ w) / (ehold * n**2) * self.var_coef_s2
        sigma = np.sqrt(np.maximum(var_avg, 0.0)) + 1e-12 * t_bar
        mean = np.full(
            n.shape, self.step_at(min(nbar + 1.0, self.slots) if slot_limit else nbar + 1)
        )
        base = stats.norm.cdf((x_s - mean) / sigma)
        if not slot_limit:
            return float(np.dot(w, base))
        # admission wait: M/G/c, Erlang C with the Allen–Cunneen factor
        offered = nbar
        c_wait = erlang_c(self.slots, offered)
        hold_s = en * t_bar
        cv2 = float(np.dot(w, n**2)) / en**2 - 1.0
        c_int = max(int(self.slots), 1)
        wq = c_wait * hold_s / (c_int - offered) * (1 + cv2) / 2 if offered < c_int else math.inf
        if not math.isfinite(wq):
            return 0.0
        if c_wait > 0 and wq > 0:
            theta = wq / c_wait / n  # mean of the wait spread over the steps, given waiting
            waited = _emg_cdf(x_s, mean, sigma, theta)
        else:
            waited = base
        return float(np.dot(w, (1 - c_wait) * base + c_wait * waited))


def decode_kv_capacity(model: ModelSpec, config: PhaseConfig, lengths: LengthDistribution) -> int:
    """KV tokens a decode instance holds: ``config.kv_capacity_tokens`` when given (a
    measured capacity), else ``memory_fit`` with an activation reserve sized for a decode
    iteration of about twice the expected batch (at most 8192 tokens).

    Raises InfeasibleError when the largest request cannot fit.
    """
    dev, plan = config.device, config.plan
    if config.kv_capacity_tokens is not None:
        M = config.kv_capacity_tokens
    else:
        mean_total = lengths.expect(lambda s, o: s + o)
        slots0 = (
            memory_fit(model, dev, plan, max_batched_tokens=256).kv_capacity_tokens / mean_total
        )
        reserve = int(min(max(256, 2 * (config.batch_cap or slots0)), 8192))
        M = memory_fit(model, dev, plan, max_batched_tokens=reserve).kv_capacity_tokens
    if lengths.max_total_tokens > M:
        raise InfeasibleError(
            f"{model.id} on {config.label}: KV capacity {M:,} tokens cannot hold the largest "
            f"request ({lengths.max_total_tokens:,} tokens)"
        )
    return M


def decode_profile(
    model: ModelSpec,
    config: PhaseConfig,
    lengths: LengthDistribution,
    *,
    link: KVLink,
) -> DecodeProfile:
    """Step times, slots and output atoms of one decode instance type."""
    M = decode_kv_capacity(model, config, lengths)
    mean_total = lengths.expect(lambda s, o: s + o)
    mem_slots = M / mean_total
    slots = mem_slots if config.batch_cap is None else min(mem_slots, float(config.batch_cap))
    limit = (
        "batch-cap"
        if config.batch_cap is not None and config.batch_cap < mem_slots
        else ("kv-memory")
    )
    multi = lengths.output_tokens >= 2
    p_multi = float(lengths.weights[multi].sum())
    if p_multi <= 0:
        raise SpecError("every request has one output token: there is nothing to decode")
    sub_w = lengths.weights * multi / p_multi
    steps, sw = compress_atoms(lengths.output_tokens - 1, sub_w, _MAX_ATOMS)
    sw, steps = sw[steps >= 1], steps[steps >= 1]
    sw = sw / sw.sum()
    e_steps = float(np.dot(sub_w, lengths.output_tokens - 1))
    e_ctx_sum = float(
        np.dot(
            sub_w,
            (lengths.output_tokens - 1) * lengths.input_tokens
            + (lengths.output_tokens - 1) * (lengths.output_tokens - 2) / 2,
        )
    )
    ctx = e_ctx_sum / e_steps
    ctx2 = (
        float(np.dot(sub_w, _sum_ctx_sq(lengths.input_tokens, lengths.output_tokens - 1))) / e_steps
    )
    top = 4 * slots + 8  # room above the slots for the unlimited (limiter) evaluation
    grid = np.unique(np.concatenate([np.linspace(0, top, 513), np.arange(0, 9)]))
    bt = phase_time_s(model, config, Batch.decode(np.maximum(grid, 1.0), ctx))
    # sensitivities at a representative batch for the batch-noise variance
    nb = max(1.0, 0.5 * slots)
    k0 = nb * ctx
    z3 = np.zeros(3)
    pts = Batch(z3, z3, z3, z3, np.array([nb, nb + 1, nb]), np.array([k0, k0, k0 + ctx]))
    t3 = phase_time_s(model, config, pts)
    dn = float(t3[1] - t3[0])
    dk = float(t3[2] - t3[0]) / ctx
    var_coef = dn**2 + 2 * dn * dk * ctx + dk**2 * ctx2
    # unloaded TPOT per request: alone, at its own mean context s + (o − 2)/2
    fs, fo = lengths.input_tokens[multi], lengths.output_tokens[multi]
    mctx, mw = compress_atoms(
        np.rint(fs + (fo - 2) / 2).astype(np.int64), lengths.weights[multi] / p_multi, _MAX_ATOMS
    )
    floor = phase_time_s(model, config, Batch.decode(1, mctx))
    rs, rw = compress_atoms(lengths.input_tokens, lengths.weights, _MAX_ATOMS)
    recv = float(np.dot(rw, receive_time_s(model, rs, decode=config, link=link)))
    return DecodeProfile(
        config=config,
        kv_capacity_tokens=M,
        slots=slots,
        slot_limit=limit,
        multi_fraction=p_multi,
        steps=steps,
        step_weights=sw,
        mean_context_tokens=ctx,
        batch_grid=grid,
        step_s=np.asarray(bt),
        var_coef_s2=var_coef,
        floor_tpot=np.asarray(floor),
        floor_weights=mw,
        receive_s_mean=recv,
    )


def _emg_cdf(x: float, mean: Arr, sigma: Arr, theta: Arr) -> Arr:
    """CDF of Normal(mean, sigma²) + Exponential(mean theta) (exponentially modified normal)."""
    k = theta / sigma
    narrow = k > 1e3  # the normal is negligible next to the exponential
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        emg = stats.exponnorm.cdf(x, np.where(narrow, 1.0, k), loc=mean, scale=sigma)
        expo = np.where(x > mean, -np.expm1(-(x - mean) / theta), 0.0)
    return np.where(narrow, expo, emg)


def _sum_ctx_sq(s: NDArray[np.int64], n: NDArray[np.int64]) -> Arr:
    """``Σ_{j=1..n} (s + j − 1)²``: step-summed squared context of a request."""
    s_ = s.astype(float)
    n_ = n.astype(float)
    return n_ * s_**2 + s_ * n_ * (n_ - 1) + (n_ - 1) * n_ * (2 * n_ - 1) / 6


def decode_goodput(profile: DecodeProfile, slo: SLO) -> PhaseGoodput:
    """Largest rate with ``P(TPOT ≤ slo.tpot_s) ≥ slo.percentile`` on one decode instance.

    The rate counts every request routed to the instance (one-token outputs included).
    ``limiter`` is ``kv-memory``/``batch-cap`` when lifting the slot limit would raise the
    goodput by more than 2 %, else ``tpot``.
    """
    q = slo.percentile
    cfg = profile.config
    floor = _weighted_quantile(profile.floor_tpot, profile.floor_weights, q)
    en = float(np.dot(profile.step_weights, profile.steps))
    cap = profile.slots / (en * profile.step_at(profile.slots)) / profile.multi_fraction
    link_cap = 1.0 / profile.receive_s_mean if profile.receive_s_mean > 0 else math.inf
    if floor > slo.tpot_s:
        return PhaseGoodput(
            cfg,
            False,
            0.0,
            0.0,
            cap,
            link_cap,
            "tpot",
            floor,
            floor,
            profile.kv_capacity_tokens,
            f"unloaded p{q * 100:g} TPOT is {floor * 1e3:.2f} ms",
        )
    hi = cap * 1.05
    rate = _max_rate(lambda r: profile.tpot_cdf(r, slo.tpot_s) >= q, hi)
    free_rate = _max_rate(lambda r: profile.tpot_cdf(r, slo.tpot_s, slot_limit=False) >= q, hi * 4)
    limiter = profile.slot_limit if free_rate > 1.02 * rate else "tpot"
    nbar = profile.mean_batch(rate) or profile.slots
    quant = _tpot_quantile(profile, rate, q)
    return PhaseGoodput(
        cfg,
        rate > 0,
        rate,
        rate / cfg.gpus,
        cap,
        link_cap,
        limiter,
        floor,
        quant,
        profile.kv_capacity_tokens,
        f"{rate:.3g} req/s with a mean batch of {nbar:.1f} of {profile.slots:.0f} slots",
    )


def _tpot_quantile(profile: DecodeProfile, rate: float, q: float) -> float:
    lo, hi = 0.0, float(profile.step_s.max()) * 4 + 1.0
    if profile.tpot_cdf(rate, hi) < q:
        return math.inf
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        if profile.tpot_cdf(rate, mid) < q:
            lo = mid
        else:
            hi = mid
    return hi
