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
from collections.abc import Sequence
from dataclasses import dataclass, field

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


class _Meets:
    """``ok(rate)`` of one configuration under one SLO: estimates cached by rate, and
    answered without an estimate when an estimated rate decides it (attainment falls with
    the rate: ok at ``r' ≥ r`` implies ok at ``r``; not ok at ``r' ≤ r`` implies not ok)."""

    def __init__(self, sv: ServiceRate, slo: SLO, cache: dict[float, LatencyEstimate]) -> None:
        self.sv, self.slo, self.cache = sv, slo, cache
        self.rates = sorted(cache)
        self.verdicts = [self._meets(cache[r]) for r in self.rates]

    def _meets(self, est: LatencyEstimate) -> bool:
        return slo_attainment(est, self.slo).meets_percentiles

    def attainment(self, rate: float) -> Attainment:
        return slo_attainment(self._estimate(rate), self.slo)

    def _estimate(self, rate: float) -> LatencyEstimate:
        est = self.cache.get(rate)
        if est is None:
            est = self.cache[rate] = latency(self.sv, rate)
            i = bisect.bisect_left(self.rates, rate)
            self.rates.insert(i, rate)
            self.verdicts.insert(i, self._meets(est))
        return est

    def __call__(self, rate: float) -> bool:
        i = bisect.bisect_left(self.rates, rate)
        if i < len(self.rates) and self.rates[i] == rate:
            return self.verdicts[i]
        if any(self.verdicts[i:]):  # ok at a higher rate
            return True
        if not all(self.verdicts[:i]):  # not ok at a lower rate
            return False
        return self._meets(self._estimate(rate))


class _Race:
    """One configuration's bisection of :func:`perfmodel.serving.search.max_rate` from
    ``[μ·10⁻³, μ]``, taken one step at a time; ``lo`` is proven once a midpoint met the
    SLO or ``ok(lo)`` was checked (done only when it is needed)."""

    def __init__(self, sv: ServiceRate, ok: _Meets, rel_tol: float) -> None:
        self.sv, self.ok, self.rel_tol = sv, ok, rel_tol
        self.lo, self.hi = sv.rate_per_s * 1e-3, sv.rate_per_s
        self.steps, self.moved = 0, False
        self.checked: bool | None = None

    @property
    def done(self) -> bool:
        return (
            self.checked is False
            or self.steps >= MAX_ITERATIONS
            or self.hi - self.lo <= self.rel_tol * self.hi
        )

    @property
    def bound(self) -> float:
        return self.hi / self.sv.devices

    @property
    def proven_per_gpu(self) -> float:
        return self.lo / self.sv.devices if self.moved or self.checked else 0.0

    def feasible(self) -> bool:
        if self.checked is None:
            self.checked = self.moved or self.ok(self.lo)
        return bool(self.checked)

    def step(self) -> None:
        if self.done:
            return
        if self.steps and not self.moved and not self.feasible():
            return  # misses the SLO unloaded: no bisection
        self.steps += 1
        mid = 0.5 * (self.lo + self.hi)
        if self.ok(mid):
            self.lo, self.moved = mid, True
        else:
            self.hi = mid


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
        _Race(sv, _Meets(sv, slo, memo.estimates.setdefault(key, {})), rel_tol) for sv, key in cands
    ]
    # best first: bisect the configuration with the highest upper bound hi/tp on its
    # per-GPU goodput; drop those whose bound is at most a proven rate of another
    while True:
        floor = max((r.proven_per_gpu for r in races), default=0.0)
        live = [r for r in races if not r.done and r.bound > floor]
        if not live:
            break
        max(live, key=lambda r: r.bound).step()
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
