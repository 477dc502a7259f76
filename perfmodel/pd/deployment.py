"""A disaggregated deployment (prefill and decode pools), apart from its simulator
(``perfmodel.pd.simulate``): the planner builds one without importing the simulator."""

from __future__ import annotations

from dataclasses import dataclass

from perfmodel.errors import SpecError
from perfmodel.model import ModelSpec
from perfmodel.pd.config import PhaseConfig


@dataclass(frozen=True)
class Pool:
    """``instances`` instances of one configuration; ``weight`` is each one's routing share."""

    config: PhaseConfig
    instances: int
    weight: float

    def __post_init__(self) -> None:
        if self.instances < 1 or not self.weight > 0:
            raise SpecError("a pool needs >= 1 instance and a positive routing weight")


@dataclass(frozen=True)
class Deployment:
    """A disaggregated deployment: prefill pools, decode pools, KV placement."""

    model: ModelSpec
    prefill: tuple[Pool, ...]
    decode: tuple[Pool, ...]
    placement: str = "auto"

    @property
    def gpus(self) -> int:
        return sum(p.instances * p.config.gpus for p in (*self.prefill, *self.decode))
