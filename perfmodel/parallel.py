"""How a model is laid out on devices: tensor, pipeline, expert and attention-data
parallelism, numeric formats per module."""

from __future__ import annotations

from dataclasses import dataclass, field

from perfmodel.dtypes import ModuleDTypes, get_dtype
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
    ``modules`` overrides ``weight_dtype`` per module kind (attention, dense MLP, shared
    and routed experts; a checkpoint's ``quantization_config`` sets it by default).

    Attention data parallelism and expert parallelism ("wide EP", SGLang/vLLM): each
    pipeline stage has ``dp`` attention replicas of ``tp`` devices, each serving its own
    ``1/dp`` of the requests; the routed experts of an MoE layer are split over ``ep``
    of the stage's ``tp·dp`` devices (``ep`` divides ``tp·dp``; each expert is further
    tensor-sharded ``tp·dp/ep`` ways) and tokens reach them by an all-to-all dispatch
    and combine. ``ep = 1``: experts are tensor-sharded like dense MLPs (vLLM's
    default without expert parallelism).
    """

    tp: int = 1
    weight_dtype: str = "bf16"
    act_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    pp: int = field(default=1, kw_only=True)
    ep: int = field(default=1, kw_only=True)
    dp: int = field(default=1, kw_only=True)
    modules: ModuleDTypes | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "ep", "dp"):
            v = getattr(self, name)
            if not (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
                raise SpecError(f"{name} must be a positive integer, got {v!r}")
        if (self.tp * self.dp) % self.ep:
            raise SpecError(
                f"ep={self.ep} must divide tp·dp = {self.tp * self.dp} (the experts are "
                f"spread over the devices of one stage); use ep in "
                f"{[e for e in range(1, self.tp * self.dp + 1) if self.tp * self.dp % e == 0]}"
            )
        for name in ("weight_dtype", "act_dtype", "kv_dtype"):
            object.__setattr__(self, name, get_dtype(getattr(self, name)).name)

    @property
    def devices(self) -> int:
        """Devices of one instance: ``tp·dp·pp``."""
        return self.tp * self.dp * self.pp

    @property
    def expert_tp(self) -> int:
        """Ways each routed expert is tensor-sharded: ``tp·dp/ep``."""
        return self.tp * self.dp // self.ep

    @property
    def weights(self) -> ModuleDTypes:
        """Weight formats per module (uniform ``weight_dtype`` unless ``modules`` is set)."""
        return self.modules or ModuleDTypes.uniform(self.weight_dtype)

    def weight_bytes_of(self, module: str) -> float:
        """Bytes per weight of a module kind (``dtypes.MODULES``, ``embedding``, ``other``)."""
        return self.weights.bytes_of(module)

    @property
    def weight_bytes(self) -> float:
        return get_dtype(self.weight_dtype).bytes

    @property
    def act_bytes(self) -> float:
        return get_dtype(self.act_dtype).bytes

    @property
    def kv_bytes(self) -> float:
        return get_dtype(self.kv_dtype).bytes
