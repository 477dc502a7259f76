"""Per-layer MoE routing batches: how many token rows each expert receives.

A batch of ``T`` tokens with top-``k`` routing gives every token ``k`` *distinct*
experts, so ``sum(counts) = k·T`` and ``counts[i] <= T``. Generators:

* ``uniform``  — every expert equally likely.
* ``zipf``     — popularity ``p_i ∝ rank_i^(−s)`` (power law with exponent ``s``;
  ``s = 0`` is uniform). Ranks are a seeded permutation of the experts, so the hot
  experts are not always the low ids (what a trained router looks like).
* ``hot``      — a hot set: ``hot_fraction`` of the experts share ``hot_mass`` of the
  routing probability, the rest share the remainder.

Each token draws its ``k`` experts without replacement with probability proportional
to ``p`` (the Gumbel-top-k trick: the ``k`` largest of ``log p_i + Gumbel`` are a
Plackett–Luce sample), so very hot experts saturate at one row per token as real
routers do. All randomness comes from an explicit seed or ``numpy.random.Generator``.

Recorded counts are read from CSV: a header ``step,layer,<one column per expert>``
and one row per layer per step, non-negative integers.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from perfmodel.datafile import parse_int, read_csv
from perfmodel.errors import SpecError
from perfmodel.model import ModelSpec
from perfmodel.workload.popularity import zipf_popularity

Distribution = Literal["uniform", "zipf", "hot"]
DISTRIBUTIONS: tuple[str, ...] = ("uniform", "zipf", "hot")
_CHUNK_TOKENS = 8192  # rows of the Gumbel matrix drawn at once (memory bound)


@dataclass(frozen=True)
class RoutingBatch:
    """Token rows per expert for ``layers`` MoE layers (or recorded steps).

    ``counts`` has shape (layers, experts); ``tokens`` is the number of tokens in the
    batch (rows / top_k), ``source`` says where the counts came from.
    """

    counts: NDArray[np.int64]
    top_k: int
    source: str
    steps: NDArray[np.int64] | None = None  # step id of each row (recorded counts)
    layer_ids: NDArray[np.int64] | None = None  # layer id of each row (recorded counts)

    def __post_init__(self) -> None:
        c = np.asarray(self.counts)
        if c.ndim != 2:
            raise SpecError(f"routing counts must be (layers, experts), got shape {c.shape}")
        if np.any(c < 0):
            raise SpecError("routing counts must be >= 0")
        object.__setattr__(self, "counts", c.astype(np.int64))
        if self.top_k < 1:
            raise SpecError(f"top_k must be >= 1, got {self.top_k}")

    @property
    def num_experts(self) -> int:
        return int(self.counts.shape[1])

    @property
    def layers(self) -> int:
        return int(self.counts.shape[0])

    @property
    def tokens(self) -> NDArray[np.float64]:
        """Tokens per row: routed rows / top_k."""
        return self.counts.sum(axis=1) / self.top_k


def _rng(seed: int | np.random.Generator | None) -> np.random.Generator:
    if isinstance(seed, np.random.Generator):
        return seed
    return np.random.default_rng(seed)


def expert_popularity(
    num_experts: int,
    *,
    dist: str = "zipf",
    exponent: float = 1.0,
    hot_fraction: float = 0.1,
    hot_mass: float = 0.5,
    seed: int | np.random.Generator | None = 0,
    permute: bool = True,
) -> NDArray[np.float64]:
    """Routing probability of each expert (sums to 1).

    Zipf: ``p_i = r_i^(−s) / Σ_j r_j^(−s)`` with ``r`` a permutation of ``1..E``.
    Hot set: ``⌈hot_fraction·E⌉`` experts share ``hot_mass``, the others ``1 − hot_mass``.
    """
    if num_experts < 1:
        raise SpecError(f"num_experts must be >= 1, got {num_experts}")
    if dist not in DISTRIBUTIONS:
        raise SpecError(f"unknown routing distribution {dist!r}; valid: {', '.join(DISTRIBUTIONS)}")
    rng = _rng(seed)
    ranks = np.arange(1, num_experts + 1, dtype=np.float64)
    if dist == "uniform":
        p = np.ones(num_experts)
    elif dist == "zipf":
        p = zipf_popularity(num_experts, exponent)
    else:
        if not 0 < hot_fraction < 1:
            raise SpecError(f"hot_fraction must be in (0, 1), got {hot_fraction}")
        if not 0 < hot_mass < 1:
            raise SpecError(f"hot_mass must be in (0, 1), got {hot_mass}")
        n_hot = min(num_experts - 1, max(1, int(np.ceil(hot_fraction * num_experts))))
        p = np.where(ranks <= n_hot, hot_mass / n_hot, (1.0 - hot_mass) / (num_experts - n_hot))
    if permute:
        p = p[rng.permutation(num_experts)]
    return p / p.sum()


def sample_counts(
    popularity: NDArray[np.float64],
    tokens: int,
    top_k: int,
    *,
    layers: int = 1,
    seed: int | np.random.Generator | None = 0,
) -> NDArray[np.int64]:
    """(layers, E) rows per expert: each token picks ``top_k`` distinct experts ∝ ``p``."""
    p = np.asarray(popularity, dtype=np.float64)
    E = len(p)
    if not 1 <= top_k <= E:
        raise SpecError(f"top_k must be in [1, {E}] (the expert count), got {top_k}")
    if tokens < 0 or layers < 1:
        raise SpecError(f"need tokens >= 0 and layers >= 1, got {tokens} and {layers}")
    if np.any(p < 0) or not np.isclose(p.sum(), 1.0):
        raise SpecError("expert popularity must be non-negative and sum to 1")
    rng = _rng(seed)
    logp = np.log(np.maximum(p, 1e-300))
    out = np.zeros((layers, E), dtype=np.int64)
    for layer in range(layers):
        left = tokens
        while left > 0:
            n = min(left, _CHUNK_TOKENS)
            keys = logp + rng.gumbel(size=(n, E))
            top = np.argpartition(-keys, top_k - 1, axis=1)[:, :top_k]
            out[layer] += np.bincount(top.ravel(), minlength=E)
            left -= n
    return out


def generate_batch(
    num_experts: int,
    top_k: int,
    tokens: int,
    *,
    dist: str = "zipf",
    skew: float = 1.0,
    hot_fraction: float = 0.1,
    hot_mass: float = 0.5,
    layers: int = 1,
    seed: int | np.random.Generator | None = 0,
) -> RoutingBatch:
    """A seeded synthetic batch (``skew`` is the Zipf exponent for ``dist='zipf'``)."""
    rng = _rng(seed)
    p = expert_popularity(
        num_experts,
        dist=dist,
        exponent=skew,
        hot_fraction=hot_fraction,
        hot_mass=hot_mass,
        seed=rng,
    )
    counts = sample_counts(p, tokens, top_k, layers=layers, seed=rng)
    desc = {"zipf": f"zipf(s={skew:g})", "hot": f"hot({hot_fraction:g},{hot_mass:g})"}
    return RoutingBatch(counts, top_k, f"{desc.get(dist, dist)}, {tokens} tokens, top-{top_k}")


def batch_for_model(
    model: ModelSpec,
    tokens: int,
    *,
    dist: str = "zipf",
    skew: float = 1.0,
    layers: int = 1,
    seed: int | np.random.Generator | None = 0,
    **kw: float,
) -> RoutingBatch:
    """A synthetic batch with the model's routed-expert count and top-k."""
    if model.moe is None:
        raise SpecError(f"{model.id} is not a mixture-of-experts model; pick an MoE model")
    return generate_batch(
        model.moe.num_experts,
        model.moe.top_k,
        tokens,
        dist=dist,
        skew=skew,
        layers=layers,
        seed=seed,
        **kw,
    )


#: Largest token count (or step/layer id) a counts CSV cell may hold.
MAX_COUNT = 1_000_000_000_000


def load_counts_csv(
    path: str | Path, *, num_experts: int | None = None, top_k: int = 1
) -> RoutingBatch:
    """Recorded counts: header ``step,layer,e0,...``; one row per layer per step.

    ``num_experts`` (the model's) is checked against the number of expert columns.
    """
    p = Path(path)
    tab = read_csv(p, what="counts CSV", lower=True, min_rows=0)
    header = list(tab.header)
    if header[:2] != ["step", "layer"] or len(header) < 3:
        raise SpecError(
            f"{p}: header must start with 'step,layer' followed by one column per expert"
        )
    E = len(header) - 2
    if num_experts is not None and num_experts != E:
        raise SpecError(
            f"{p}: {E} expert columns but the model has {num_experts} routed experts; "
            "write one column per expert"
        )
    data = [
        [
            parse_int(v, where=tab.where(n), name=header[j], max_value=MAX_COUNT)
            for j, v in enumerate(row)
        ]
        for n, row in tab
    ]
    if not data:
        raise SpecError(f"{p}: no count rows after the header")
    arr = np.asarray(data, dtype=np.int64)
    return RoutingBatch(arr[:, 2:], top_k, f"{p.name}", steps=arr[:, 0], layer_ids=arr[:, 1])


def counts_csv_text(batch: RoutingBatch, *, step: int = 0) -> str:
    """The CSV form read by :func:`load_counts_csv` (one row per layer)."""
    steps = batch.steps if batch.steps is not None else np.full(batch.layers, step)
    layer_ids = batch.layer_ids if batch.layer_ids is not None else np.arange(batch.layers)
    head = ["step", "layer", *(f"e{i}" for i in range(batch.num_experts))]
    lines = [",".join(head)]
    for s, layer, row in zip(steps, layer_ids, batch.counts, strict=True):
        lines.append(",".join(map(str, [int(s), int(layer), *row.tolist()])))
    return "\n".join(lines) + "\n"
