"""Results of the PD planner: allocations, constraint slack, the colocated comparison."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from perfmodel.pd.config import PhaseConfig
from perfmodel.pd.deployment import Deployment
from perfmodel.units import MS_PER_S
from perfmodel.workload.slo import SLO

# ---- results ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Allocation:
    """Instances of one configuration in a plan."""

    phase: str
    config: PhaseConfig
    instances: int
    goodput_per_instance_per_s: float
    limiter: str
    cost_per_instance: float

    @property
    def gpus(self) -> int:
        return self.instances * self.config.gpus

    def to_dict(self) -> dict[str, Any]:
        c = self.config
        return {
            "phase": self.phase,
            "device": c.device.id,
            "tp": c.plan.tp,
            "batch_cap": c.batch_cap,
            "instances": self.instances,
            "gpus": self.gpus,
            "goodput_per_instance_per_s": self.goodput_per_instance_per_s,
            "limiter": self.limiter,
        }


@dataclass(frozen=True)
class Constraint:
    """One MILP constraint at the solution: what it needs, what the plan provides."""

    name: str
    required: float
    provided: float
    slack: float  # (provided − required)/required for ≥ rows; (limit − used)/limit for ≤
    binding: bool = False


@dataclass(frozen=True)
class Colocated:
    """Best colocated (chunked-prefill) configuration of the same devices."""

    feasible: bool
    device: str
    tp: int
    max_batched_tokens: int
    goodput_per_instance_per_s: float
    per_gpu_rate_per_s: float
    note: str


@dataclass(frozen=True)
class PDPlan:
    """A disaggregated plan, its slack, and how it compares with colocated serving."""

    model: str
    workload: str
    rate_per_s: float
    slo: SLO
    link: str
    prefill: tuple[Allocation, ...]
    decode: tuple[Allocation, ...]
    gpus: int
    cost: float
    cost_unit: str  # "GPU" | "USD/h"
    capacity_rate_per_s: float  # goodput of the allocation: min over the ≥ constraints
    goodput_per_gpu: float  # capacity / GPUs
    constraints: tuple[Constraint, ...]
    binding: str
    colocated: Colocated | None
    gain: float | None  # at λ: GPUs colocated serving needs / GPUs of this plan (both whole)
    colocated_gpus: int | None  # GPUs colocated serving needs for λ (whole instances)
    fluid_per_gpu: float  # rate-free optimum: goodput per GPU with fractional instances
    fluid_gain: float | None  # at scale: fluid_per_gpu / colocated goodput per GPU
    solver: str
    status: str
    solve_s: float
    deployment: Deployment = field(repr=False)

    @property
    def prefill_instances(self) -> int:
        return sum(a.instances for a in self.prefill)

    @property
    def decode_instances(self) -> int:
        return sum(a.instances for a in self.decode)

    @property
    def ratio(self) -> float:
        """Prefill : decode instances."""
        return self.prefill_instances / self.decode_instances

    @property
    def gpu_ratio(self) -> float:
        """Prefill : decode GPUs."""
        return sum(a.gpus for a in self.prefill) / sum(a.gpus for a in self.decode)

    @property
    def verdict(self) -> str:
        if self.colocated is None:
            return "colocated baseline not evaluated"
        if not self.colocated.feasible:
            return "disaggregation wins: colocated serving cannot meet these SLOs at any rate"
        assert self.gain is not None and self.fluid_gain is not None
        word = "wins" if self.gain > 1 else ("ties" if self.gain == 1 else "loses")
        scale = "wins" if self.fluid_gain > 1 else "loses"
        return (
            f"disaggregation {word} at {self.rate_per_s:g} req/s: {self.gpus} vs "
            f"{self.colocated_gpus} GPUs colocated ({self.gain:.2f}x); at scale (fractional "
            f"instances) it {scale}: {self.fluid_per_gpu:.3g} vs "
            f"{self.colocated.per_gpu_rate_per_s:.3g} req/s per GPU ({self.fluid_gain:.2f}x)"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "workload": self.workload,
            "rate_per_s": self.rate_per_s,
            "slo": {
                "ttft_ms": self.slo.ttft_s * MS_PER_S,
                "tpot_ms": self.slo.tpot_s * MS_PER_S,
                "percentile": self.slo.percentile,
            },
            "kv_link": self.link,
            "prefill": [a.to_dict() for a in self.prefill],
            "decode": [a.to_dict() for a in self.decode],
            "ratio_prefill_to_decode_instances": self.ratio,
            "ratio_prefill_to_decode_gpus": self.gpu_ratio,
            "gpus": self.gpus,
            "cost": self.cost,
            "cost_unit": self.cost_unit,
            "capacity_rate_per_s": self.capacity_rate_per_s,
            "goodput_per_gpu": self.goodput_per_gpu,
            "binding": self.binding,
            "constraints": [vars(c) for c in self.constraints],
            "colocated": vars(self.colocated) if self.colocated else None,
            "gain": self.gain,
            "colocated_gpus": self.colocated_gpus,
            "fluid_per_gpu": self.fluid_per_gpu,
            "fluid_gain": self.fluid_gain,
            "verdict": self.verdict,
            "solver": self.solver,
            "status": self.status,
            "solve_s": self.solve_s,
        }
