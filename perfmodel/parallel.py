"""How a model is laid out on devices: tensor parallelism and numeric formats."""

from __future__ import annotations

from dataclasses import dataclass

from perfmodel.dtypes import get_dtype
from perfmodel.errors import SpecError


@dataclass(frozen=True)
class ParallelPlan:
    """Tensor parallelism over ``tp`` devices of one scale-up domain, and dtypes.

    ``weight_dtype`` is how weights are stored (bytes streamed), ``act_dtype`` the math
    and activation format (selects the compute peak), ``kv_dtype`` the KV cache format.
    Experts of MoE layers are tensor-sharded like dense MLPs (vLLM's default without
    expert parallelism); expert-parallel dispatch is modeled in ``solvers.dispatch``.
    Pipeline parallelism is not modeled.
    """

    tp: int = 1
    weight_dtype: str = "bf16"
    act_dtype: str = "bf16"
    kv_dtype: str = "bf16"

    def __post_init__(self) -> None:
        if not (isinstance(self.tp, int) and self.tp >= 1):
            raise SpecError(f"tp must be a positive integer, got {self.tp!r}")
        for name in ("weight_dtype", "act_dtype", "kv_dtype"):
            object.__setattr__(self, name, get_dtype(getattr(self, name)).name)

    @property
    def weight_bytes(self) -> float:
        return get_dtype(self.weight_dtype).bytes

    @property
    def act_bytes(self) -> float:
        return get_dtype(self.act_dtype).bytes

    @property
    def kv_bytes(self) -> float:
        return get_dtype(self.kv_dtype).bytes
