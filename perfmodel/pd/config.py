"""Prefill/decode instance configurations, their iteration cost and the KV link between them.

**Cost of an iteration**: ``config.instance(model).iteration_s(batch)`` — the one
iteration-time entry point (:class:`perfmodel.step.instance.Instance`): the roofline step
time of the batch on the TP group, or, when the configuration carries a calibrated
``profile`` (a ``MaxAffine`` over ``PHASE_FEATURES``, e.g. DistServe's measured
``a + b·Σl + c·Σl²`` prefill and ``a + b·Σ(ctx+1) + c·N`` decode), that profile.

The KV of a prompt moves from its prefill instance to its decode instance over a
link (:func:`kv_link`); :func:`kv_transfer_time_s` costs it with
``hardware.comm.collective_time_s`` (``p2p``). :class:`PhaseGoodput` is the per-instance
result both phase models (``perfmodel.pd_prefill``, ``perfmodel.pd_decode``) return.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
from numpy.typing import ArrayLike, NDArray

from hardware.comm import collective_time_s, link_for_group
from hardware.device import Device, Link
from hardware.engine import Engine
from hardware.maxaffine import MaxAffine
from perfmodel.errors import SpecError
from perfmodel.memory import kv_bytes_per_token_per_device
from perfmodel.model import ModelSpec
from perfmodel.plan import ParallelPlan
from perfmodel.step.instance import Instance, check_profile_features

Arr = NDArray[np.float64]


PHASES = ("prefill", "decode")
KV_PLACEMENTS = ("auto", "scale-up", "scale-out")
MAX_ATOMS = 96

# ---- configurations and the KV link ----------------------------------------------------------


@dataclass(frozen=True)
class PhaseConfig:
    """One instance type of a phase: a device, a TP degree and (decode) a batch cap.

    ``profile``: a calibrated cost profile of this phase's iterations on this TP group
    (a :class:`hardware.maxaffine.MaxAffine` over :data:`PHASE_FEATURES`, e.g. DistServe's
    measured prefill ``a + b·Σl + c·Σl²`` as one piece); when set it is evaluated instead
    of the roofline ``step_time`` for every iteration of this configuration.
    ``engine``: the serving engine of the instance (its kernel efficiencies, host
    overheads and KV memory budget enter every iteration and the memory fit).
    """

    phase: str
    device: Device
    plan: ParallelPlan
    batch_cap: int | None = None  # decode: most concurrent requests; None = KV memory only
    profile: MaxAffine | None = field(default=None, compare=False)
    kv_capacity_tokens: int | None = None  # decode: measured KV capacity; None = memory_fit
    engine: Engine | None = field(default=None, compare=False)  # None: engine-less roofline

    def __post_init__(self) -> None:
        if self.phase not in PHASES:
            raise SpecError(f"phase must be one of {PHASES}, got {self.phase!r}")
        if self.batch_cap is not None and self.batch_cap < 1:
            raise SpecError(f"batch cap must be a positive integer, got {self.batch_cap}")
        if self.kv_capacity_tokens is not None and self.kv_capacity_tokens < 1:
            raise SpecError(
                f"KV capacity must be a positive number of tokens, got {self.kv_capacity_tokens}"
            )
        check_profile_features(self.profile, self.phase)

    @property
    def gpus(self) -> int:
        return self.plan.devices

    def instance(self, model: ModelSpec) -> Instance:
        """The instance of ``model`` this configuration runs: every iteration is costed there."""
        return Instance(model, self.device, self.plan, self.profile, self.engine)

    @property
    def label(self) -> str:
        cap = f" cap{self.batch_cap}" if self.batch_cap else ""
        cal = " (calibrated)" if self.profile is not None else ""
        par = f" DP{self.plan.dp}" if self.plan.dp > 1 else ""
        par += f" EP{self.plan.ep}" if self.plan.ep > 1 else ""
        return f"{self.device.id} TP{self.plan.tp}{par}{cap}{cal}"


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
    #: the percentile latency at the goodput, computed when first read (a quantile search
    #: per configuration that the planners never read: 0.2 s of the README plan's 1.4 s PD
    #: evaluation); picklable (a ``functools.partial``)
    quantile: Callable[[], float] = field(repr=False, compare=False)
    kv_capacity_tokens: int
    note: str

    @cached_property
    def quantile_at_goodput_s(self) -> float:
        return self.quantile()

    @classmethod
    def of(
        cls,
        config: PhaseConfig,
        capacity_rate_per_s: float,
        link_capacity_per_s: float,
        kv_capacity_tokens: int,
    ) -> Callable[[float, str, float, Callable[[], float], str], PhaseGoodput]:
        """The goodput of ``config`` given ``(rate_per_s, limiter, floor_s, quantile,
        note)``; a rate of 0 (no rate meets the SLO) is infeasible."""

        def at(
            rate: float, limiter: str, floor_s: float, quantile: Callable[[], float], note: str
        ) -> PhaseGoodput:
            return cls(
                config, rate > 0, rate, rate / config.gpus, capacity_rate_per_s,
                link_capacity_per_s, limiter, floor_s, quantile, kv_capacity_tokens, note,
            )  # fmt: skip

        return at


def weighted_quantile(x: Arr, w: Arr, q: float) -> float:
    order = np.argsort(x, kind="stable")
    cdf = np.cumsum(w[order])
    return float(x[order][min(int(np.searchsorted(cdf, q - 1e-12)), x.size - 1)])
