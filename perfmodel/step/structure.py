"""What a model's layer stack looks like to the cost layer, derived once per model.

``perfmodel.step.ops`` lists an iteration's operators on every step; the grouping of the
layers into kinds (token mixers by kind, KV heads, window and head width; dense MLPs by
width) depends on the model alone, so it is derived here once per (immutable) model and
kept (``lru_cache``: a ``ModelSpec`` hashes by its fields).
"""

from __future__ import annotations

from functools import lru_cache

from perfmodel.model import ModelSpec

_SUFFIX = {"full": "", "sliding": "_swa", "chunked": "_chunked", "linear": "", "proj": ""}


_Key = tuple[str, int, int, int, bool]


def _groups(keys: list[_Key]) -> list[tuple[_Key, int, str]]:
    """Distinct (kind, KV heads, window, head width, k_eq_v) keys in first-seen order
    with their layer count and an op-name suffix: by kind, plus the width where a kind
    has several (DeciLM)."""
    counts: dict[_Key, int] = {}
    for k in keys:
        counts[k] = counts.get(k, 0) + 1
    out = []
    for k, n in counts.items():
        same = [c for c in counts if c[0] == k[0]]
        main = max(same, key=lambda c: counts[c])
        wide = f"_w{k[1]}" + (f"d{k[3]}" if k[3] else "")
        out.append((k, n, _SUFFIX.get(k[0], "") + ("" if k == main else wide)))
    return out


@lru_cache(maxsize=256)
def mixer_groups(model: ModelSpec) -> tuple[tuple[tuple[_Key, int, str], ...], int]:
    """The token-mixer groups of ``model`` (:func:`_groups`) and its layers with a mixer:
    structure only, derived once per model."""
    keys = [
        (ls.mixer, ls.kv_heads, ls.window, ls.head_dim, ls.k_eq_v)
        for ls in model.layer_plan
        if ls.mixer != "none"
    ]
    return tuple(_groups(keys)), len(keys)


@lru_cache(maxsize=256)
def mlp_structure(model: ModelSpec) -> tuple[tuple[tuple[_Key, int, str], ...], int, int]:
    """The dense-MLP width groups of ``model``, its ``proj`` MLPs and its layers with an
    MLP: structure only, derived once per model."""
    layers = model.layer_plan
    dense: list[_Key] = [
        ("dense", ls.intermediate, 0, 0, False)
        for ls in layers
        if ls.mlp in ("dense", "moe") and ls.intermediate
    ]
    n_proj = sum(1 for ls in layers if ls.mlp == "proj")
    n_mlp = sum(1 for ls in layers if ls.mlp != "none")
    return tuple(_groups(dense)), n_proj, n_mlp


@lru_cache(maxsize=256)
def mean_mlp_width(model: ModelSpec) -> float:
    """The mean MLP width over the layers (dense width, or top-k experts + shared)."""
    m = model.moe
    routed = (m.top_k * m.expert_intermediate + m.shared_intermediate) if m else 0
    widths = [ls.intermediate + (routed if ls.mlp == "moe" else 0) for ls in model.layer_plan]
    return sum(widths) / len(widths)
