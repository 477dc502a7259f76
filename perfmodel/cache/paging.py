"""Paging costs: expert and adapter misses fetched over the host link or from NVMe.

Every transfer time comes from :func:`hardware.comm.collective_time_s` as a
point-to-point copy (``"p2p"``, group of 2) over a :class:`hardware.device.Link`:
``overhead + bytes / (COMM_EFFICIENCY · bw) + latency``.

* **Host memory → device**: the device's ``host_link`` (PCIe generation from the
  device file, bandwidth per direction).
* **NVMe → device**: NVMe → host DRAM → device, pipelined in chunks, so the copy takes
  the slower of the two legs (``max``). The NVMe link is constructed here with
  documented defaults (overridable): 7.0 GB/s sequential read, the class of PCIe 4.0
  x4 datacenter/consumer SSDs (Samsung 990 PRO datasheet: 7,450 MB/s; Micron 7450:
  6,800 MB/s), and 100 µs access latency (4 KiB random-read latency of the same class,
  70-100 µs).

Expert misses on the decode path
    A step that needs ``m`` non-resident experts fetches them: ``X = m·t_fetch``.
    *On the critical path* (fetch on demand) the step takes ``t + X``; *prefetched*
    (the gate of layer ℓ predicts layer ℓ+1, Pre-gated MoE / HOBBIT's layer-level
    prefetch) the transfer overlaps compute, ``max(t, X)``. A fraction ``α`` of the
    misses predicted in time gives ``max(t, α·X) + (1 − α)·X``.

Low-precision fallback (HOBBIT, Tang et al., arXiv 2411.01433)
    A fraction ``f`` of the missed experts is loaded in a low precision instead:
    ``t_fetch = (1 − f)·t(S_hi) + f·t(S_lo)``; byte savings ``f·(S_hi − S_lo)`` per
    miss. Against an all-high-precision baseline with the same misses the decode
    speed-up is ``(t + X_hi)/(t + X_mix)``, which tends to ``t(S_hi)/t(S_lo)`` (about
    the byte ratio) when the transfer dominates — the bound no precision mix exceeds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from hardware.comm import collective_time_s
from hardware.device import Device, Link
from perfmodel.cache.hitrate import che_lru, che_lru_steps, static_hit_ratio, step_activation
from perfmodel.errors import InfeasibleError, SpecError

DEFAULT_NVME_BW_BYTES_PER_S = 7.0e9
DEFAULT_NVME_LATENCY_S = 100e-6
Source = Literal["host", "nvme"]
Policy = Literal["static", "lru"]
SOURCES: tuple[str, ...] = ("host", "nvme")
POLICIES: tuple[str, ...] = ("static", "lru")


def nvme_link(
    bw_bytes_per_s: float = DEFAULT_NVME_BW_BYTES_PER_S,
    latency_s: float = DEFAULT_NVME_LATENCY_S,
    *,
    name: str = "NVMe SSD (PCIe 4.0 x4)",
) -> Link:
    """An NVMe drive as a link (defaults in the module docstring)."""
    if not (math.isfinite(bw_bytes_per_s) and bw_bytes_per_s > 0):
        raise SpecError(f"NVMe bandwidth must be a positive number of B/s, got {bw_bytes_per_s}")
    if not (math.isfinite(latency_s) and latency_s >= 0):
        raise SpecError(f"NVMe latency must be >= 0 s, got {latency_s}")
    return Link(name, bw_per_direction_bytes_per_s=bw_bytes_per_s, latency_s=latency_s)


def link_transfer_s(bytes_: ArrayLike, link: Link) -> float:
    """One point-to-point copy of ``bytes_`` over ``link`` (seconds)."""
    b = float(np.asarray(bytes_, dtype=np.float64))
    if not (math.isfinite(b) and b >= 0):
        raise SpecError(f"transfer size must be >= 0 bytes, got {b}")
    return float(collective_time_s("p2p", b, group=2, link=link))


def fetch_time_s(
    bytes_: float, device: Device, *, source: str = "host", nvme: Link | None = None
) -> float:
    """Seconds to bring ``bytes_`` onto ``device`` from host DRAM or NVMe (pipelined)."""
    if source not in SOURCES:
        raise SpecError(f"unknown paging source {source!r}; valid: {', '.join(SOURCES)}")
    t_host = link_transfer_s(bytes_, device.host_link)
    if source == "host":
        return t_host
    return max(t_host, link_transfer_s(bytes_, nvme or nvme_link()))


# ---- expert misses per step ------------------------------------------------------------------


@dataclass(frozen=True)
class ExpertMisses:
    """Expected misses of one MoE layer's expert cache per step of ``tokens`` tokens."""

    capacity: float  # experts cached per layer
    tokens: float
    distinct: float  # D(B): experts a step needs
    misses: float  # of them, not resident (fetched)
    hit_ratio: float  # activation-weighted


def expert_misses(
    activation: ArrayLike, tokens: float, capacity: float, *, policy: str = "static"
) -> ExpertMisses:
    """Misses per step of a per-layer cache of ``capacity`` experts.

    ``a_i = 1 − (1 − π_i)^B``; static top-``C`` by popularity: misses ``Σ_{i∉top C} a_i``;
    LRU: per-step Che (:func:`perfmodel.hitrate.che_lru_steps`), ``Σ a_i (1 − h_i)``.
    """
    if policy not in POLICIES:
        raise SpecError(f"unknown cache policy {policy!r}; valid: {', '.join(POLICIES)}")
    a = step_activation(activation, tokens)
    if a.sum() <= 0:
        raise SpecError("no expert is ever activated (zero popularity); check the routing input")
    if policy == "static":
        hit = static_hit_ratio(a, capacity)
        misses = float(a.sum()) * (1.0 - hit)
    else:
        r = che_lru_steps(a, capacity)
        hit, misses = r.hit_ratio, r.miss_rate
    return ExpertMisses(float(capacity), float(tokens), float(a.sum()), misses, hit)


@dataclass(frozen=True)
class ExpertFetch:
    """Per-miss transfer of one expert, possibly in a low precision (HOBBIT)."""

    high_bytes: float
    low_bytes: float
    low_fraction: float
    high_s: float
    low_s: float

    @property
    def mean_s(self) -> float:
        return (1.0 - self.low_fraction) * self.high_s + self.low_fraction * self.low_s

    @property
    def mean_bytes(self) -> float:
        return (1.0 - self.low_fraction) * self.high_bytes + self.low_fraction * self.low_bytes

    @property
    def saved_bytes_per_miss(self) -> float:
        """``f·(S_hi − S_lo)``."""
        return self.high_bytes - self.mean_bytes


def expert_fetch(
    high_bytes: float,
    link: Link,
    *,
    low_bytes: float | None = None,
    low_fraction: float = 0.0,
) -> ExpertFetch:
    """Transfer time of one missed expert over ``link`` with a low-precision fraction."""
    if not 0.0 <= low_fraction <= 1.0:
        raise SpecError(f"low-precision fraction must be in [0, 1], got {low_fraction}")
    lo = high_bytes if low_bytes is None else low_bytes
    if lo > high_bytes:
        raise SpecError("the low-precision expert must not be larger than the high-precision one")
    return ExpertFetch(
        high_bytes, lo, low_fraction, link_transfer_s(high_bytes, link), link_transfer_s(lo, link)
    )


def step_with_misses_s(compute_s: float, miss_s: float, *, prefetched: float = 0.0) -> float:
    """``max(t, α·X) + (1 − α)·X``: step time with ``X`` seconds of fetches, ``α`` prefetched."""
    if not 0.0 <= prefetched <= 1.0:
        raise SpecError(f"prefetched fraction must be in [0, 1], got {prefetched}")
    return max(compute_s, prefetched * miss_s) + (1.0 - prefetched) * miss_s


@dataclass(frozen=True)
class Speedup:
    """Decode speed-up of a mixed-precision fallback over an all-high baseline."""

    baseline_step_s: float
    step_s: float
    speedup: float
    bound: float  # transfer-dominated limit t(S_hi)/t(S_lo) (all misses low precision)


def fallback_speedup(
    compute_s: float,
    misses_per_step: float,
    fetch: ExpertFetch,
    *,
    baseline_misses_per_step: float | None = None,
    prefetched: float = 0.0,
) -> Speedup:
    """``(t + m_base·t_hi) / (t + m·t_mix)`` (with prefetch overlap as in the docstring)."""
    mb = misses_per_step if baseline_misses_per_step is None else baseline_misses_per_step
    base = step_with_misses_s(compute_s, mb * fetch.high_s, prefetched=prefetched)
    new = step_with_misses_s(compute_s, misses_per_step * fetch.mean_s, prefetched=prefetched)
    return Speedup(base, new, base / new, fetch.high_s / fetch.low_s if fetch.low_s else math.inf)


def bandwidth_for_speedup(
    target: float,
    *,
    compute_s: float,
    misses_per_step: float,
    high_bytes: float,
    low_bytes: float,
    low_fraction: float,
    latency_s: float = 0.0,
    baseline_misses_per_step: float | None = None,
) -> float:
    """Largest link bandwidth (B/s per direction) at which the fallback reaches ``target``.

    The speed-up falls as the link gets faster (transfers shrink next to compute), so
    the answer is an upper bound on the link. Raises :class:`InfeasibleError` when even
    a vanishing bandwidth does not reach ``target`` (it exceeds the byte-ratio bound).
    """
    from scipy.optimize import brentq

    if not target > 1.0:
        raise SpecError(f"target speed-up must be > 1, got {target}")

    def gap(log_bw: float) -> float:
        link = Link("candidate", bw_per_direction_bytes_per_s=math.exp(log_bw), latency_s=latency_s)
        f = expert_fetch(high_bytes, link, low_bytes=low_bytes, low_fraction=low_fraction)
        s = fallback_speedup(
            compute_s, misses_per_step, f, baseline_misses_per_step=baseline_misses_per_step
        )
        return s.speedup - target

    lo, hi = math.log(1e3), math.log(1e15)
    if gap(lo) <= 0:
        raise InfeasibleError(
            f"a {target:g}x decode speed-up is out of reach of this precision mix at any link "
            f"bandwidth: the limit is {gap(lo) + target:.3g}x (the high/low transfer-time ratio)"
        )
    if gap(hi) >= 0:
        return math.inf
    return math.exp(brentq(gap, lo, hi, xtol=1e-9))


# ---- adapters -------------------------------------------------------------------------------


@dataclass(frozen=True)
class AdapterPaging:
    """Resident adapters: hit ratio, miss load time and expected load time per request."""

    resident: float
    catalog: int
    hit_ratio: float
    load_s: float  # one adapter fetched on a miss
    mean_load_s: float  # (1 − hit)·load_s per request


def adapter_paging(
    popularity: ArrayLike,
    resident: float,
    adapter_bytes: float,
    device: Device,
    *,
    policy: str = "lru",
    source: str = "host",
    nvme: Link | None = None,
) -> AdapterPaging:
    """Hit ratio of ``resident`` adapters (static top-K or LRU/Che) and the miss cost."""
    if policy not in POLICIES:
        raise SpecError(f"unknown cache policy {policy!r}; valid: {', '.join(POLICIES)}")
    p = np.asarray(popularity, dtype=np.float64)
    hit = static_hit_ratio(p, resident) if policy == "static" else che_lru(p, resident).hit_ratio
    load = fetch_time_s(adapter_bytes, device, source=source, nvme=nvme)
    return AdapterPaging(float(resident), int(p.size), hit, load, (1.0 - hit) * load)


# ---- an offloaded expert cache as a per-step time penalty ------------------------------------


@dataclass(frozen=True)
class OffloadedExperts:
    """Routed experts in host memory with a per-layer device cache of ``capacity`` experts.

    ``penalty_s(T, t)`` is what fetching the misses of a step of ``T`` tokens adds to a
    step that would take ``t`` with every expert resident:
    ``step_with_misses_s(t, L·m(T)·t_fetch, α) − t`` with ``m(T)`` from
    :func:`expert_misses` (LRU hit probabilities re-solved on a log grid of ``T`` and
    interpolated).
    """

    activation: np.ndarray  # π_i per token, Σ = top_k
    moe_layers: int
    capacity: float
    policy: str
    fetch: ExpertFetch
    prefetched: float = 0.0

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise SpecError(f"unknown cache policy {self.policy!r}; valid: {', '.join(POLICIES)}")
        if not 0.0 <= self.prefetched <= 1.0:
            raise SpecError(f"prefetched fraction must be in [0, 1], got {self.prefetched}")

    def misses_per_step(self, tokens: float) -> float:
        """Expected experts fetched per step over all MoE layers."""
        if tokens <= 0:
            return 0.0
        return (
            self.moe_layers
            * expert_misses(self.activation, tokens, self.capacity, policy=self.policy).misses
        )

    def miss_table(self, max_tokens: int) -> np.ndarray:
        """``misses_per_step(T)`` for ``T = 0..max_tokens`` (log-grid interpolation)."""
        grid = np.unique(np.round(np.geomspace(1, max(max_tokens, 1), 48)).astype(int))
        vals = np.array([self.misses_per_step(float(g)) for g in grid])
        out = np.interp(np.arange(max_tokens + 1), grid, vals)
        out[0] = 0.0
        return out

    def penalty_s(self, tokens: float, step_s: float) -> float:
        x = self.misses_per_step(tokens) * self.fetch.mean_s
        return step_with_misses_s(step_s, x, prefetched=self.prefetched) - step_s
