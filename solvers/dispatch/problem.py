"""The expert-dispatch problem: a placement, one layer's batch, a cost profile, a result.

Per GPU ``g`` with ``G_g`` activated replicas and ``N_g`` token rows (each replica's
rows rounded up to ``tile_rows``, the grouped-GEMM M-tile; DeepGEMM contiguous layout,
``shared/reference/formal_models.md`` §5.1) the expert block takes the max-affine
profile time ``t_g = max_k (α_k + b_k·G_g + β_k·N_g)`` (``hardware.maxaffine``; e.g.
``max(a + b·G, c + β·N)`` from ``perfmodel.expert``); the makespan is ``max_g t_g``.
Every dispatcher (``solvers.dispatch``) returns a :class:`DispatchResult` built by
:func:`_result` from per-pair token loads ``x`` (one entry per (expert, GPU) pair that
holds a replica, in ``pair_e``/``pair_g`` order).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from hardware.maxaffine import MaxAffine
from hardware.roofline import GEMM_M_TILE
from perfmodel.errors import InfeasibleError, SpecError

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
_EPS = 1e-12


# ---- placement ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Placement:
    """Replicas of each logical expert on each GPU: ``replicas[i, g]`` (E, G) counts."""

    replicas: I64
    gpus_per_node: int = 0  # 0: all GPUs in one scale-up domain

    def __post_init__(self) -> None:
        r = np.asarray(self.replicas)
        if r.ndim != 2 or r.shape[0] < 1 or r.shape[1] < 1:
            raise SpecError(f"placement must be (experts, gpus), got shape {r.shape}")
        if np.any(r < 0) or np.any(r != np.round(r)):
            raise SpecError("placement replica counts must be non-negative integers")
        object.__setattr__(self, "replicas", r.astype(np.int64))

    @property
    def num_experts(self) -> int:
        return int(self.replicas.shape[0])

    @property
    def num_gpus(self) -> int:
        return int(self.replicas.shape[1])

    @property
    def slots_used(self) -> I64:
        """Replica slots occupied on each GPU."""
        return self.replicas.sum(axis=0)

    @classmethod
    def from_slots(
        cls,
        phy2log: ArrayLike,
        slot_gpu: ArrayLike,
        *,
        num_experts: int,
        num_gpus: int,
        gpus_per_node: int = 0,
    ) -> Placement:
        """From a physical-slot map (EPLB's ``phy2log``) and each slot's GPU."""
        p2l = np.asarray(phy2log, dtype=np.int64).ravel()
        sg = np.asarray(slot_gpu, dtype=np.int64).ravel()
        if len(p2l) != len(sg):
            raise SpecError(f"{len(p2l)} slots but {len(sg)} slot GPUs")
        bad = np.flatnonzero((sg < 0) | (sg >= num_gpus))
        if len(bad):
            raise SpecError(
                f"replica slot {bad[0]} is on GPU {sg[bad[0]]}, but there are only "
                f"{num_gpus} GPUs (0..{num_gpus - 1}); fix the placement or raise --gpus"
            )
        badx = np.flatnonzero((p2l < 0) | (p2l >= num_experts))
        if len(badx):
            raise SpecError(
                f"replica slot {badx[0]} holds expert {p2l[badx[0]]}, but the model has "
                f"{num_experts} experts (0..{num_experts - 1})"
            )
        rep = np.zeros((num_experts, num_gpus), dtype=np.int64)
        np.add.at(rep, (p2l, sg), 1)
        return cls(rep, gpus_per_node)

    def check_slots(self, slots_per_gpu: ArrayLike) -> None:
        """Raise InfeasibleError naming the first GPU that holds more replicas than fit."""
        cap = np.broadcast_to(np.asarray(slots_per_gpu, dtype=np.int64), (self.num_gpus,))
        over = np.flatnonzero(self.slots_used > cap)
        if len(over):
            g = int(over[0])
            raise InfeasibleError(
                f"GPU {g} holds {int(self.slots_used[g])} expert replicas but has memory "
                f"for {int(cap[g])}; remove replicas from GPU {g} or free memory"
            )


def round_robin_placement(
    num_experts: int, num_gpus: int, *, replicas: int = 1, gpus_per_node: int = 0
) -> Placement:
    """Replica ``r`` of expert ``i`` on GPU ``(i + r·⌈G/replicas⌉) mod G`` (distinct GPUs)."""
    if not 1 <= replicas <= num_gpus:
        raise SpecError(f"replicas per expert must be in [1, {num_gpus}], got {replicas}")
    rep = np.zeros((num_experts, num_gpus), dtype=np.int64)
    stride = -(-num_gpus // replicas)
    for r in range(replicas):
        rep[np.arange(num_experts), (np.arange(num_experts) + r * stride) % num_gpus] += 1
    return Placement(rep, gpus_per_node)


# ---- the problem -------------------------------------------------------------------------


@dataclass(frozen=True)
class DispatchProblem:
    """One layer's batch: token rows per expert, a placement, a cost profile, a tile."""

    counts: F64
    placement: Placement
    profile: MaxAffine
    tile_rows: int = GEMM_M_TILE
    # Derived (sparse replica pairs, profile pieces); not constructor arguments.
    pair_e: I64 = field(init=False, repr=False)
    pair_g: I64 = field(init=False, repr=False)
    pair_mult: I64 = field(init=False, repr=False)
    alpha_s: F64 = field(init=False, repr=False)
    slope_g: F64 = field(init=False, repr=False)
    slope_n: F64 = field(init=False, repr=False)

    def __post_init__(self) -> None:
        c = np.asarray(self.counts, dtype=np.float64).ravel()
        E = self.placement.num_experts
        if len(c) != E:
            raise SpecError(
                f"counts have {len(c)} experts but the placement has {E}; "
                "give one count per routed expert"
            )
        if not np.all(np.isfinite(c)) or np.any(c < 0):
            raise SpecError("expert token counts must be finite and >= 0")
        if not (isinstance(self.tile_rows, int | np.integer) and self.tile_rows >= 1):
            raise SpecError(f"tile_rows must be a positive integer, got {self.tile_rows!r}")
        feats = set(self.profile.features)
        if feats != {"G", "N"}:
            raise SpecError(
                f"dispatch needs a max-affine profile over features G and N, got "
                f"{self.profile.features}"
            )
        orphan = np.flatnonzero((c > 0) & (self.placement.replicas.sum(axis=1) == 0))
        if len(orphan):
            i = int(orphan[0])
            raise InfeasibleError(
                f"expert {i} has {c[i]:g} tokens but no replica on any GPU; place at "
                "least one replica of every routed expert"
            )
        ie, ig = np.nonzero(self.placement.replicas)
        ig_f, in_f = self.profile.features.index("G"), self.profile.features.index("N")
        object.__setattr__(self, "counts", c)
        object.__setattr__(self, "pair_e", ie.astype(np.int64))
        object.__setattr__(self, "pair_g", ig.astype(np.int64))
        object.__setattr__(self, "pair_mult", self.placement.replicas[ie, ig].astype(np.int64))
        object.__setattr__(self, "alpha_s", np.asarray(self.profile.intercepts_s, float))
        object.__setattr__(self, "slope_g", np.asarray(self.profile.slopes[:, ig_f], float))
        object.__setattr__(self, "slope_n", np.asarray(self.profile.slopes[:, in_f], float))

    @property
    def num_experts(self) -> int:
        return self.placement.num_experts

    @property
    def num_gpus(self) -> int:
        return self.placement.num_gpus

    def pad(self, x: ArrayLike) -> F64:
        """Rows a replica with ``x`` tokens occupies: ``tile·⌈x/tile⌉``."""
        a = np.asarray(x, dtype=np.float64)
        if self.tile_rows == 1:
            return a
        return np.ceil(a / self.tile_rows - 1e-9) * self.tile_rows

    def time_s(self, activated: ArrayLike, rows: ArrayLike) -> F64:
        """Expert-block seconds at (G, N) per GPU, from the profile's pieces."""
        G = np.asarray(activated, dtype=np.float64)
        N = np.asarray(rows, dtype=np.float64)
        al, sg, sn = self.alpha_s, self.slope_g, self.slope_n
        if len(al) == 2:  # the expert profile; no (..., K) temporary
            return np.maximum(al[0] + sg[0] * G + sn[0] * N, al[1] + sg[1] * G + sn[1] * N)
        return np.max(al + sg * G[..., None] + sn * N[..., None], axis=-1)

    def gpu_state(self, x_pairs: ArrayLike) -> tuple[F64, F64, F64, F64]:
        """(activated, tokens, rows, time_s) per GPU for pair loads ``x_pairs``."""
        x = np.asarray(x_pairs, dtype=np.float64)
        G = self.num_gpus
        act = np.bincount(self.pair_g, weights=(x > 1e-9).astype(float), minlength=G)
        tok = np.bincount(self.pair_g, weights=x, minlength=G)
        rows = np.bincount(self.pair_g, weights=self.pad(x), minlength=G)
        return (
            np.asarray(act, dtype=np.float64),
            np.asarray(tok, dtype=np.float64),
            np.asarray(rows, dtype=np.float64),
            self.time_s(act, rows),
        )

    def ref_time_s(self) -> float:
        """A typical magnitude (one activated expert with one tile) to scale solvers."""
        t = float(self.time_s(1.0, float(self.tile_rows)))
        return t if t > 0 else 1.0


def make_problem(
    counts: ArrayLike, placement: Placement, profile: MaxAffine, *, tile_rows: int = GEMM_M_TILE
) -> DispatchProblem:
    return DispatchProblem(np.asarray(counts, dtype=np.float64), placement, profile, tile_rows)


# ---- results -----------------------------------------------------------------------------


@dataclass(frozen=True)
class DispatchResult:
    """A dispatch of one batch, whatever produced it."""

    method: str
    tokens: F64  # (E, G) tokens of expert i on GPU g
    gpu_tokens: F64  # (G,)
    gpu_rows: F64  # (G,) tile-padded rows
    activated: F64  # (G,) activated replicas
    gpu_time_s: F64  # (G,)
    makespan_s: float
    lower_bound_s: float | None
    solve_time_s: float
    status: str  # optimal | time_limit | solver_error | heuristic | proxy | bound
    message: str = ""

    @property
    def gap(self) -> float | None:
        """Relative gap to the lower bound: (makespan − bound) / makespan."""
        if self.lower_bound_s is None or self.makespan_s <= 0:
            return None
        return max(0.0, (self.makespan_s - self.lower_bound_s) / self.makespan_s)

    @property
    def flagged(self) -> bool:
        """True when a solver stopped early (best found, not proven optimal)."""
        return self.status in ("time_limit", "solver_error")

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "status": self.status,
            "makespan_s": self.makespan_s,
            "lower_bound_s": self.lower_bound_s,
            "gap": self.gap,
            "solve_time_s": self.solve_time_s,
            "gpu_tokens": self.gpu_tokens.tolist(),
            "gpu_rows": self.gpu_rows.tolist(),
            "activated": self.activated.tolist(),
            "gpu_time_s": self.gpu_time_s.tolist(),
            "message": self.message,
        }


def _result(
    p: DispatchProblem,
    method: str,
    x: F64,
    t0: float,
    status: str,
    *,
    lower_bound_s: float | None = None,
    message: str = "",
    makespan_s: float | None = None,
) -> DispatchResult:
    act, tok, rows, t = p.gpu_state(x)
    mat = np.zeros((p.num_experts, p.num_gpus))
    mat[p.pair_e, p.pair_g] = x  # pairs are unique
    return DispatchResult(
        method=method,
        tokens=mat,
        gpu_tokens=tok,
        gpu_rows=rows,
        activated=act,
        gpu_time_s=t,
        makespan_s=float(t.max()) if makespan_s is None else makespan_s,
        lower_bound_s=lower_bound_s,
        solve_time_s=time.perf_counter() - t0,
        status=status,
        message=message,
    )


def result_from_tokens(
    p: DispatchProblem, tokens: ArrayLike, *, method: str = "given"
) -> DispatchResult:
    """Evaluate a given (E, G) split; rejects tokens on GPUs without a replica."""
    m = np.asarray(tokens, dtype=np.float64)
    if m.shape != (p.num_experts, p.num_gpus):
        raise SpecError(f"split must be (experts, gpus) = {(p.num_experts, p.num_gpus)}")
    if np.any(m[p.placement.replicas == 0] > 0):
        raise SpecError("split sends tokens to a GPU without a replica of that expert")
    if not np.allclose(m.sum(axis=1), p.counts):
        raise SpecError("split does not serve every token of every expert")
    return _result(p, method, m[p.pair_e, p.pair_g], time.perf_counter(), "proxy")
