"""Results of the fleet planner: pools, fleets, alternatives, sensitivity."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from perfmodel.cost.power import CostEnergy
from solvers.fleet.candidates import Candidate


@dataclass(frozen=True)
class Pool:
    """``instances`` instances of one candidate configuration and the rate routed to it."""

    candidate: Candidate
    instances: int
    rate_per_s: float  # the share of the planned rate (no headroom) this pool serves
    price_per_hour_usd: float | None  # per device
    #: request-size buckets routed here: (bucket, fraction of that bucket's requests)
    buckets: tuple[tuple[str, float], ...] = ()

    @property
    def devices(self) -> int:
        return self.instances * self.candidate.devices

    @property
    def utilization(self) -> float:
        """``λ_pool / (N·μ)``: the fraction of the pool's stability limit in use."""
        return self.rate_per_s / (self.instances * self.candidate.capacity_per_instance_per_s)

    @property
    def goodput_load(self) -> float:
        """``λ_pool / (N·goodput)``: the fraction of the pool's SLO capacity in use."""
        return self.rate_per_s / (self.instances * self.candidate.goodput_per_instance_per_s)

    @property
    def per_instance_rate_per_s(self) -> float:
        return self.rate_per_s / self.instances

    @property
    def cost_per_hour_usd(self) -> float | None:
        p = self.price_per_hour_usd
        return None if p is None else p * self.devices

    def to_dict(self) -> dict[str, Any]:
        c = self.candidate
        return {
            "device": c.device.id,
            "count": self.devices,
            "instances": self.instances,
            "tp": c.tp,
            "pp": c.pp,
            "ep": 1,  # the parallel plan has no EP degree: MoE experts are TP-sharded
            "dtype": c.dtype,
            "role": c.role,
            "rate_per_s": self.rate_per_s,
            "per_instance_rate_per_s": self.per_instance_rate_per_s,
            "utilization": self.utilization,
            "stability_margin": 1.0 - self.utilization,
            "goodput_load": self.goodput_load,
            "goodput_per_instance_per_s": c.goodput_per_instance_per_s,
            "service_rate_per_instance_per_s": c.capacity_per_instance_per_s,
            "binding": c.limiter,
            "kv_capacity_tokens": c.kv_capacity_tokens,
            "max_batched_tokens": c.max_batched_tokens or None,
            "decode_class": c.decode_class or None,
            "kv_link": c.link or None,
            "price_per_hour_usd": self.price_per_hour_usd,
            "cost_per_hour_usd": self.cost_per_hour_usd,
            "buckets": [{"bucket": b, "fraction": f} for b, f in self.buckets] or None,
        }


@dataclass(frozen=True)
class Fleet:
    """A set of pools serving the planned rate, with its money and energy."""

    pools: tuple[Pool, ...]
    economics: CostEnergy
    objective: float  # the MILP objective: $/h when priced, devices otherwise
    status: str  # optimal | time_limit
    gap: float | None
    binding: str  # the tightest constraint at the solution
    solve_s: float

    @property
    def devices(self) -> int:
        return sum(p.devices for p in self.pools)

    @property
    def device_types(self) -> tuple[str, ...]:
        return tuple(sorted({p.candidate.device.id for p in self.pools}))

    @property
    def disaggregated(self) -> bool:
        return any(p.candidate.role != "colocated" for p in self.pools)

    @property
    def summary(self) -> str:
        parts = [
            f"{p.devices}x {p.candidate.device.id} (TP{p.candidate.tp} {p.candidate.role})"
            for p in self.pools
        ]
        return " + ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        e = self.economics
        return {
            "summary": self.summary,
            "cost_per_hour_usd": e.cost_per_hour_usd,
            "cost_per_million_output_tokens_usd": e.cost_per_million_output_tokens_usd,
            "energy_j_per_output_token": e.energy_j_per_output_token,
            "power_w": e.power_w,
            "kwh_per_day": e.kwh_per_day,
            "devices": self.devices,
            "disaggregated": self.disaggregated,
            "pools": [p.to_dict() for p in self.pools],
            "binding": self.binding,
            "solver_status": self.status,
            "mip_gap": self.gap,
            "solve_s": self.solve_s,
        }


@dataclass(frozen=True)
class Alternative:
    """A fleet under a restriction (one device type, colocated only, ...) or why none."""

    name: str
    fleet: Fleet | None
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        if self.fleet is None:
            return {"feasible": False, "reason": self.reason, "cost_per_hour_usd": None}
        return {"feasible": True, **self.fleet.to_dict()}


@dataclass(frozen=True)
class Sensitivity:
    """How the answer moves when one input changes."""

    change: str
    cost_per_hour_usd: float | None
    devices: int | None
    summary: str
    same_mix: bool | None

    def to_dict(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass(frozen=True)
class PlanResult:
    """The recommendation, its alternatives and sensitivity, and what it assumed."""

    recommendation: Fleet
    best_single_device: dict[str, Alternative]
    colocated_only: Alternative
    disaggregated: Alternative | None
    sensitivity: tuple[Sensitivity, ...]
    price_flips: tuple[str, ...]
    why: tuple[str, ...]
    candidates: tuple[Candidate, ...] = field(repr=False)
    rejected: tuple[str, ...] = field(repr=False)
    assumptions: dict[str, Any] = field(default_factory=dict)
    priced: bool = True
    verification: tuple[Any, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "recommendation": self.recommendation.to_dict(),
            "alternatives": {
                "best_single_device": {
                    k: v.to_dict() for k, v in sorted(self.best_single_device.items())
                },
                "colocated_only": self.colocated_only.to_dict(),
                "disaggregated": self.disaggregated.to_dict() if self.disaggregated else None,
            },
            "why": list(self.why),
            "sensitivity": [s.to_dict() for s in self.sensitivity],
            "price_flips": list(self.price_flips),
            "comparison_unit": "USD/h" if self.priced else "devices",
            "candidates": [c.to_dict() for c in self.candidates],
            "rejected_configurations": list(self.rejected),
            "assumptions": self.assumptions,
            "verification": [v.to_dict() for v in self.verification],
        }


def _avg(members: Sequence[tuple[Candidate, int]], weights: list[float], attr: str) -> float:
    return sum(getattr(c, attr) * w for (c, _), w in zip(members, weights, strict=True))


def merge_pools(chosen: Sequence[tuple[Candidate, int]]) -> list[tuple[Candidate, int]]:
    """One pool per (device, TP, PP, role): prefill options evaluated against different
    decode classes are the same instances (their goodputs are averaged by instances)."""
    groups: dict[tuple[str, int, int, str], list[tuple[Candidate, int]]] = {}
    for c, n in chosen:
        groups.setdefault((c.device.id, c.tp, c.pp, c.role), []).append((c, n))
    out = []
    for members in groups.values():
        tot = sum(n for _, n in members)
        first = members[0][0]
        if len(members) == 1:
            out.append((first, tot))
            continue
        weights = [n / tot for _, n in members]
        merged = replace(
            first,
            goodput_per_instance_per_s=_avg(members, weights, "goodput_per_instance_per_s"),
            capacity_per_instance_per_s=_avg(members, weights, "capacity_per_instance_per_s"),
            link_capacity_per_s=_avg(members, weights, "link_capacity_per_s"),
            decode_class="; ".join(sorted({c.decode_class for c, _ in members})),
        )
        out.append((merged, tot))
    return out
