"""Per-batch expert dispatch: split each expert's tokens over the GPUs holding its
replicas so that the slowest GPU finishes first — a fixed-charge makespan problem.

Per GPU ``g`` with ``G_g`` activated replicas and ``N_g`` token rows (each replica's
rows rounded up to ``tile_rows``, the grouped-GEMM M-tile) the expert block takes the
max-affine profile time ``t_g = max_k (α_k + b_k·G_g + β_k·N_g)``
(``hardware.maxaffine``; e.g. ``max(a + b·G, c + β·N)`` from ``perfmodel.expert``).
The MILP (``shared/reference/formal_models.md`` §5.1):

    min C  s.t.  Σ_g x_ig = T_i                       every token served
                 x_ig ≤ T_i·y_ig, y_ig ∈ {0,1}        fixed charge per activated replica
                 α_k + b_k·Σ_i y_ig + β_k·N_g ≤ C     ∀ g, k  (each max-affine piece)

with ``x`` integer or continuous and ``x = y = 0`` where expert ``i`` has no replica on
``g``. With tile padding (``tile_rows > 1``) ``N_g = tile·Σ_i m_ig`` with integer tile
counts ``y_ig ≤ m_ig ≤ ⌈T_i/tile⌉·y_ig`` and ``Σ_g m_ig ≥ ⌈T_i/tile⌉`` replacing ``x``:
any such ``m`` admits an integer split (fill the pieces in order), so the token
variables drop out and the integer and continuous problems coincide.

Methods, all returning :class:`DispatchResult`:

* ``milp``      exact (PuLP; HiGHS, CBC fallback), time-limited, gap reported;
* ``heuristic`` max-affine-aware greedy (largest expert first, tile-sized chunks to the
  GPU whose time grows least) + vectorized local search on the critical GPU, seeded
  with the static and METRO proxies so it is never worse than those;
* ``token``     token balancing: the LP ``min max_g Σ_i x_ig`` (LPLB's objective), rounded;
* ``activated`` METRO's greedy: each expert whole to the candidate GPU with the fewest
  activated experts (ties to the lowest GPU id) — arXiv 2512.09277 Alg. 1;
* ``static``    EPLB's routing: tokens split evenly over the expert's physical replicas;
* ``bound``     the LP relaxation (``y``, ``m``, ``x`` continuous): a lower bound.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from hardware.maxaffine import MaxAffine
from hardware.roofline import GEMM_M_TILE
from perfmodel.errors import InfeasibleError, SolverError, SpecError
from solvers.pulp_solver import pulp_solver
from solvers.pulp_solver import pulp_solver as _pulp_solver  # noqa: F401  (pd_plan imports it)

F64 = NDArray[np.float64]
I64 = NDArray[np.int64]
METHODS: tuple[str, ...] = ("milp", "heuristic", "token", "activated", "static", "bound")
PROXIES: tuple[str, ...] = ("token", "activated", "static")
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
        G = np.asarray(activated, dtype=np.float64)[..., None]
        N = np.asarray(rows, dtype=np.float64)[..., None]
        return np.max(self.alpha_s + self.slope_g * G + self.slope_n * N, axis=-1)

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
    status: str  # optimal | time_limit | heuristic | proxy | bound
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
        return self.status == "time_limit"

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


# ---- proxies -----------------------------------------------------------------------------


def _split_even(p: DispatchProblem, weights: F64, *, integer: bool) -> F64:
    """Split each T_i over its pairs ∝ weights; integer: floor + largest remainder."""
    tot = np.bincount(p.pair_e, weights=weights, minlength=p.num_experts)
    share = p.counts[p.pair_e] * weights / np.maximum(tot[p.pair_e], _EPS)
    if not integer:
        return share
    base = np.floor(share + 1e-9)
    rem = p.counts - np.bincount(p.pair_e, weights=base, minlength=p.num_experts)
    frac = share - base
    # Order pairs by expert, then by descending fractional part (ties: lower GPU first).
    order = np.lexsort((p.pair_g, -frac, p.pair_e))
    first = np.searchsorted(p.pair_e[order], np.arange(p.num_experts))
    rank = np.arange(len(order)) - first[p.pair_e[order]]
    base[order] += (rank < np.round(rem[p.pair_e[order]])).astype(float)
    return base


def dispatch_static(p: DispatchProblem, *, integer: bool = True) -> DispatchResult:
    """EPLB routing: each expert's tokens split evenly over its physical replicas."""
    t0 = time.perf_counter()
    x = _split_even(p, p.pair_mult.astype(float), integer=integer)
    return _result(p, "static", x, t0, "proxy")


def _fixed_pairs(p: DispatchProblem) -> tuple[F64, list[int]]:
    """Loads of experts with a single candidate GPU (no choice) and the experts that
    have a choice, the latter in descending token order."""
    starts = np.searchsorted(p.pair_e, np.arange(p.num_experts + 1))
    n_cand = np.diff(starts)
    x = np.zeros(len(p.pair_e))
    single = np.flatnonzero((n_cand == 1) & (p.counts > 0))
    x[starts[single]] = p.counts[single]
    multi = np.flatnonzero((n_cand > 1) & (p.counts > 0))
    multi = multi[np.argsort(-p.counts[multi], kind="stable")]
    return x, multi.tolist()


def _metro_x(p: DispatchProblem) -> F64:
    """METRO Alg. 1: experts in id order, each whole to the candidate GPU with the
    fewest activated experts so far (ties: lowest GPU id)."""
    loads = [0] * p.num_gpus
    x = np.zeros(len(p.pair_e))
    starts = np.searchsorted(p.pair_e, np.arange(p.num_experts + 1)).tolist()
    pg = p.pair_g.tolist()
    T = p.counts.tolist()
    for i in range(p.num_experts):
        if T[i] <= 0:
            continue
        lo, hi = starts[i], starts[i + 1]
        best = lo
        bl = loads[pg[lo]]
        for r in range(lo + 1, hi):
            lr = loads[pg[r]]
            if lr < bl or (lr == bl and pg[r] < pg[best]):
                best, bl = r, lr
        loads[pg[best]] = bl + 1
        x[best] = T[i]
    return x


def dispatch_activated(p: DispatchProblem) -> DispatchResult:
    """METRO greedy: each expert whole to the candidate GPU with fewest activated experts."""
    t0 = time.perf_counter()
    return _result(p, "activated", _metro_x(p), t0, "proxy")


def _lp_min_max(p: DispatchProblem, *, relax_profile: bool) -> tuple[F64, float]:
    """LP over pair loads. relax_profile=False: min max_g Σ x (tokens); True: the LP
    relaxation of the MILP. Returns (x, objective in seconds or tokens)."""
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    active = p.counts[p.pair_e] > 0
    idx = np.flatnonzero(active)
    R = len(idx)
    G = p.num_gpus
    if R == 0:
        obj = float(p.time_s(0.0, 0.0).max()) if relax_profile else 0.0
        return np.zeros(len(p.pair_e)), obj
    e, g = p.pair_e[idx], p.pair_g[idx]
    T = p.counts[e]
    eq_rows = np.unique(e, return_inverse=True)[1]
    n_eq = int(eq_rows.max()) + 1
    if not relax_profile:
        # vars: x (R), C. rows: Σ_{r∈g} x_r − C ≤ 0.
        nv = R + 1
        A_ub = coo_matrix(
            (
                np.r_[np.ones(R), -np.ones(G)],
                (np.r_[g, np.arange(G)], np.r_[np.arange(R), np.full(G, R)]),
            ),
            shape=(G, nv),
        )
        b_ub = np.zeros(G)
        A_eq = coo_matrix((np.ones(R), (eq_rows, np.arange(R))), shape=(n_eq, nv))
        b_eq = np.bincount(eq_rows, weights=T, minlength=n_eq) / np.bincount(
            eq_rows, minlength=n_eq
        )
        c = np.zeros(nv)
        c[R] = 1.0
        bounds: list[tuple[float | None, float | None]] = [(0, None)] * nv
        res = linprog(c, A_ub=A_ub, b_ub=b_ub, A_eq=A_eq, b_eq=b_eq, bounds=bounds, method="highs")
    else:
        # vars: x (R), y (R), m (R, rows/tile), C (scaled by 1/ref).
        s = 1.0 / p.ref_time_s()
        K = len(p.alpha_s)
        tile = float(p.tile_rows)
        nv = 3 * R + 1
        ar = np.arange(R)
        rows_i: list[NDArray[Any]] = []
        cols_i: list[NDArray[Any]] = []
        vals: list[NDArray[Any]] = []
        b_ub_l: list[F64] = []
        r0 = 0
        for k in range(K):  # α_k + b_k Σ y + β_k·tile Σ m ≤ C
            rows_i += [r0 + g, r0 + g, r0 + np.arange(G)]
            cols_i += [R + ar, 2 * R + ar, np.full(G, 3 * R)]
            vals += [np.full(R, s * p.slope_g[k]), np.full(R, s * p.slope_n[k] * tile), -np.ones(G)]
            b_ub_l.append(np.full(G, -s * p.alpha_s[k]))
            r0 += G
        # x − T·y ≤ 0 ; x − tile·m ≤ 0 ; y − m ≤ 0
        rows_i += [r0 + ar, r0 + ar, r0 + R + ar, r0 + R + ar, r0 + 2 * R + ar, r0 + 2 * R + ar]
        cols_i += [ar, R + ar, ar, 2 * R + ar, R + ar, 2 * R + ar]
        vals += [np.ones(R), -T, np.ones(R), np.full(R, -tile), np.ones(R), -np.ones(R)]
        b_ub_l.append(np.zeros(3 * R))
        n_ub = r0 + 3 * R
        A_ub = coo_matrix(
            (np.concatenate(vals), (np.concatenate(rows_i), np.concatenate(cols_i))),
            shape=(n_ub, nv),
        )
        b_ub = np.concatenate(b_ub_l)
        A_eq = coo_matrix((np.ones(R), (eq_rows, ar)), shape=(n_eq, nv))
        b_eq = np.bincount(eq_rows, weights=T, minlength=n_eq) / np.bincount(
            eq_rows, minlength=n_eq
        )
        c = np.zeros(nv)
        c[-1] = 1.0
        bounds = [(0, None)] * R + [(0, 1)] * R + [(0, None)] * R + [(None, None)]
        res = linprog(c, A_ub=A_ub, b_ub=b_ub, A_eq=A_eq, b_eq=b_eq, bounds=bounds, method="highs")
    if res.status != 0:
        raise SolverError(f"LP solver failed ({res.message}); this is a bug, please report it")
    x = np.zeros(len(p.pair_e))
    x[idx] = np.maximum(res.x[:R], 0.0)
    obj = float(res.fun) / (1.0 / p.ref_time_s()) if relax_profile else float(res.fun)
    return x, obj


def _round_split(p: DispatchProblem, x: F64) -> F64:
    """Integer split keeping each expert's total: floor + largest remainder."""
    return _split_even(p, np.maximum(x, 0.0) + 1e-12 * (x > 0), integer=True)


def dispatch_token(p: DispatchProblem, *, integer: bool = True) -> DispatchResult:
    """Token balancing (LPLB's objective): the LP ``min max_g tokens_g``, rounded."""
    t0 = time.perf_counter()
    x, _ = _lp_min_max(p, relax_profile=False)
    if integer:
        x = _round_split(p, x)
    return _result(p, "token", x, t0, "proxy")


def lower_bound(p: DispatchProblem) -> DispatchResult:
    """LP relaxation of the MILP; ``makespan_s`` is the bound, ``tokens`` the LP split."""
    t0 = time.perf_counter()
    x, obj = _lp_min_max(p, relax_profile=True)
    r = _result(p, "bound", x, t0, "bound", lower_bound_s=obj, makespan_s=obj)
    return r


# ---- heuristic ---------------------------------------------------------------------------


def simple_bound_s(p: DispatchProblem) -> float:
    """``max_k α_k + b_k·n/G + β_k·Σ_i pad(T_i)/G``: every active expert is activated at
    least once and splitting never lowers padded rows, so some GPU is at least average."""
    n = float(np.count_nonzero(p.counts > 0))
    rows = float(p.pad(p.counts).sum())
    G = p.num_gpus
    return float(np.max(p.alpha_s + p.slope_g * n / G + p.slope_n * rows / G))


def _time_fn(p: DispatchProblem) -> Any:
    """A scalar ``t(G, N)`` in plain Python (the greedy's inner loop)."""
    al, sg, sn = p.alpha_s.tolist(), p.slope_g.tolist(), p.slope_n.tolist()
    if len(al) == 2:
        a0, a1, g0, g1, n0, n1 = al[0], al[1], sg[0], sg[1], sn[0], sn[1]

        def tf2(a: float, n: float) -> float:
            u, v = a0 + g0 * a + n0 * n, a1 + g1 * a + n1 * n
            return u if u > v else v

        return tf2
    pieces = list(zip(al, sg, sn, strict=True))

    def tf(a: float, n: float) -> float:
        return max(q + u * a + w * n for q, u, w in pieces)

    return tf


def _waterfill(
    tf: Any, cands: list[tuple[int, int]], act: list[float], rows: list[float], Ti: float, tile: int
) -> tuple[float, list[tuple[int, float]]] | None:
    """Best split of ``Ti`` tokens over the j least-loaded candidate GPUs (j = 2..R):
    fill rows up to a common level, in whole tiles; returns (worst time, parts)."""
    order = sorted(cands, key=lambda rg: tf(act[rg[1]] + 1, rows[rg[1]] + tile))
    n_tiles = int(-(-Ti // tile)) if tile > 1 else 0
    best: tuple[float, list[tuple[int, float]]] | None = None
    for j in range(2, len(order) + 1):
        sub = order[:j]
        base = sorted(rows[g] for _, g in sub)
        # Level λ with Σ max(0, λ − rows_r) = padded total.
        need = n_tiles * tile if tile > 1 else Ti
        lam, acc = base[0], 0.0
        for q in range(1, j + 1):
            nxt = base[q] if q < j else float("inf")
            if acc + q * (nxt - lam) >= need:
                lam += (need - acc) / q
                break
            acc += q * (nxt - lam)
            lam = nxt
        if tile > 1:
            tiles = [int(max(0.0, lam - rows[g]) // tile) for _, g in sub]
            left = n_tiles - sum(tiles)
            for idx in sorted(range(j), key=lambda u: rows[sub[u][1]] + tiles[u] * tile):
                if left <= 0:
                    break
                tiles[idx] += 1
                left -= 1
            amounts = [float(t * tile) for t in tiles]
            # The last non-empty part takes the un-padded remainder.
            over = n_tiles * tile - Ti
            for idx in range(j - 1, -1, -1):
                if amounts[idx] > 0:
                    amounts[idx] -= over
                    break
        else:
            amounts = [float(max(0.0, round(lam - rows[g]))) for _, g in sub]
            amounts[int(np.argmax(amounts))] += Ti - sum(amounts)
        parts = [(r, a) for (r, _), a in zip(sub, amounts, strict=True) if a > 0]
        if len(parts) < 2:
            continue
        v = max(
            tf(act[g] + 1, rows[g] + (-(-a // tile) * tile if tile > 1 else a))
            for (r, g), a in zip(sub, amounts, strict=True)
            if a > 0
        )
        if best is not None and v >= best[0]:
            break
        best = (v, parts)
    return best


def _greedy_x(p: DispatchProblem) -> F64:
    """Experts with one replica are fixed; the others, largest first, go whole to the
    GPU whose time grows least — or, when that would exceed the target (the larger of a
    lower bound and the running makespan), are water-filled in whole tiles over their
    least-loaded replicas if that lowers the worst touched GPU."""
    tf = _time_fn(p)
    x, multi = _fixed_pairs(p)
    act_a, _, rows_a, t_a = p.gpu_state(x)
    act, rows = act_a.tolist(), rows_a.tolist()
    target = max(float(t_a.max()), simple_bound_s(p))
    starts = np.searchsorted(p.pair_e, np.arange(p.num_experts + 1)).tolist()
    pg = p.pair_g.tolist()
    T = p.counts.tolist()
    tile = p.tile_rows
    for i in multi:
        Ti = T[i]
        lo, hi = starts[i], starts[i + 1]
        padT = -(-Ti // tile) * tile if tile > 1 else Ti
        r1, v1 = lo, float("inf")
        for r in range(lo, hi):
            g = pg[r]
            v = tf(act[g] + 1, rows[g] + padT)
            if v < v1:
                r1, v1 = r, v
        g1 = pg[r1]
        if v1 > target and Ti > tile:
            split = _waterfill(tf, [(r, pg[r]) for r in range(lo, hi)], act, rows, Ti, tile)
            if split is not None and split[0] < v1 * (1 - 1e-12):
                v_s, parts = split
                for r, n in parts:
                    g = pg[r]
                    x[r] = n
                    act[g] += 1
                    rows[g] += -(-n // tile) * tile if tile > 1 else n
                target = max(target, v_s)
                continue
        x[r1] = Ti
        act[g1] += 1
        rows[g1] += padT
        target = max(target, v1)
    return x


def _siblings(p: DispatchProblem) -> tuple[I64, I64]:
    """All ordered pairs (r, s) of replica pairs of the same expert on different GPUs."""
    cnt = np.bincount(p.pair_e, minlength=p.num_experts)
    multi = np.flatnonzero(cnt > 1)
    if len(multi) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    starts = np.searchsorted(p.pair_e, np.arange(p.num_experts + 1))
    fr: list[I64] = []
    to: list[I64] = []
    for k in np.unique(cnt[multi]):
        es = multi[cnt[multi] == k]
        base = starts[es][:, None]
        a, b = np.meshgrid(np.arange(k), np.arange(k), indexing="ij")
        keep = a != b
        fr.append((base + a[keep][None, :]).ravel())
        to.append((base + b[keep][None, :]).ravel())
    return np.concatenate(fr), np.concatenate(to)


def _local_search(p: DispatchProblem, x: F64, *, max_iter: int = 48) -> F64:
    """Move or shift tokens off the critical GPU while that lowers its time."""
    sf, st = _siblings(p)
    if len(sf) == 0:
        return x
    x = x.copy()
    act, _, rows, t = p.gpu_state(x)
    tile = float(p.tile_rows)
    gf, gt = p.pair_g[sf], p.pair_g[st]
    floor_s = simple_bound_s(p) * (1 + 1e-12)
    for _ in range(max_iter):
        gs = int(np.argmax(t))
        if t[gs] <= floor_s:  # at the lower bound: optimal
            break
        m = (gf == gs) & (x[sf] > 0)
        if not m.any():
            break
        a, b = sf[m], st[m]
        xa, xb, g2 = x[a], x[b], gt[m]
        half = np.maximum((rows[gs] - rows[g2]) / 2.0, 0.0)
        cands = [xa, np.mod(xa, tile) if tile > 1 else np.floor(xa / 2.0)]
        if tile > 1:
            cands += [np.floor(half / tile) * tile, np.ceil(half / tile) * tile]
        else:
            cands += [np.floor(half), np.ceil(half)]
        d = np.stack([np.clip(c, 0.0, xa) for c in cands])  # (C, M)
        na = xa - d
        nb = xb + d
        act_a = act[gs] - ((na <= 1e-9) & (xa > 1e-9))
        rows_a = rows[gs] - p.pad(xa) + p.pad(na)
        act_b = act[g2] + ((xb <= 1e-9) & (nb > 1e-9))
        rows_b = rows[g2] - p.pad(xb) + p.pad(nb)
        new = np.maximum(p.time_s(act_a, rows_a), p.time_s(act_b, rows_b))
        new = np.where(d > 0, new, np.inf)
        k = int(np.argmin(new))
        c_i, j = divmod(k, new.shape[1])
        if not new[c_i, j] < t[gs] * (1 - 1e-12):
            break
        ra, rb, dj = int(a[j]), int(b[j]), float(d[c_i, j])
        x[ra] -= dj
        x[rb] += dj
        g2j = int(g2[j])
        act[gs], rows[gs] = act_a[c_i, j], rows_a[c_i, j]
        act[g2j], rows[g2j] = act_b[c_i, j], rows_b[c_i, j]
        t[[gs, g2j]] = p.time_s(act[[gs, g2j]], rows[[gs, g2j]])
    return x


def dispatch_heuristic(
    p: DispatchProblem,
    *,
    seed_proxies: bool = True,
    seeds: tuple[DispatchResult, ...] = (),
) -> DispatchResult:
    """Max-affine-aware greedy + local search. With ``seed_proxies`` the static and METRO
    dispatches are also improved by local search and the best kept (so it is never worse
    than those); ``seeds`` adds more starting dispatches (e.g. an already computed token
    balance), each improved the same way."""
    t0 = time.perf_counter()
    best = _local_search(p, _greedy_x(p))
    best_t = float(p.gpu_state(best)[3].max())
    starts = [r.tokens[p.pair_e, p.pair_g] for r in seeds]
    if seed_proxies:
        starts += [_split_even(p, p.pair_mult.astype(float), integer=True), _metro_x(p)]
    if starts:
        for x0 in starts:
            t_0 = float(p.gpu_state(x0)[3].max())
            if t_0 < best_t * (1 - 1e-12):
                x1 = _local_search(p, x0)
                t_1 = float(p.gpu_state(x1)[3].max())
                if t_1 < best_t:
                    best, best_t = x1, t_1
    return _result(p, "heuristic", best, t0, "heuristic")


# ---- exact MILP ---------------------------------------------------------------------------


def solve_milp(
    p: DispatchProblem,
    *,
    integer: bool = True,
    time_limit_s: float = 10.0,
    gap_rel: float = 1e-6,
    incumbent: DispatchResult | None = None,
) -> DispatchResult:
    """Exact fixed-charge makespan MILP (see the module docstring).

    Status: ``optimal`` (gap ≤ ``gap_rel``), or ``time_limit`` (the best found — the
    MILP's incumbent or, if better, the heuristic's — with the gap to the best bound).
    """
    import pulp

    if time_limit_s <= 0:
        raise SpecError(f"time limit must be > 0 s, got {time_limit_s}")
    t0 = time.perf_counter()
    s = 1.0 / p.ref_time_s()
    idx = np.flatnonzero(p.counts[p.pair_e] > 0)
    tile = p.tile_rows
    prob = pulp.LpProblem("expert_dispatch", pulp.LpMinimize)
    C = pulp.LpVariable("makespan", lowBound=None)
    cat = "Integer" if integer else "Continuous"
    xs: dict[int, Any] = {}
    ys: dict[int, Any] = {}
    ms: dict[int, Any] = {}
    # With tiles, only the tile counts m matter: a split with Σ_r tile·m_r ≥ T_i always
    # exists (fill the pieces in order), so x is not a variable and integer = continuous.
    for r in idx.tolist():
        i, g = int(p.pair_e[r]), int(p.pair_g[r])
        Ti = float(p.counts[i])
        ys[r] = pulp.LpVariable(f"y_{i}_{g}", cat="Binary")
        if tile > 1:
            n_i = int(np.ceil(Ti / tile - 1e-9))
            ms[r] = pulp.LpVariable(f"m_{i}_{g}", lowBound=0, upBound=n_i, cat="Integer")
            prob += ms[r] >= ys[r], f"tile_{i}_{g}"
            prob += ms[r] <= n_i * ys[r], f"tmax_{i}_{g}"
        else:
            xs[r] = pulp.LpVariable(f"x_{i}_{g}", lowBound=0, upBound=Ti, cat=cat)
            prob += xs[r] <= Ti * ys[r], f"charge_{i}_{g}"
    by_e: dict[int, list[int]] = {}
    by_g: dict[int, list[int]] = {g: [] for g in range(p.num_gpus)}
    for r in idx.tolist():
        by_e.setdefault(int(p.pair_e[r]), []).append(r)
        by_g[int(p.pair_g[r])].append(r)
    for i, rs in by_e.items():
        if tile > 1:
            n_i = int(np.ceil(float(p.counts[i]) / tile - 1e-9))
            prob += pulp.lpSum(ms[r] for r in rs) >= n_i, f"serve_{i}"
        else:
            prob += pulp.lpSum(xs[r] for r in rs) == float(p.counts[i]), f"serve_{i}"
    for g, rs in by_g.items():
        n_expr = pulp.lpSum((tile * ms[r] if tile > 1 else xs[r]) for r in rs)
        g_expr = pulp.lpSum(ys[r] for r in rs)
        for k in range(len(p.alpha_s)):
            prob += (
                s * p.alpha_s[k] + s * p.slope_g[k] * g_expr + s * p.slope_n[k] * n_expr <= C,
                f"time_{g}_{k}",
            )
    prob += C
    solver, name = pulp_solver(time_limit_s, gap_rel)
    prob.solve(solver)
    bound: float | None = None
    if name == "highs":
        info = prob.solverModel.getInfo()
        db = float(info.mip_dual_bound)
        if np.isfinite(db):
            bound = db / s
    have = prob.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)
    proven = prob.sol_status == pulp.LpSolutionOptimal
    if prob.status in (pulp.LpStatusInfeasible, pulp.LpStatusUnbounded):
        raise SolverError(
            f"dispatch MILP reported {pulp.LpStatus[prob.status]}; it is always feasible, "
            "so this is a solver bug"
        )
    x = np.zeros(len(p.pair_e))
    if have and tile > 1:
        for i, rs in by_e.items():
            left = float(p.counts[i])
            for r in rs:
                cap = tile * round(float(ms[r].varValue or 0.0))
                x[r] = min(cap, left)
                left -= x[r]
    elif have:
        for r, v in xs.items():
            x[r] = max(0.0, float(v.varValue or 0.0))
        if integer:
            x = _round_split(p, x)
    if proven:
        mk = float(p.gpu_state(x)[3].max())
        # CBC gives no bound; an optimal solve is then its own bound.
        lb_opt = mk if bound is None else min(max(bound, 0.0), mk)
        return _result(p, "milp", x, t0, "optimal", lower_bound_s=lb_opt)
    lb = lower_bound(p).makespan_s if bound is None else max(bound, 0.0)
    cand = incumbent or dispatch_heuristic(p)
    x_best = x if have else cand.tokens[p.pair_e, p.pair_g]
    if have and cand.makespan_s < float(p.gpu_state(x)[3].max()):
        x_best = cand.tokens[p.pair_e, p.pair_g]
    found = _result(p, "milp", x_best, t0, "time_limit", lower_bound_s=lb)
    return _result(
        p,
        "milp",
        x_best,
        t0,
        "time_limit",
        lower_bound_s=lb,
        message=(
            f"time limit {time_limit_s:g} s reached: best found, gap "
            f"{100 * (found.gap or 0):.2f}% to the bound; raise --time-limit-s for a proof "
            "of optimality"
        ),
    )


# ---- one entry point -----------------------------------------------------------------------


def dispatch(
    p: DispatchProblem,
    method: str = "heuristic",
    *,
    integer: bool = True,
    time_limit_s: float = 10.0,
) -> DispatchResult:
    """Run one of :data:`METHODS` on the problem."""
    if method == "milp":
        return solve_milp(p, integer=integer, time_limit_s=time_limit_s)
    if method == "heuristic":
        return dispatch_heuristic(p)
    if method == "token":
        return dispatch_token(p, integer=integer)
    if method == "activated":
        return dispatch_activated(p)
    if method == "static":
        return dispatch_static(p, integer=integer)
    if method == "bound":
        return lower_bound(p)
    raise SpecError(f"unknown dispatch method {method!r}; valid: {', '.join(METHODS)}")


def best_proxy(
    p: DispatchProblem, *, integer: bool = True
) -> tuple[str, dict[str, DispatchResult]]:
    """Run the three proxies; return the name of the fastest and all results."""
    res = {m: dispatch(p, m, integer=integer) for m in PROXIES}
    return min(res, key=lambda m: res[m].makespan_s), res


# ---- expert-parallel communication ---------------------------------------------------------
