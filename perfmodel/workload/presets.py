"""A workload (lengths + arrivals) and the built-in presets ``chat`` and ``code``."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from perfmodel.errors import SpecError
from perfmodel.workload.arrivals import RenewalArrivals, check_cv
from perfmodel.workload.lengths import LengthDistribution, TruncLogNormal, lognormal_lengths
from perfmodel.workload.trace import Trace

Arr = NDArray[np.float64]


IntArr = NDArray[np.int64]


@dataclass(frozen=True)
class Workload:
    """What the instance serves: a length distribution and arrival burstiness.

    ``arrival_cv`` is the coefficient of variation of inter-arrival times (1 = Poisson)
    used by the latency approximations; ``trace`` keeps a recorded trace for replay.
    """

    name: str
    lengths: LengthDistribution
    arrival_cv: float = 1.0
    trace: Trace | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        check_cv(self.arrival_cv)

    def arrivals(self, rate_per_s: float) -> RenewalArrivals:
        return RenewalArrivals(rate_per_s, self.arrival_cv)

    @staticmethod
    def from_trace(trace: Trace) -> Workload:
        return Workload(Path(trace.source).stem, trace.lengths(), trace.arrival_cv, trace)


PRESETS: dict[str, tuple[TruncLogNormal, TruncLogNormal]] = {
    "chat": (TruncLogNormal(6.7113, 0.8314, 2, 14050), TruncLogNormal(5.1051, 0.7730, 7, 1000)),
    "code": (TruncLogNormal(8.3040, 2.1796, 3, 7437), TruncLogNormal(-1.4903, 2.2199, 6, 1899)),
}


def preset(name: str, *, arrival_cv: float = 1.0) -> Workload:
    """A built-in parametric workload: ``chat`` or ``code`` (see the module docstring)."""
    if name not in PRESETS:
        raise SpecError(f"unknown workload {name!r}; valid: {', '.join(PRESETS)} (or --trace CSV)")
    i, o = PRESETS[name]
    return Workload(name, lognormal_lengths(i, o, name=name), arrival_cv)
