"""PD planner, step 3: the colocated (chunked-prefill) baseline.

**Colocated baseline**: the best goodput per GPU of the same device(s) serving both
phases with chunked prefill (``perfmodel.queueing``), under the same SLO criterion.
Compared like with like: ``gain`` at the plan's rate (whole instances on both
sides: colocated GPUs needed for λ / plan GPUs) and ``fluid_gain`` at scale
(fractional instances on both sides: :func:`fluid_optimum` per GPU / colocated per
GPU), so integer rounding at small λ cannot decide the verdict at scale.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

from hardware.device import Device
from hardware.engine import engine_for
from perfmodel.errors import InfeasibleError, SpecError
from perfmodel.model import ModelSpec
from perfmodel.serving.goodput import Attainment, slo_attainment
from perfmodel.serving.latency import LatencyEstimate
from perfmodel.serving.search import MAX_ITERATIONS
from perfmodel.serving.service import ServiceRate, latency, service_rate
from perfmodel.step.instance import Instance
from perfmodel.units import MS_PER_S
from perfmodel.workload.presets import Workload
from perfmodel.workload.slo import SLO
from solvers.pd.enumerate import EngineSpec, parallel_plan, valid_tps
from solvers.pd.results import Colocated

COLOCATED_BUDGET_TOKENS = 2048  # chunked-prefill token budget of the baseline (Sarathi-Serve)

#: predictions in a row that decided no bisection step before the search bisects plainly
#: (2 sent cells back to μ/2 after two misses above a stale hint: the 20 × 20 length
#: panel's serial sweep made 967 estimates at 2, 954 at 3, 951 at 5 and with no plain
#: fallback at all; every cell the same)
PLAIN_AFTER = 3

#: the bisection's low end, as a fraction of μ (its bracket is ``[μ·10⁻³, μ]``)
LOW_FRACTION = 1e-3

#: each configuration's goodput as a fraction of μ, by ``(device id, TP)``
Hints: TypeAlias = dict[tuple[str, int], float]

_Quantiles = tuple[float, float | None]  # TTFT and TPOT quantiles of one estimate (s)


@dataclass
class ColocatedMemo:
    """Service rates and latency estimates of one workload's configurations, by rate.

    The latency at a rate does not depend on the SLO, so a sweep over SLO targets (same
    workload, devices and dtypes) shares one memo: every bisection of
    :func:`colocated_baseline` starts from the same bracket, so later cells find most of
    their midpoints already estimated. Pass a fresh memo per workload.
    """

    services: dict[tuple[str, int], ServiceRate | None] = field(default_factory=dict)
    estimates: dict[tuple[str, int], dict[float, LatencyEstimate]] = field(default_factory=dict)
    #: (TTFT, TPOT) quantiles of the estimates by (rate, percentile), SLO-free as well (TPOT
    #: None: not computed, as while the TTFT quantile misses the target)
    quantiles: dict[tuple[str, int], dict[tuple[float, float], _Quantiles]] = field(
        default_factory=dict
    )


class _Meets:
    """``ok(rate)`` of one configuration under one SLO: estimates cached by rate, and
    answered without an estimate when an estimated rate decides it (attainment falls with
    the rate: ok at ``r' ≥ r`` implies ok at ``r``; not ok at ``r' ≤ r`` implies not ok)."""

    def __init__(
        self,
        sv: ServiceRate,
        slo: SLO,
        cache: dict[float, LatencyEstimate],
        quantiles: dict[tuple[float, float], _Quantiles],
        hint: float | None = None,
    ) -> None:
        self.sv, self.slo, self.cache, self.quantiles = sv, slo, cache, quantiles
        self.hint = hint  # the threshold's expected fraction of μ (a neighbouring cell's)
        self.rates = sorted(cache)
        self.loads = [self._load(r, cache[r]) for r in self.rates]

    def _load(self, rate: float, est: LatencyEstimate) -> float:
        """``max(TTFT quantile / target, TPOT quantile / target)``: ≤ 1 iff the SLO is met
        (:func:`slo_attainment`'s percentile check); where the TTFT quantile misses its
        target, that ratio alone (the TPOT law is not computed: the verdict is the same,
        only :meth:`predict` may place the next estimate elsewhere)."""
        q = self.slo.percentile
        tq, pq = self.quantiles.get((rate, q)) or (est.ttft_quantile_s(q), None)
        if pq is None and tq <= self.slo.ttft_s:
            pq = est.tpot_quantile_s(q)
        self.quantiles[rate, q] = (tq, pq)
        if pq is None:
            h = tq / self.slo.ttft_s
            return h if math.isfinite(h) else math.inf
        h = max(tq / self.slo.ttft_s, pq / self.slo.tpot_s)
        if tq <= self.slo.ttft_s and pq <= self.slo.tpot_s:
            return h if h <= 1.0 else 1.0
        return h if math.isfinite(h) and h > 1.0 else math.inf

    def attainment(self, rate: float) -> Attainment:
        return slo_attainment(self._estimate(rate), self.slo)

    def _estimate(self, rate: float) -> LatencyEstimate:
        est = self.cache.get(rate)
        if est is None:  # a cold estimate: a cell of a sweep equals the cell alone
            est = self.cache[rate] = latency(self.sv, rate)
        if rate not in self.rates:
            i = bisect.bisect_left(self.rates, rate)
            self.rates.insert(i, rate)
            self.loads.insert(i, self._load(rate, est))
        return est

    def known(self, rate: float) -> bool | None:
        """The verdict at ``rate`` if an estimated rate decides it, else None."""
        i = bisect.bisect_left(self.rates, rate)
        if i < len(self.rates) and self.rates[i] == rate:
            return self.loads[i] <= 1.0
        if any(h <= 1.0 for h in self.loads[i:]):  # ok at a higher rate
            return True
        if not all(h <= 1.0 for h in self.loads[:i]):  # not ok at a lower rate
            return False
        return None

    def __call__(self, rate: float) -> bool:
        v = self.known(rate)
        if v is None:
            self._estimate(rate)
            v = self.known(rate)
        return bool(v)

    def lowest_miss(self) -> float:
        """The lowest estimated rate that misses the SLO (``inf``: none)."""
        return next((r for r, h in zip(self.rates, self.loads, strict=True) if h > 1.0), math.inf)

    def predict(self, lo: float, hi: float) -> float:
        """Where ``h = max(quantile / target)`` crosses 1, with ``1/h`` taken linear in the
        rate (``h = a/(1 − λ/c)``: latency growing like a queue's towards a critical rate
        ``c``; an unstable estimate is ``1/h = 0``) through the two estimates nearest the
        crossing, or through one and ``1/h = 0`` at ``μ``; without estimates, the hint
        (else the midpoint of ``[lo, hi]``). Only where the next estimate goes depends on it."""
        pts = [(r, 1.0 / h) for r, h in zip(self.rates, self.loads, strict=True)]
        oks = [p for p in pts if p[1] >= 1.0]
        bad = [p for p in pts if p[1] < 1.0]
        if not pts:
            guess = 0.5 * (lo + hi) if self.hint is None else self.hint * self.sv.rate_per_s
            return min(max(guess, lo), hi)
        if oks and bad:
            (r1, y1), (r2, y2) = oks[-1], bad[0]
        elif len(oks) >= 2:
            (r1, y1), (r2, y2) = oks[-2], oks[-1]
        elif len(bad) >= 2 and bad[1][1] < bad[0][1]:
            (r1, y1), (r2, y2) = bad[0], bad[1]
        else:
            (r1, y1), (r2, y2) = pts[-1 if oks else 0], (self.sv.rate_per_s, 0.0)
        if r2 == r1 or y2 == y1:
            return 0.5 * (lo + hi)
        guess = r1 + (1.0 - y1) * (r2 - r1) / (y2 - y1)
        top = bad[0][0] if bad else hi
        return min(max(guess, lo, oks[-1][0] if oks else lo), hi, top)


class _Race:
    """One configuration's bisection of :func:`perfmodel.serving.search.max_rate` from
    ``[μ·10⁻³, μ]``, the verdict at each midpoint from :class:`_Meets`.

    The bisection's answer depends only on its verdicts, so the latency estimates may be
    taken elsewhere than at the midpoints, as long as they decide them: :meth:`advance`
    takes the steps the estimates decide, then one estimate where the threshold is
    predicted to make it count most — at an end of the bisection's predicted last
    bracket (two estimates when the prediction holds, instead of one per step), or, for
    a configuration predicted to lose, at the rate that proves it cannot beat the best
    per-GPU rate proven so far. ``lo`` is proven once a midpoint met the SLO or ``ok(lo)``
    was checked (done only when it is needed)."""

    def __init__(self, sv: ServiceRate, ok: _Meets, rel_tol: float) -> None:
        self.sv, self.ok, self.rel_tol = sv, ok, rel_tol
        self.lo, self.hi = sv.rate_per_s * LOW_FRACTION, sv.rate_per_s
        self.steps, self.moved = 0, False
        self.checked: bool | None = None
        self.misses = 0  # predictions in a row that did not decide the next midpoint

    @property
    def done(self) -> bool:
        return self.checked is False or self._converged(self.lo, self.hi, self.steps)

    def _converged(self, lo: float, hi: float, steps: int) -> bool:
        return steps >= MAX_ITERATIONS or hi - lo <= self.rel_tol * hi

    @property
    def bound(self) -> float:
        """Above the per-GPU answer: the bracket top, or a lower rate known to miss."""
        return min(self.hi, self.ok.lowest_miss()) / self.sv.devices

    @property
    def proven_per_gpu(self) -> float:
        return self.lo / self.sv.devices if self.moved or self.checked else 0.0

    def feasible(self) -> bool:
        if self.checked is None:
            self.checked = self.moved or self.ok(self.lo)
        return bool(self.checked)

    def _settle(self) -> None:
        """Take every bisection step the estimates decide."""
        while not self.done:
            mid = 0.5 * (self.lo + self.hi)
            v = self.ok.known(mid)
            if v is None:
                return
            self.steps += 1
            if v:
                self.lo, self.moved = mid, True
            else:
                self.hi = mid
                if not self.moved and self.ok.known(self.lo) is False:
                    self.checked = False

    def _last_bracket(self, guess: float) -> tuple[float, float]:
        """The bisection's last bracket if the threshold were ``guess``."""
        lo, hi, steps = self.lo, self.hi, self.steps
        while not self._converged(lo, hi, steps):
            mid = 0.5 * (lo + hi)
            v = self.ok.known(mid)
            steps += 1
            if v if v is not None else mid <= guess:
                lo = mid
            else:
                hi = mid
        return lo, hi

    def advance(self, floor: float) -> None:
        """Decided steps, then one latency estimate (see the class docstring)."""
        self._settle()
        if self.done:
            return
        mid = 0.5 * (self.lo + self.hi)
        guess = self.ok.predict(self.lo, self.hi)
        beat = floor * self.sv.devices  # the rate this configuration must exceed to win
        if self.misses >= PLAIN_AFTER:
            probe = mid  # the predictions do not help here: plain bisection
        elif self.proven_per_gpu < floor and guess < beat and self.ok.known(beat) is None:
            probe = beat  # predicted to lose: a miss at `beat` proves it
        else:
            lo_f, hi_f = self._last_bracket(guess)
            probe = lo_f if mid <= guess else hi_f
            if self.ok.known(probe) is not None:
                probe = mid
        self.ok(probe)
        before = self.steps
        self._settle()
        self.misses = 0 if self.steps > before or self.done else self.misses + 1


def colocated_baseline(
    model: ModelSpec,
    workload: Workload,
    slo: SLO,
    *,
    devices: Sequence[Device],
    dtype: str = "bf16",
    kv_dtype: str = "bf16",
    max_batched_tokens: int = COLOCATED_BUDGET_TOKENS,
    rel_tol: float = 0.02,
    tps: Sequence[int] | None = None,
    memo: ColocatedMemo | None = None,
    engine: EngineSpec = None,
    hints: Hints | None = None,
) -> Colocated:
    """Best per-GPU goodput of chunked-prefill instances under the percentile criterion.

    Each configuration's goodput is the bisection of ``max_rate`` from ``[μ·10⁻³, μ]``;
    the bisections advance best first — always the configuration whose bracket top
    ``hi/tp`` is highest — and one is dropped once ``hi/tp`` is at most a per-GPU rate
    another has proven (branch and bound: the answer of running every bisection to the
    end, with few latency estimates). ``tps``: the
    tensor-parallel degrees to try (default every valid one). ``memo``: shared across
    calls on the same workload, devices, dtypes and engine (an SLO sweep); same
    answers. ``engine``: as in :func:`solvers.pd.enumerate.evaluate_options`.
    ``hints``: each configuration's goodput as a fraction of μ by ``(device id, TP)``,
    where the first estimates go (a neighbouring cell's, e.g. of a length sweep), updated
    with this call's (the middle of a converged bisection's last bracket, else the
    predicted threshold); same answers, fewer estimates when the hints are close.
    """
    memo = memo or ColocatedMemo()
    cands = []
    for dev in devices:
        for tp in tps or valid_tps(model):
            key = (dev.id, tp)
            if key not in memo.services:
                try:
                    memo.services[key] = service_rate(
                        Instance(
                            model,
                            dev,
                            parallel_plan(tp, dtype, kv_dtype),
                            engine=engine_for(engine, dev),
                        ),
                        workload,
                        max_batched_tokens=max_batched_tokens,
                    )
                except (InfeasibleError, SpecError):
                    memo.services[key] = None
            sv = memo.services[key]
            if sv is not None and sv.largest_request_fits:
                cands.append((sv, key))
    cands.sort(key=lambda c: -c[0].rate_per_s / c[0].devices)
    races = [
        _Race(
            sv,
            _Meets(
                sv,
                slo,
                memo.estimates.setdefault(key, {}),
                memo.quantiles.setdefault(key, {}),
                (hints or {}).get(key),
            ),
            rel_tol,
        )
        for sv, key in cands
    ]
    # best first: bisect the configuration with the highest upper bound hi/tp on its
    # per-GPU goodput; drop those whose bound is at most a proven rate of another
    while True:
        floor = max((r.proven_per_gpu for r in races), default=0.0)
        live = [r for r in races if not r.done and r.bound > floor]
        if not live:
            break
        max(live, key=lambda r: r.bound).advance(floor)
    if hints is not None:
        for r, (_, key) in zip(races, cands, strict=True):
            # a converged bisection's bracket middle: in fractions of μ every cell bisects
            # the same grid, so a bracket end (and 2a − b of two of them, a row's trend)
            # is exactly a midpoint of the next cell's, where rounding would decide which
            # side of it the first estimate goes
            guess = 0.5 * (r.lo + r.hi) if r.done and r.moved else r.ok.predict(r.lo, r.hi)
            hints[key] = guess / r.sv.rate_per_s
    best: Colocated | None = None
    floors = []
    for r in races:
        sv, lo = r.sv, r.lo
        if not r.done or r.bound <= (best.per_gpu_rate_per_s if best else 0.0):
            continue
        if not r.feasible():
            a = r.ok.attainment(r.lo)
            floors.append(
                f"TP{sv.devices}: p{slo.percentile * 100:g} "
                f"TTFT {a.ttft_quantile_s * MS_PER_S:.0f} ms, "
                f"TPOT {a.tpot_quantile_s * MS_PER_S:.1f} ms unloaded"
            )
            continue
        per = lo / sv.devices
        if best is None or per > best.per_gpu_rate_per_s:
            best = Colocated(
                True,
                sv.device.id,
                sv.devices,
                max_batched_tokens,
                lo,
                per,
                f"{lo:.3g} req/s per TP{sv.devices} instance ({lo / sv.rate_per_s:.0%} of μ, "
                f"{sv.binding}-bound)",
            )
    if best is None:
        return Colocated(
            False,
            devices[0].id,
            0,
            max_batched_tokens,
            0.0,
            0.0,
            "no colocated configuration meets the SLO: " + "; ".join(floors or ["none fits"]),
        )
    return best
