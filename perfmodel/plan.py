"""How a model is laid out on devices: tensor and pipeline parallelism, numeric formats.

Pipeline stages: which layers each of ``pp`` stages holds, as model slices.

A stage holds a contiguous slice of the decoder layers; the embedding lookup runs on
the first stage and the final norm and LM head on the last. The split follows vLLM
(``vllm.distributed.utils.get_pp_indices``): ``layers // pp`` each, and the remaining
layers one each to the stages counted back from the second-to-last (the last stage
already carries the LM head). 61 layers: PP2 -> (31, 30), PP4 -> (15, 15, 16, 15).

A stage is costed as a :class:`perfmodel.model.ModelSpec` of its own layers
(:func:`stage_model`), so every per-layer formula of ``perfmodel.ops`` and the
parameter count of ``perfmodel.model`` apply to it unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache

from perfmodel.dtypes import get_dtype
from perfmodel.errors import SpecError
from perfmodel.model import ModelSpec


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

def check_pp(model: ModelSpec, pp: int) -> None:
    """Raise SpecError unless ``pp`` is a positive integer of at most ``model.layers``."""
    if not (isinstance(pp, int) and not isinstance(pp, bool) and pp >= 1):
        raise SpecError(f"pp must be a positive integer, got {pp!r}")
    if pp > model.layers:
        raise SpecError(
            f"pp={pp} exceeds the {model.layers} layers of {model.id}: every pipeline stage "
            f"needs at least one layer (use pp <= {model.layers})"
        )


def stage_layer_counts(layers: int, pp: int) -> tuple[int, ...]:
    """Layers per stage: ``layers // pp`` each, the remainder from the second-to-last back."""
    if not (isinstance(layers, int) and layers >= 1 and isinstance(pp, int) and 1 <= pp <= layers):
        raise SpecError(f"cannot split {layers!r} layers into {pp!r} pipeline stages")
    counts = [layers // pp] * pp
    for i in range(2, layers % pp + 2):
        counts[-i] += 1
    return tuple(counts)


@lru_cache(maxsize=256)
def stage_models(model: ModelSpec, pp: int) -> tuple[ModelSpec, ...]:
    """The ``pp`` stages as models of their own layers (MoE layer indices re-based)."""
    check_pp(model, pp)
    if pp == 1:
        return (model,)
    out = []
    start = 0
    for n in stage_layer_counts(model.layers, pp):
        stop = start + n
        moe = model.moe
        if moe is not None:
            moe = replace(
                moe, moe_layers=tuple(i - start for i in moe.moe_layers if start <= i < stop)
            )
        out.append(
            replace(
                model,
                id=f"{model.id}[{start}:{stop}]",
                layers=n,
                moe=moe,
                published_params=None,
                published_active_params=None,
            )
        )
        start = stop
    return tuple(out)


@lru_cache(maxsize=256)
def stage_params(model: ModelSpec, pp: int) -> tuple[int, ...]:
    """Parameters each stage holds.

    Decoder layers of the slice; the first stage adds the input embedding (and learned
    position table), the last the final norm and the LM head. With tied embeddings the
    last stage keeps its own copy of the embedding as the head when ``pp > 1`` (vLLM
    builds ``embed_tokens`` on the last rank too), so the total exceeds ``model.params``
    by ``vocab·hidden`` there; with ``pp = 1`` the sum is ``model.params``.
    """
    stages = stage_models(model, pp)
    vh = model.vocab * model.hidden
    out = []
    for s, sub in enumerate(stages):
        p = sub.params - sub.embedding_params() - sub.hidden  # its decoder layers only
        if s == 0:
            p += vh + model.learned_pos_embeddings * model.hidden
        if s == pp - 1:
            p += model.hidden + (vh if (pp > 1 or not model.tied_embeddings) else 0)
        out.append(p)
    return tuple(out)
