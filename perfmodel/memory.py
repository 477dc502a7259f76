"""Device memory: weights per device, KV-cache capacity, largest batch, and fit.

Capacity accounting (bytes are GiB-like counts from the device file):

    usable = hbm_bytes · gpu_memory_utilization           (vLLM default 0.90)
    kv     = usable − weights/device − activation reserve

The activation reserve is the peak activation footprint of one forward pass of
``max_batched_tokens`` tokens: ``tokens · (4·hidden + 2·mlp_width/tp + vocab/tp) ·
act_bytes`` (residual stream, Q/K/V, MLP intermediate, logits).

With pipeline parallelism (``plan.pp > 1``) every stage is accounted on its own
devices: its weights (its layers, plus the embedding on the first stage and the head
on the last, ``perfmodel.pipeline.stage_params``), its reserve (logits only on the
last stage) and the KV of its layers. Every stage caches every request's KV for its
layers, so the instance holds ``min_s`` of the stages' token capacities (vLLM sizes
the cache by the smallest worker); a :class:`MemoryFit` reports the binding stage.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from hardware.device import Device
from hardware.engine import Engine
from perfmodel.dtypes import get_dtype
from perfmodel.errors import SpecError
from perfmodel.model import LayerSpec, ModelSpec
from perfmodel.plan import ParallelPlan, stage_models, stage_params
from perfmodel.units import GiB

DEFAULT_GPU_MEMORY_UTILIZATION = 0.90
DEFAULT_MAX_BATCHED_TOKENS = 8192
TP_CANDIDATES = (1, 2, 4, 8, 16, 32, 64)
PP_SEARCH_MAX = 16  # largest pipeline depth a shortfall message suggests


def kv_elems_per_token_per_layer_per_device(model: ModelSpec, tp: int) -> float:
    """KV elements one device caches per token per layer under tensor parallelism."""
    return model.kv_elems_per_token_per_layer() / model.kv_shards(tp)


def layer_kv_elems_per_device(model: ModelSpec, layer: LayerSpec, tp: int) -> float:
    """KV elements one device caches per token of ``layer``: GQA heads split over TP
    (replicated past ``kv_heads``), the MLA latent replicated."""
    shards = 1 if model.mla or not layer.kv_heads else min(tp, layer.kv_heads)
    return model.layer_kv_elems(layer) / shards


def _layer_weight_bytes(sub: ModelSpec, plan: ParallelPlan) -> float:
    """Decoder-layer weights one device holds: each module in its format, routed
    experts split over ``tp·dp`` devices (EP × expert TP), the rest over ``tp``."""
    g = sub.param_groups()
    g["other"] -= sub.hidden  # the final norm goes with the head
    out = 0.0
    for k, n in g.items():
        if k == "embedding":
            continue
        shard = plan.tp * plan.dp if k == "routed_experts" else plan.tp
        out += n * plan.weight_bytes_of(k) / shard
    return out


@lru_cache(maxsize=512)
def stage_weight_bytes(model: ModelSpec, plan: ParallelPlan) -> tuple[float, ...]:
    """Weights one device of each pipeline stage holds (formats per module); a pure
    function of the (immutable) model and plan, kept like :func:`stage_kv_layouts`."""
    subs = stage_models(model, plan.pp) if plan.pp > 1 else (model,)
    counts = stage_params(model, plan.pp)
    out = []
    for sub, n in zip(subs, counts, strict=True):
        layers = sub.params - sub.embedding_params() - sub.hidden
        head = (n - layers) * plan.weight_bytes_of("embedding") / plan.tp
        out.append(_layer_weight_bytes(sub, plan) + head)
    return tuple(out)


def weight_bytes_per_device(model: ModelSpec, plan: ParallelPlan) -> float:
    """Weights one device holds: sharded ``tp`` ways (routed experts ``tp·dp``; norms
    are negligible). With ``pp > 1``: the heaviest stage's."""
    return max(stage_weight_bytes(model, plan))


@dataclass(frozen=True)
class KVLayout:
    """What one device caches for a sequence, by how it grows (one pipeline stage).

    ``per_token_bytes`` grows with every token (full attention); each ``bounded`` entry
    ``(bytes_per_token, window)`` stops at ``window`` tokens (sliding / chunked layers);
    ``state_bytes`` is the fixed recurrent state (linear-attention layers).
    """

    per_token_bytes: float
    bounded: tuple[tuple[float, int], ...] = ()
    state_bytes: float = 0.0

    def sequence_bytes(self, context_len: float) -> float:
        """Cache of one sequence of ``context_len`` tokens."""
        fixed = sum(b * min(context_len, w) for b, w in self.bounded)
        return self.per_token_bytes * context_len + fixed + self.state_bytes

    def effective_per_token_bytes(self, context_len: float) -> float:
        """Bytes per cached token for sequences of ``context_len`` tokens."""
        return self.sequence_bytes(context_len) / context_len


#: when no context length is given, windows and states are amortized over this many
REFERENCE_CONTEXT_TOKENS = 8192


def kv_layout(model: ModelSpec, plan: ParallelPlan) -> KVLayout:
    """The per-device cache layout of ``model`` (one stage's sub-model) under ``plan``."""
    grow = 0.0
    bounded: dict[int, float] = {}
    la = model.linear_attn
    state = 0.0
    for ls in model.layer_plan:
        e = layer_kv_elems_per_device(model, ls, plan.tp) * plan.kv_bytes
        if ls.bounded:
            bounded[ls.window] = bounded.get(ls.window, 0.0) + e
        else:
            grow += e
        if ls.mixer == "linear" and la is not None:
            state += la.state_bytes(plan.kv_bytes) / la.shards(plan.tp)
    return KVLayout(grow, tuple((b, w) for w, b in sorted(bounded.items())), state)


@lru_cache(maxsize=512)
def stage_kv_layouts(model: ModelSpec, plan: ParallelPlan) -> tuple[KVLayout, ...]:
    """One ``KVLayout`` per pipeline stage (its layers only); a pure function of the
    (immutable) model and plan, kept for the searches that ask again and again."""
    if plan.pp == 1:
        return (kv_layout(model, plan),)
    return tuple(kv_layout(sub, plan) for sub in stage_models(model, plan.pp))


def stage_kv_bytes_per_token(
    model: ModelSpec, plan: ParallelPlan, context_len: float = REFERENCE_CONTEXT_TOKENS
) -> tuple[float, ...]:
    """KV bytes one device of each pipeline stage stores per token (its layers only),
    windowed layers and recurrent state amortized over ``context_len``-token sequences."""
    return tuple(
        lay.effective_per_token_bytes(context_len) for lay in stage_kv_layouts(model, plan)
    )


def kv_bytes_per_token_per_device(model: ModelSpec, plan: ParallelPlan) -> float:
    """KV bytes one device stores per token (GQA heads sharded, MLA latent replicated).

    With ``pp > 1``: that of the stage with the most. Models with windowed or recurrent
    layers: amortized over ``REFERENCE_CONTEXT_TOKENS``-token sequences.
    """
    return max(stage_kv_bytes_per_token(model, plan))


def activation_reserve_bytes(
    model: ModelSpec,
    plan: ParallelPlan,
    max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS,
    *,
    logits: bool = True,
) -> float:
    """Peak activations of one forward pass; ``logits=False`` for a stage without the head.

    Activations are held in at least 16 bits: with 8-bit GEMM inputs (FP8/INT8 math) only
    the GEMM operands are quantized; the residual stream, the MLP intermediate between its
    GEMMs and the logits stay in the 16-bit model format."""
    width = model.intermediate
    if model.moe:
        width = max(width, model.moe.top_k * model.moe.expert_intermediate)
    per_token = 4 * model.hidden + 2 * width / plan.tp + (model.vocab / plan.tp if logits else 0)
    return max_batched_tokens * per_token * max(plan.act_bytes, get_dtype("fp16").bytes)


@dataclass(frozen=True)
class MemoryFit:
    """How a model fits on ``tp·pp`` devices: all bytes per device.

    With ``pp > 1`` the per-device fields are those of the binding stage ``stage``: the
    one short of memory by most when it does not fit, else the one with the fewest KV
    tokens. ``kv_capacity_tokens`` is the instance's: the smallest over the stages.
    """

    fits: bool
    capacity_bytes: float
    usable_bytes: float
    weight_bytes: float
    reserve_bytes: float
    kv_budget_bytes: float  # may be negative: the shortfall
    kv_bytes_per_token: float
    kv_capacity_tokens: int  # the instance's: every attention-DP replica's cache together
    needed_bytes: float  # weights + reserve + KV of the requested batch
    shortfall_bytes: float  # > 0 when it does not fit
    min_tp: int | None  # smallest TP (same device, dtypes and PP) that fits; None if none
    pp: int = 1
    stage: int = 0  # the binding pipeline stage
    min_pp: int | None = None  # when it does not fit: smallest PP at this TP that fits

    def max_batch(self, context_len: int) -> int:
        """Largest number of concurrent requests that each hold ``context_len`` tokens."""
        if context_len <= 0:
            raise SpecError("context length must be positive")
        return max(0, self.kv_capacity_tokens // context_len)


def memory_fit(
    model: ModelSpec,
    device: Device,
    plan: ParallelPlan,
    *,
    batch: int = 1,
    context_len: int = 1,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS,
    search_tp: bool = True,
    engine: Engine | None = None,
) -> MemoryFit:
    """Whether ``batch`` requests of ``context_len`` tokens fit, and the KV capacity.

    When it does not fit and ``search_tp``: the smallest TP (same PP) and the smallest
    PP up to ``PP_SEARCH_MAX`` (same TP) that would.

    With an ``engine`` its KV budget replaces ``gpu_memory_utilization`` and
    ``max_batched_tokens``: ``basis = "total"`` is the formula above with its fraction;
    ``basis = "free"`` (TensorRT-LLM) gives the KV ``fraction · (hbm − weights −
    reserve)``; the capacity is whole blocks of ``engine.kv_block_tokens``.
    """
    free_basis = False
    block = 1
    if engine is not None:
        max_batched_tokens = engine.max_num_batched_tokens
        gpu_memory_utilization = engine.kv_memory_fraction
        free_basis = engine.kv_memory_basis == "free"
        block = engine.kv_block_tokens
    if not 0 < gpu_memory_utilization <= 1:
        raise SpecError("gpu_memory_utilization must be in (0, 1]")
    model.check_tp(plan.tp)
    usable = device.hbm_bytes * (1.0 if free_basis else gpu_memory_utilization)
    pp = plan.pp
    weights: tuple[float, ...] = (
        (weight_bytes_per_device(model, plan),) if pp == 1 else stage_weight_bytes(model, plan)
    )
    ref = context_len if context_len > 1 else REFERENCE_CONTEXT_TOKENS
    layouts = stage_kv_layouts(model, plan)
    stages = []
    for s, (w, lay) in enumerate(zip(weights, layouts, strict=True)):
        kv_tok = lay.effective_per_token_bytes(ref)
        reserve = activation_reserve_bytes(model, plan, max_batched_tokens, logits=s == pp - 1)
        budget = usable - w - reserve
        if free_basis:
            budget = gpu_memory_utilization * budget if budget > 0 else budget
        cap = int(budget // kv_tok) // block * block if budget > 0 and kv_tok > 0 else 0
        # attention DP: each replica's devices hold the KV of their 1/dp of the requests
        needed = w + reserve + -(-batch // plan.dp) * lay.sequence_bytes(context_len)
        stages.append((w, reserve, kv_tok, budget, cap, needed, max(0.0, needed - usable)))
    short = max(st[6] for st in stages)
    if short > 0:
        k = max(range(pp), key=lambda s: stages[s][6])
    else:
        k = min(range(pp), key=lambda s: (stages[s][4], -stages[s][5]))
    w, reserve, kv_tok, budget, _, needed, _ = stages[k]
    min_tp: int | None = plan.tp if short == 0 else None
    min_pp: int | None = None

    def fits_with(t: int, p: int) -> bool:
        return memory_fit(
            model,
            device,
            replace(plan, tp=t, pp=p, ep=1 if (t * plan.dp) % plan.ep else plan.ep),
            batch=batch,
            context_len=context_len,
            gpu_memory_utilization=gpu_memory_utilization,
            max_batched_tokens=max_batched_tokens,
            search_tp=False,
            engine=engine,
        ).fits

    if short > 0 and search_tp:
        for t in TP_CANDIDATES:
            if t <= plan.tp:
                continue
            try:
                model.check_tp(t)
            except SpecError:
                continue
            if fits_with(t, pp):
                min_tp = t
                break
        for p in range(pp + 1, min(PP_SEARCH_MAX, model.layers) + 1):
            if fits_with(plan.tp, p):
                min_pp = p
                break
    return MemoryFit(
        fits=short == 0,
        capacity_bytes=device.hbm_bytes,
        usable_bytes=usable,
        weight_bytes=w,
        reserve_bytes=reserve,
        kv_budget_bytes=budget,
        kv_bytes_per_token=kv_tok,
        kv_capacity_tokens=min(st[4] for st in stages) * plan.dp,
        needed_bytes=needed,
        shortfall_bytes=short,
        min_tp=min_tp,
        pp=pp,
        stage=k,
        min_pp=min_pp,
    )


def describe_shortfall(fit: MemoryFit, model: ModelSpec, device: Device, tp: int) -> str:
    """One sentence: by how much it does not fit, and what would."""
    where = (
        f"{tp}x {device.id}" if fit.pp == 1 else f"{tp * fit.pp}x {device.id} (TP{tp} x PP{fit.pp})"
    )
    msg = (
        f"{model.id} does not fit on {where}: needs {fit.needed_bytes / GiB:.1f} GiB "
        f"per device{f' on pipeline stage {fit.stage}' if fit.pp > 1 else ''}, "
        f"{fit.usable_bytes / GiB:.1f} GiB usable (short by {fit.shortfall_bytes / GiB:.1f} GiB)"
    )
    if fit.min_tp:
        msg += f"; the smallest TP that fits is {fit.min_tp}"
        if fit.min_pp:
            msg += (
                f", or keep TP{tp} with pipeline parallelism PP{fit.min_pp} "
                f"({tp * fit.min_pp} devices)"
            )
    elif fit.min_pp:
        msg += (
            f"; no TP up to 64 fits, but TP{tp} with pipeline parallelism PP{fit.min_pp} "
            f"({tp * fit.min_pp} devices) does"
        )
    else:
        msg += "; no TP up to 64 fits -- use a lower-precision weight dtype or a larger device"
    return msg
