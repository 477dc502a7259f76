"""The result of a stability phase sweep (:mod:`reports.stability_sweep`): rows, cells,
simulated points, panels."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from perfmodel.workload.slo import SLO


@dataclass(frozen=True)
class PhaseRow:
    """One value of the panel's y axis and its analytic boundary."""

    y: float  # mean output tokens, or KV capacity tokens
    mean_output_tokens: float
    kv_capacity_tokens: int
    service_rate_per_s: float  # μ: the stability boundary
    compute_rate_per_s: float
    memory_rate_per_s: float
    binding: str
    guaranteed_rate_per_s: float  # μ(1 − δ)
    largest_request_fits: bool  # δ < 1; otherwise no rate is stable
    goodput_per_s: float  # 0 when no rate meets the SLO
    slo_feasible: bool


@dataclass(frozen=True)
class PhaseCell:
    """One (arrival rate, y) cell of the analytic grid."""

    rate_per_s: float
    y: float
    regime: str  # slo-feasible | stable | unstable
    margin: float  # 1 − λ/μ (negative when unstable)
    utilization: float  # λ/μ
    binding: str  # the bound that sets μ on this row


@dataclass(frozen=True)
class SimPoint:
    """A simulated (arrival rate, y) point and its verdict against the formula's."""

    rate_per_s: float
    y: float
    utilization: float  # λ/μ predicted
    analytic_stable: bool
    simulated_stable: bool
    queue_growth_per_s: float
    throughput_per_s: float
    requests: int
    preemptions: int

    @property
    def agrees(self) -> bool:
        return self.analytic_stable == self.simulated_stable


@dataclass(frozen=True)
class PhasePanel:
    """A sweep over arrival rate × one y axis."""

    kind: str  # "output" | "kv"
    y_label: str
    rates_per_s: tuple[float, ...]
    rows: tuple[PhaseRow, ...]
    cells: tuple[PhaseCell, ...] = field(repr=False)
    points: tuple[SimPoint, ...] = ()

    def cell(self, row: int, col: int) -> PhaseCell:
        return self.cells[row * len(self.rates_per_s) + col]

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "y_label": self.y_label,
            "rates_per_s": list(self.rates_per_s),
            "rows": [dict(vars(r)) for r in self.rows],
            "cells": [dict(vars(c)) for c in self.cells],
            "points": [{**vars(p), "agrees": p.agrees} for p in self.points],
        }


@dataclass(frozen=True)
class StabilityPhase:
    model: str
    device: str
    tp: int
    workload: str
    slo: SLO
    max_batched_tokens: int
    chunk_size: int
    panels: tuple[PhasePanel, ...]
    engine: str = "none"  # the serving engine's id ("none": the engine-less roofline)

    def panel(self, kind: str) -> PhasePanel:
        for p in self.panels:
            if p.kind == kind:
                return p
        raise KeyError(kind)

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in vars(self).items() if k not in ("panels", "slo")}
        d["slo"] = dict(vars(self.slo))
        d["panels"] = [p.to_dict() for p in self.panels]
        return d
