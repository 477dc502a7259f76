"""How a model is laid out on devices: tensor and pipeline parallelism, numeric formats."""

from __future__ import annotations

from dataclasses import dataclass, field

from perfmodel.dtypes import get_dtype
from perfmodel.errors import SpecError


@dataclass(frozen=True)
class ParallelPlan:
    """Tensor parallelism over ``tp`` devices, pipeline parallelism over ``pp`` stages, dtypes.

    An instance spans ``tp·pp`` devices: ``pp`` pipeline stages, each a tensor-parallel
    group of ``tp`` devices holding a contiguous slice of the layers
    (``perfmodel.pipeline``; ``pp`` at most the model's layers, checked where the model
    is known). With ``pp > 1`` the engine keeps ``pp`` micro-batches in flight, one per
    virtual engine (vLLM); ``perfmodel.step.step_time`` returns the iteration time of
    one virtual engine and ``perfmodel.queueing`` serves the arrivals with ``pp`` of them.
    ``pp`` is keyword-only so that the positional ``(tp, weight, act, kv)`` form stays.

    ``weight_dtype`` is how weights are stored (bytes streamed), ``act_dtype`` the math
    and activation format (selects the compute peak), ``kv_dtype`` the KV cache format.
    Experts of MoE layers are tensor-sharded like dense MLPs (vLLM's default without
    expert parallelism); expert-parallel dispatch is modeled in ``solvers.dispatch``.
    """

    tp: int = 1
    weight_dtype: str = "bf16"
    act_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    pp: int = field(default=1, kw_only=True)

    def __post_init__(self) -> None:
        if not (isinstance(self.tp, int) and self.tp >= 1):
            raise SpecError(f"tp must be a positive integer, got {self.tp!r}")
        if not (isinstance(self.pp, int) and not isinstance(self.pp, bool) and self.pp >= 1):
            raise SpecError(f"pp must be a positive integer, got {self.pp!r}")
        for name in ("weight_dtype", "act_dtype", "kv_dtype"):
            object.__setattr__(self, name, get_dtype(getattr(self, name)).name)

    @property
    def devices(self) -> int:
        """Devices of one instance: ``tp·pp``."""
        return self.tp * self.pp

    @property
    def weight_bytes(self) -> float:
        return get_dtype(self.weight_dtype).bytes

    @property
    def act_bytes(self) -> float:
        return get_dtype(self.act_dtype).bytes

    @property
    def kv_bytes(self) -> float:
        return get_dtype(self.kv_dtype).bytes
