"""Power, energy and money per token of a fleet at its planned utilization.

Power of one device at utilization ``u`` (the fraction of its service capacity in use,
``λ/(N·μ)`` of its pool)::

    P(u) = P_idle + (P_max − P_idle)·u

with ``P_max`` the device's TDP (an upper bound: a serving H200 at batch 128 drew 593 W
of its 700 W) and ``P_idle`` its measured idle draw where published (``idle_w`` in the
catalog), else :data:`DEFAULT_IDLE_FRACTION` of the TDP. The linear form is the usual
server power model (Fan, Weber & Barroso, "Power provisioning for a warehouse-sized
computer", ISCA 2007). Then, for a fleet serving ``λ`` requests/s of mean output ``E[o]``
tokens::

    J/token      = Σ_pools N·P(u) / (λ·E[o])
    kWh/day      = Σ_pools N·P(u) · 24 h / 1000
    $/M tokens   = (Σ_pools N·price) / (λ·E[o]·3600) · 1e6
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hardware.device import Device
from perfmodel.errors import SpecError
from perfmodel.units import KILO, MEGA, S_PER_HOUR

#: Idle draw as a fraction of TDP for devices without a published idle figure: the one
#: measurement in the catalog, H200 SXM 80.3 W of 700 W (see ``h200-sxm.toml`` sources).
DEFAULT_IDLE_FRACTION = 80.3 / 700.0
HOURS_PER_DAY = 24.0


@dataclass(frozen=True)
class PowerModel:
    """``P(u) = idle + (max − idle)·u`` for one device."""

    device: str
    idle_w: float
    max_w: float
    idle_source: str  # "measured" | "assumed"

    def power_w(self, utilization: float) -> float:
        u = min(max(utilization, 0.0), 1.0)
        return self.idle_w + (self.max_w - self.idle_w) * u

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "idle_w": self.idle_w,
            "max_w": self.max_w,
            "idle_source": self.idle_source,
        }


def power_model(device: Device) -> PowerModel | None:
    """The device's power model, or None when the catalog has no TDP for it."""
    if device.tdp_w is None:
        return None
    if device.idle_w is not None:
        return PowerModel(device.id, device.idle_w, device.tdp_w, "measured")
    return PowerModel(device.id, DEFAULT_IDLE_FRACTION * device.tdp_w, device.tdp_w, "assumed")


@dataclass(frozen=True)
class PoolUse:
    """One pool of a fleet: how many devices, at which utilization, at what price."""

    device: Device
    devices: int
    utilization: float
    price_per_hour_usd: float | None


@dataclass(frozen=True)
class CostEnergy:
    """Money and energy of a fleet at its planned rate."""

    cost_per_hour_usd: float | None
    cost_per_million_output_tokens_usd: float | None
    power_w: float | None
    energy_j_per_output_token: float | None
    kwh_per_day: float | None
    output_tokens_per_s: float

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def cost_energy(
    pools: Sequence[PoolUse], *, rate_per_s: float, mean_output_tokens: float
) -> CostEnergy:
    """$/h, $/M output tokens, power, J per output token and kWh/day (module docstring).

    A figure is None when a pool lacks what it needs (a price, a TDP).
    """
    if rate_per_s <= 0 or mean_output_tokens <= 0:
        raise SpecError("cost and energy need a positive rate and mean output length")
    tok_per_s = rate_per_s * mean_output_tokens
    prices = [p.price_per_hour_usd for p in pools]
    cost = (
        None
        if any(p is None for p in prices)
        else sum((p or 0.0) * u.devices for p, u in zip(prices, pools, strict=True))
    )
    power: float | None = 0.0
    for u in pools:
        pm = power_model(u.device)
        if pm is None or power is None:
            power = None
            continue
        power += pm.power_w(u.utilization) * u.devices
    return CostEnergy(
        cost_per_hour_usd=cost,
        cost_per_million_output_tokens_usd=(
            None if cost is None else cost / (tok_per_s * S_PER_HOUR) * MEGA
        ),
        power_w=power,
        energy_j_per_output_token=None if power is None else power / tok_per_s,
        kwh_per_day=None if power is None else power * HOURS_PER_DAY / KILO,
        output_tokens_per_s=tok_per_s,
    )
