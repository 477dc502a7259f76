"""The MoE expert block on one device as a max-affine profile, and its regime crossover.

One grouped-GEMM expert FFN (gate/up + down, ``mats`` matrices of ``hidden x inter``)
on a device, with ``G`` activated experts and ``N`` token rows in total:

    memory piece:  t = a + b·G,  b = mats·hidden·inter·w_bytes / (eff_m·BW)
    compute piece: t = c + β·N,  β = 2·mats·hidden·inter / (eff_c·peak)

``N`` is either the raw row count or the tile-padded one (each expert's rows rounded up
to 128, ``Σ_i 128·⌈n_i/128⌉``; DeepGEMM contiguous layout, formal_models.md §5.1). The
crossover in tokens per activated expert is ``n* = b/β`` (for many experts; with ``G``
experts the intercepts move it to ``(b + (a − c)/G)/β``); from the roofline it is
``ridge · (eff_c/eff_m) · w_bytes / 2`` for any expert shape.

Three sources: derived from the roofline (:func:`derived_expert_profile`), fitted to
GEMM measurements of the expert's two GEMMs (:func:`gemm_block_rows`; ``G`` experts'
gate/up GEMMs stacked along n and down GEMMs along k do the same FLOPs and stream the
same weights as ``G`` experts with the same tokens each), and the fused MoE-layer
measurements (:func:`moe_rank_loads`, which rebuilds each row's per-expert loads).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from hardware.device import Device
from hardware.maxaffine import GEMM_TILE_ROWS, MaxAffine, Provenance
from hardware.roofline import Roofline, gemm_flops, padded_rows
from perfmodel.dtypes import get_dtype
from perfmodel.errors import SpecError
from perfmodel.model import ModelSpec

Arr = NDArray[np.float64]

#: Free parameters of ``max(a + b·G, c + β·N)`` over features (G, N): (intercept, G, N).
EXPERT_MASK = np.array([[True, True, False], [True, False, True]])
EXPERT_FEATURES = ("G", "N")


def expert_shape(model: ModelSpec, tp: int = 1) -> tuple[int, int, int]:
    """(hidden, intermediate per device, matrices) of one routed expert."""
    if model.moe is None:
        raise SpecError(f"{model.id} is not a mixture-of-experts model")
    mats = 3 if model.gated_mlp else 2
    return model.hidden, model.moe.expert_intermediate // tp, mats


def expert_weight_elems(hidden: int, inter: float, mats: int) -> float:
    """Weight elements of one routed expert: ``mats`` matrices of ``hidden × inter``."""
    return float(mats * hidden * inter)


def derived_expert_profile(
    device: Device,
    hidden: int,
    inter: int,
    *,
    mats: int = 3,
    weight_dtype: str = "bf16",
    act_dtype: str = "bf16",
    roofline: Roofline | None = None,
) -> MaxAffine:
    """Roofline-implied ``t = max(a + b·G, c + β·N)`` for one device's expert block."""
    prof = roofline or Roofline(device)
    w = get_dtype(weight_dtype).bytes
    elems = expert_weight_elems(hidden, inter, mats)
    expert_bytes = elems * w
    flops_per_token = float(gemm_flops(1.0, elems, 1.0))
    # slopes: the roofline's own memory time of one expert's weights and compute time of
    # one token through one expert
    per_g = prof.times(0.0, expert_bytes, dtype=act_dtype)
    per_n = prof.times(flops_per_token, 0.0, dtype=act_dtype)
    b, beta = float(per_g.memory_s), float(per_n.compute_s)
    ov = prof.overhead_s
    return MaxAffine(
        features=EXPERT_FEATURES,
        intercepts_s=np.array([ov, ov]),
        slopes=np.array([[b, 0.0], [0.0, beta]]),
        provenance=Provenance(
            device.id, f"moe_expert_{hidden}x{inter}x{mats}", dtype=act_dtype, source="derived"
        ),
        piece_names=("weights", "tokens"),
    )


def crossover_tokens(profile: MaxAffine, *, G: float | None = None) -> float:
    """n*: tokens per activated expert where the G piece and the N piece are equal.

    For ``max(a + b·G, c + β·N)`` at ``N = n·G``: ``a + b·G = c + β·n·G`` gives
    ``n* = (b + (a − c)/G)/β``. Without ``G`` the intercepts' share (which vanishes for
    many experts) is dropped: ``n* = b/β``, the per-expert balance point.
    """
    i_g = profile.features.index("G")
    i_n = profile.features.index("N")
    pg = int(np.argmax(profile.slopes[:, i_g]))
    pn = int(np.argmax(profile.slopes[:, i_n]))
    b = profile.slopes[pg, i_g]
    beta = profile.slopes[pn, i_n]
    if beta <= 0:
        return float("inf")
    if G is None:
        return float(b / beta)
    a, c = profile.intercepts_s[pg], profile.intercepts_s[pn]
    return float((b + (a - c) / G) / beta)


def grouped_padded_rows(tokens_per_expert: Arr, tile: int = GEMM_TILE_ROWS) -> Arr:
    """``Σ_i tile·⌈n_i/tile⌉`` over the last axis (empty experts cost no tile).

    Grouped GEMM aligns every expert's segment to whole ``tile``-row tiles (DeepGEMM
    contiguous layout, 128); :func:`hardware.roofline.padded_rows` with a fixed tile.
    """
    rows = padded_rows(tokens_per_expert, max_tile=tile, min_tile=tile)
    return np.asarray(np.sum(rows, axis=-1), dtype=np.float64)


# --- rebuilding per-expert loads of a fused-MoE measurement -----------------------------


def moe_rank_loads(
    tokens: int,
    experts: int,
    topk: int,
    ep: int,
    distribution: str,
    *,
    rng: np.random.Generator,
    draws: int = 16,
) -> Arr:
    """Tokens routed to each expert of EP rank 0, shape (draws, experts/ep).

    Mirrors the routing generator of the measurements (aiconfigurator collector,
    ``balanced_logits`` / ``power_law_logits_v3``): *balanced* assigns token t's j-th
    choice to expert ``(t + j·s) mod E`` with stride ``s = ⌈E/k⌉`` (scaled by ``s/T`` when
    ``T < s``); *power_law_α* draws per-expert loads from a power law on ``[1, 0.8·T]``
    (``[0.01, 2]`` when ``T·k ≤ E``), rounds them to ``T·k`` in total and puts the busiest
    rank's experts on rank 0. Loads are capped at T (a token picks an expert once).
    """
    E, T, k = experts, tokens, topk
    if ep < 1 or E % ep:
        raise SpecError(f"experts ({E}) must be a multiple of the EP size ({ep})")
    loc = E // ep
    if distribution == "balanced":
        s = -(-E // k)
        t = np.arange(T)[:, None].astype(np.float64)
        j = np.arange(k)[None, :]
        ids = (t + j * s) % E if s <= T else np.floor(t * s / T + j * s) % E
        srt = np.sort(ids.astype(np.int64), axis=1)
        first = np.ones_like(srt, dtype=bool)
        first[:, 1:] = srt[:, 1:] != srt[:, :-1]  # a token counts once per expert
        counts = np.bincount(srt[first], minlength=E).astype(np.float64)
        return np.repeat(counts[None, :loc], draws, axis=0)
    if not distribution.startswith("power_law_"):
        raise SpecError(f"unknown routing distribution {distribution!r}")
    alpha = float(distribution.removeprefix("power_law_"))
    lo, hi = (1.0, T * 0.8) if T * k > E else (0.01, 2.0)
    out = np.empty((draws, loc))
    for d in range(draws):
        u = rng.random(E)
        x = ((hi ** (1 - alpha) - lo ** (1 - alpha)) * u + lo ** (1 - alpha)) ** (1 / (1 - alpha))
        c = np.round(x / x.sum() * T * k)
        delta = int(T * k - c.sum())
        order = np.argsort(-c)
        for i in range(abs(delta)):
            c[order[i % E] if delta > 0 else order[-(i % E) - 1]] += np.sign(delta)
        c = np.minimum(np.maximum(c, 0.0), T)
        groups = c.reshape(ep, loc)
        out[d] = groups[np.argmax(groups.sum(axis=1))]
    return out


@dataclass(frozen=True)
class RankLoad:
    """Mean activated experts ``G``, rows ``N`` and padded rows on EP rank 0."""

    G: float
    N: float
    N_padded: float


def rank_load(
    tokens: int, experts: int, topk: int, ep: int, distribution: str, *, seed: int = 0
) -> RankLoad:
    """Expected (G, N, padded N) of rank 0 for one measurement configuration."""
    loads = moe_rank_loads(tokens, experts, topk, ep, distribution, rng=np.random.default_rng(seed))
    return RankLoad(
        G=float(np.mean(np.sum(loads > 0, axis=1))),
        N=float(np.mean(np.sum(loads, axis=1))),
        N_padded=float(np.mean(grouped_padded_rows(loads))),
    )


# --- expert-block rows from GEMM measurements -------------------------------------------


def gemm_block_rows(
    m: Arr,
    n: Arr,
    k: Arr,
    t_s: Arr,
    *,
    hidden: int,
    inter: int,
    mats: int = 3,
    experts: tuple[int, ...] = (1, 2, 4),
    padded: bool = True,
) -> tuple[Arr, Arr, Arr, Arr]:
    """Expert-block times built from GEMM rows: features (G, N), tokens per expert, time.

    For ``G`` experts with ``n`` tokens each, gate/up is the GEMM ``(n, (mats−1)·inter·G,
    hidden)`` and down is ``(n, hidden, inter·G)``; the block time is their sum at every
    ``n`` measured for both. ``N = G·n`` (``G·128·⌈n/128⌉`` when ``padded``).
    """
    lut = {
        (float(a), float(b), float(c)): float(t) for a, b, c, t in zip(m, n, k, t_s, strict=True)
    }
    G_, N_, per_, t_ = [], [], [], []
    up_n = (mats - 1) * inter
    for G in experts:
        for tok in sorted({float(a) for a in m}):
            t1 = lut.get((tok, float(up_n * G), float(hidden)))
            t2 = lut.get((tok, float(hidden), float(inter * G)))
            if t1 is None or t2 is None:
                continue
            rows = float(grouped_padded_rows(np.array([tok]))) if padded else tok
            G_.append(float(G))
            N_.append(G * rows)
            per_.append(tok)
            t_.append(t1 + t2)
    if len(t_) < 6:
        raise SpecError(
            f"the GEMM data lack the expert shape hidden={hidden}, inter={inter} "
            f"(need GEMMs ({up_n}·G x {hidden}) and ({hidden} x {inter}·G) for G in {experts})"
        )
    return np.array(G_), np.array(N_), np.array(per_), np.array(t_)


def fit_expert_block(
    G: Arr, N: Arr, t_s: Arr, *, seed: int = 0, provenance: Provenance | None = None
) -> MaxAffine:
    """Fit ``max(a + b·G, c + β·N)`` (non-negative) to expert-block times."""
    from hardware.fit import fit_max_affine

    X = np.stack([np.asarray(G, float), np.asarray(N, float)], axis=-1)
    return fit_max_affine(
        X, t_s, pieces=2, features=EXPERT_FEATURES, mask=EXPERT_MASK, seed=seed, restarts=4,
        piece_names=("weights", "tokens"), provenance=provenance,
    )  # fmt: skip


def expert_block_provenance(
    G: Arr,
    N: Arr,
    tokens_per_expert: Arr,
    t_s: Arr,
    *,
    device: str,
    op: str,
    source: str,
    seed: int = 0,
    padded: bool = True,
    dtype: str = "bf16",
) -> Provenance:
    """Provenance of an expert-block fit with its train and held-out MdAPE (percent).

    Train error: the fit on all rows. Held-out error: a fit on 75 % of the token counts
    (whole values of tokens-per-expert held out, :func:`hardware.fit.group_folds`)
    evaluated on the other 25 %.
    """
    from hardware.fit import group_folds, mdape_pct

    Ga, Na, ta = (np.asarray(v, dtype=np.float64) for v in (G, N, t_s))
    full = fit_expert_block(Ga, Na, ta, seed=seed)
    test = group_folds(np.asarray(tokens_per_expert), 4, seed=seed) == 0
    part = fit_expert_block(Ga[~test], Na[~test], ta[~test], seed=seed)
    X = np.stack([Ga, Na], axis=-1)
    return Provenance(
        device=device,
        op=op,
        dtype=dtype,
        source=source,
        rows=len(ta),
        train_mape=mdape_pct(full(X), ta),
        heldout_mape=mdape_pct(part(X[test]), ta[test]),
        notes=(
            f"max(a + b*G, c + beta*N), N {'padded to 128-row tiles' if padded else 'raw'}; "
            "held-out: 25% of tokens-per-expert values; MdAPE in percent"
        ),
    )


@dataclass(frozen=True)
class Crossover:
    """n* with a bootstrap percentile interval (tokens per activated expert)."""

    n_star: float
    lo: float
    hi: float
    boots: int
    profile: MaxAffine


def crossover_interval(
    G: Arr,
    N: Arr,
    t_s: Arr,
    *,
    boots: int = 200,
    level: float = 0.95,
    seed: int = 0,
    provenance: Provenance | None = None,
    progress: Callable[[int], None] | None = None,
) -> Crossover:
    """n* = b/β of the fitted block, with a (case-resampling) bootstrap interval.

    ``progress(1)`` is called after each bootstrap resample.
    """
    prof = fit_expert_block(G, N, t_s, seed=seed, provenance=provenance)
    rng = np.random.default_rng(seed)
    n = len(t_s)
    stars = []
    for i in range(boots):
        idx = rng.integers(0, n, size=n)
        if progress is not None:
            progress(1)
        if len(np.unique(np.asarray(G)[idx])) < 2:
            continue
        p = fit_expert_block(np.asarray(G)[idx], np.asarray(N)[idx], np.asarray(t_s)[idx], seed=i)
        stars.append(crossover_tokens(p))
    q = (1.0 - level) / 2.0
    lo, hi = np.quantile(stars, [q, 1.0 - q]) if stars else (np.nan, np.nan)
    return Crossover(crossover_tokens(prof), float(lo), float(hi), len(stars), prof)


#: Features of the fused MoE layer on one GPU (:func:`moe_layer_features`).
MOE_LAYER_FEATURES = ("weight_elems", "flop", "flop_padded", "act_elems")


def moe_layer_features(
    tokens: Arr,
    hidden: Arr,
    inter: Arr,
    topk: Arr,
    experts: Arr,
    tp: Arr,
    ep: Arr,
    distribution: NDArray[np.str_],
    *,
    mats: Arr,
    seed: int = 0,
) -> Arr:
    """Per-GPU features of fused-MoE measurements, one row per configuration.

    With rank 0's expected loads (:func:`rank_load`), ``I = inter/tp`` and
    ``e = mats·hidden·I`` weight elements per expert: ``weight_elems = G·e`` (streamed),
    ``flop = 2·e·N``, ``flop_padded = 2·e·N_pad`` (128-row tiles per expert) and
    ``act_elems = (N + tokens)·hidden`` (gather, scatter and the top-k reduction).
    """
    cache: dict[tuple[int, int, int, int, str], RankLoad] = {}
    out = np.empty((len(tokens), len(MOE_LAYER_FEATURES)))
    for i in range(len(tokens)):
        key = (int(tokens[i]), int(experts[i]), int(topk[i]), int(ep[i]), str(distribution[i]))
        if key not in cache:
            cache[key] = rank_load(*key, seed=seed)
        r = cache[key]
        e = float(mats[i]) * float(hidden[i]) * float(inter[i]) / float(tp[i])
        out[i] = (r.G * e, 2.0 * e * r.N, 2.0 * e * r.N_padded, (r.N + tokens[i]) * hidden[i])
    return out
