"""Cheap lower bounds on the dispatch makespan (no LP), for pruning the heuristic.

Every active expert is activated at least once, splitting never lowers the padded rows,
and the busiest GPU is at least average — or, with the exact levels of
:func:`solvers.token_balance.subset_levels`, at least the b-matching level of
activations and the balance level of whole tiles. A dispatch that reaches such a bound
is optimal.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from solvers.dispatch.problem import F64, DispatchProblem


def simple_bound_s(p: DispatchProblem) -> float:
    """``max_k α_k + b_k·n/G + β_k·Σ_i pad(T_i)/G``: every active expert is activated at
    least once and splitting never lowers padded rows, so some GPU is at least average."""
    n = float(np.count_nonzero(p.counts > 0))
    rows = float(p.pad(p.counts).sum())
    G = p.num_gpus
    return float(np.max(p.alpha_s + p.slope_g * n / G + p.slope_n * rows / G))


def _bound_pieces(
    p: DispatchProblem, *, tile_level: float | None = None, act_level: float | None = None
) -> tuple[F64, NDArray[np.bool_], NDArray[np.bool_]]:
    """Per-piece lower bounds of :func:`pruning_bound_s` and which pieces have only an
    activation slope / only a token slope."""
    n = float(np.count_nonzero(p.counts > 0))
    G = p.num_gpus
    tile = p.tile_rows
    tiles = np.ceil(p.counts / tile - 1e-9) if tile > 1 else p.counts
    tiles_avg = float(tiles.sum()) / G
    max_tiles = max(tiles_avg, tile_level or 0.0)
    if tile > 1:
        max_tiles = float(np.ceil(max_tiles - 1e-9))
    max_act = np.ceil(max(n / G, act_level or 0.0) - 1e-9)
    al, sg, sn = p.alpha_s, p.slope_g, p.slope_n
    only_g = (sn == 0) & (sg >= 0)
    only_n = (sg == 0) & (sn >= 0)
    t = np.where(
        only_g,
        al + sg * max_act,
        np.where(only_n, al + sn * tile * max_tiles, al + sg * n / G + sn * tile * tiles_avg),
    )
    return t, only_g, only_n


def pruning_bound_s(
    p: DispatchProblem, *, tile_level: float | None = None, act_level: float | None = None
) -> float:
    """A lower bound on the makespan, never below :func:`simple_bound_s`. Per piece ``k``:

    * no token slope: ``α_k + b_k·⌈max(n/G, λ*)⌉`` — the busiest GPU activates at
      least that many replicas (``λ*``: the b-matching level of
      :func:`solvers.token_balance.subset_levels` over active experts, if given);
    * no activation slope: ``α_k + β_k·tile·⌈max(Σ_i n_i/G, L*_tiles)⌉`` with
      ``n_i = ⌈T_i/tile⌉`` — rows come in whole tiles, an expert needs ``n_i`` tiles
      however it is split, and ``L*_tiles`` is the balance level of those tiles;
    * both slopes: the averages ``α_k + b_k·n/G + β_k·tile·Σ_i n_i/G``.
    """
    t, _, _ = _bound_pieces(p, tile_level=tile_level, act_level=act_level)
    return float(np.max(t))
