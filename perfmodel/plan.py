"""How a model is laid out on devices: tensor, pipeline, expert and attention-data
parallelism, numeric formats per module.

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

from hardware.device import Device
from perfmodel.dtypes import ModuleDTypes, get_dtype
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
                layer_specs=model.layer_specs[start:stop],
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


# ---- formats of a run: checkpoint, options, device ----------------------------------
# Which formats a run uses: the checkpoint's, the user's overrides, what the device has.
#
# Order of precedence per field: an explicit option; else the checkpoint's
# ``quantization_config`` (``ModelSpec.quantization``); else bf16. The math format must
# be one the device computes in: when it was not asked for explicitly and the device
# lacks it (FP8 on an A100, bf16 on an FPGA), the nearest native format is used and the
# weights are converted in the kernel (``perfmodel.step.dequant.dequant_op``). ``--dtype``
# of a float format (fp8, nvfp4, mxfp4) sets the math format too where the device has
# it (W8A8 / W4A4, as vLLM's fp8 and NVFP4 schemes); integer weights (int8, int4) are
# weight-only (W8A16 / W4A16, as AWQ/GPTQ) unless ``--act-dtype`` says otherwise. Every
# such choice is reported in ``notes``.

#: float formats whose weights imply the same math format (integer ones are weight-only)
_FLOAT_LOW = ("fp8", "fp4")
#: fallbacks for a math format the device lacks, nearest first
_FALLBACK = ("bf16", "fp16", "fp8", "int8", "fp32")


@dataclass(frozen=True)
class Precision:
    """Formats of one run, and why."""

    weights: ModuleDTypes
    act_dtype: str
    kv_dtype: str
    notes: tuple[str, ...] = ()

    @property
    def weight_dtype(self) -> str:
        """The format of the bulk of the weights (routed experts on an MoE model)."""
        return self.weights.routed_experts

    def to_dict(self) -> dict[str, object]:
        w = self.weights
        return {
            "attention": w.attention,
            "dense_mlp": w.dense_mlp,
            "shared_experts": w.shared_experts,
            "routed_experts": w.routed_experts,
            "embedding": w.embedding or w.attention,
            "act": self.act_dtype,
            "kv": self.kv_dtype,
            "notes": list(self.notes),
        }


def resolve_precision(
    model: ModelSpec,
    device: Device,
    *,
    dtype: str | None = None,
    act_dtype: str | None = None,
    kv_dtype: str | None = None,
    expert_dtype: str | None = None,
    attn_dtype: str | None = None,
) -> Precision:
    """Formats for ``model`` on ``device`` (``None``: the default described above)."""
    notes: list[str] = []
    q = model.quantization
    if dtype is not None:
        w = ModuleDTypes.uniform(dtype)
    elif q is not None:
        w = q.weights
        notes.append(
            f"checkpoint quantization_config ({q.method}): weights {w.describe()} "
            f"(override with --dtype)"
        )
    else:
        w = ModuleDTypes.uniform("bf16")
    if expert_dtype is not None:
        w = replace(w, routed_experts=get_dtype(expert_dtype).name)
    if attn_dtype is not None:
        w = replace(w, attention=get_dtype(attn_dtype).name)
    if act_dtype is not None:
        act = get_dtype(act_dtype).name
        if not device.computes(act):
            raise SpecError(
                f"{device.id} has no {act} math (it computes in: "
                f"{', '.join(device.native_dtypes)}); choose --act-dtype among those"
            )
    else:
        want = q.act_dtype if (q is not None and dtype is None) else "bf16"
        if dtype is not None and get_dtype(dtype).compute_key in _FLOAT_LOW:
            # --dtype fp8 / nvfp4 / mxfp4 means W8A8 / W4A4 where the device has the math
            want = dtype if device.computes(dtype) else "bf16"
            if want != "bf16":
                notes.append(f"--dtype {dtype}: math in {get_dtype(dtype).name} as well")
        act = get_dtype(want).name
        if not device.computes(want):
            prefer = (w.routed_experts, w.attention, *_FALLBACK)
            act = next((d for d in prefer if device.computes(d)), "")
            if not act:
                raise SpecError(f"{device.id} computes in none of {', '.join(_FALLBACK)}")
            notes.append(
                f"{device.id} has no {want} math: computing in {act} "
                f"(its native formats: {', '.join(device.native_dtypes)})"
            )
    converted = sorted(
        {d for d in (w.attention, w.dense_mlp, w.shared_experts, w.routed_experts)}
        - {act}
        - ({d for d in _same_math(act)})
    )
    if converted:
        notes.append(
            f"weights in {', '.join(converted)} are dequantized to {act} in the kernel "
            f"(software conversion costed as weight_dequant)"
        )
    kv = get_dtype(kv_dtype or "bf16").name
    return Precision(w, act, kv, tuple(notes))


def _same_math(act: str) -> set[str]:
    key = get_dtype(act).compute_key
    return {
        d
        for d in ("fp32", "bf16", "fp16", "fp8", "int8", "int4", "fp4", "nvfp4", "mxfp4")
        if get_dtype(d).compute_key == key
    }
