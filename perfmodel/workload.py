"""Workloads: request length distributions, arrival processes, traces and SLOs.

A **length distribution** is a finite set of joint atoms ``(input_tokens,
output_tokens)`` with probabilities. Every expectation the queueing model needs
(``E[s]``, ``E[o]``, ``E[g(s, o)]`` ...) is an exact weighted sum over the atoms, and
the simulator samples the same atoms, so analytic and simulated results describe the
same distribution.

* *Empirical*: the rows of a trace, equally weighted (:func:`empirical_lengths`).
* *Parametric*: independent truncated log-normal input and output lengths, each
  discretized at ``n`` mid-quantiles ``u = (i + 1/2)/n`` of the truncated law and
  rounded to whole tokens (:func:`lognormal_lengths`). The atoms are the product grid.

Built-in presets (:func:`preset`), estimated from the Azure LLM inference trace 2023
(Patel et al., *Splitwise*, ISCA 2024; CC-BY 4.0; one hour, 16 Nov 2023). Each
marginal is a log-normal truncated to the trace's observed [min, max] whose
(mu, sigma) are chosen (Nelder–Mead) so that its 512-atom discretization matches the
trace's first two moments (``E[x]``, ``E[x²]``: the moments that set the queueing
results). Medians are not fitted; they land within 30 % of the trace's. In the traces the
input and output lengths are nearly uncorrelated (correlation of the logs: -0.005 in
``code``, 0.087 in ``conv``), so the presets take them as independent.

=======  ======  ======  =====  =====  =========================================
preset   side    mu      sigma  range  trace mean / E[x²] (model matches both)
=======  ======  ======  =====  =====  =========================================
chat     input   6.7113  0.8314 2-14050  1154.7 / 2.563e6  (conv.csv, 19,366 rows)
chat     output  5.1051  0.7730 7-1000   211.1 / 7.11e4
code     input   8.3040  2.1796 3-7437   2047.8 / 8.089e6  (code.csv, 8,819 rows)
code     output  -1.4903 2.2199 6-1899   27.9 / 4.36e3
=======  ======  ======  =====  =====  =========================================

The arrival CVs of the traces (std/mean of inter-arrival times) are 1.09 (conv) and
13.2 (code: bursts of simultaneous requests); the presets use Poisson arrivals
(CV 1) unless a CV is given; replay a trace for its own burstiness.

Trace files (:func:`load_trace`), CSV with a header row, one request per row:

* Azure format: ``TIMESTAMP,ContextTokens,GeneratedTokens`` with ISO timestamps
  (``2023-11-16 18:17:03.9799600``); arrival times are relative to the first row.
* Generic format: ``input_tokens,output_tokens[,arrival_s]`` -- integer token
  counts, optional arrival time in seconds (non-decreasing). Columns may be in any
  order; other columns are ignored.

Token counts must be positive integers (an output of at least one token).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np
from numpy.typing import ArrayLike, NDArray

from perfmodel.datafile import parse_float, parse_int, read_csv
from perfmodel.errors import SpecError

Arr = NDArray[np.float64]
IntArr = NDArray[np.int64]

PARAMETRIC_ATOMS = 512


# ---- length distributions ----------------------------------------------------------------


@dataclass(frozen=True)
class LengthDistribution:
    """Joint distribution of (input, output) tokens per request, as weighted atoms."""

    name: str
    input_tokens: IntArr
    output_tokens: IntArr
    weights: Arr = field(repr=False)

    def __post_init__(self) -> None:
        s = np.asarray(self.input_tokens, dtype=np.int64)
        o = np.asarray(self.output_tokens, dtype=np.int64)
        w = np.asarray(self.weights, dtype=np.float64)
        if s.ndim != 1 or s.shape != o.shape or s.shape != w.shape or s.size == 0:
            raise SpecError(f"lengths {self.name!r}: need equal-length non-empty 1-D arrays")
        if np.any(s < 1) or np.any(o < 1):
            raise SpecError(f"lengths {self.name!r}: input and output tokens must be >= 1")
        if np.any(w < 0) or not math.isclose(float(w.sum()), 1.0, rel_tol=1e-9):
            raise SpecError(f"lengths {self.name!r}: weights must be >= 0 and sum to 1")
        object.__setattr__(self, "input_tokens", s)
        object.__setattr__(self, "output_tokens", o)
        object.__setattr__(self, "weights", w)

    def expect(self, f: Callable[[Arr, Arr], ArrayLike]) -> float:
        """``E[f(s, o)]`` over the atoms (``f`` gets float arrays of inputs and outputs)."""
        v = np.asarray(f(self.input_tokens.astype(float), self.output_tokens.astype(float)))
        return float(np.dot(self.weights, np.broadcast_to(v, self.weights.shape)))

    @property
    def mean_input_tokens(self) -> float:
        return self.expect(lambda s, o: s)

    @property
    def mean_output_tokens(self) -> float:
        return self.expect(lambda s, o: o)

    @property
    def max_total_tokens(self) -> int:
        """Largest ``s + o`` with positive probability (the ess sup in Nie et al.'s δ)."""
        m = self.weights > 0
        return int((self.input_tokens[m] + self.output_tokens[m]).max())

    def quantile(self, q: float, *, side: str) -> float:
        """Quantile ``q`` of the input (``side='input'``) or output lengths."""
        x = self.input_tokens if side == "input" else self.output_tokens
        order = np.argsort(x, kind="stable")
        cdf = np.cumsum(self.weights[order])
        return float(x[order][min(int(np.searchsorted(cdf, q)), x.size - 1)])

    def sample(self, n: int, rng: np.random.Generator) -> tuple[IntArr, IntArr]:
        """``n`` i.i.d. requests: (input tokens, output tokens)."""
        if n < 0:
            raise SpecError("number of requests must be >= 0")
        idx = rng.choice(self.input_tokens.size, size=n, p=self.weights)
        return self.input_tokens[idx], self.output_tokens[idx]


def empirical_lengths(
    input_tokens: ArrayLike, output_tokens: ArrayLike, *, name: str = "empirical"
) -> LengthDistribution:
    """The rows of a trace, each with probability 1/n."""
    s = np.asarray(input_tokens, dtype=np.int64)
    n = s.size
    return LengthDistribution(name, s, np.asarray(output_tokens, np.int64), np.full(n, 1.0 / n))


@dataclass(frozen=True)
class TruncLogNormal:
    """Log-normal with log-mean ``mu`` and log-std ``sigma``, truncated to [lo, hi] tokens."""

    mu: float
    sigma: float
    lo: int
    hi: int

    def __post_init__(self) -> None:
        if not (self.sigma > 0 and 1 <= self.lo <= self.hi):
            raise SpecError("log-normal lengths need sigma > 0 and 1 <= lo <= hi")

    def atoms(self, n: int = PARAMETRIC_ATOMS) -> IntArr:
        """Token counts at the ``n`` mid-quantiles of the truncated law."""
        # standard normal CDF and its inverse (scipy.special: light to import, unlike
        # scipy.stats, which costs ~0.7 s of CLI start-up)
        from scipy.special import ndtr, ndtri

        a, b = (ndtr((math.log(v) - self.mu) / self.sigma) for v in (self.lo, self.hi))
        u = a + (b - a) * (np.arange(n) + 0.5) / n
        x = np.exp(self.mu + self.sigma * ndtri(u))
        return np.clip(np.rint(x), self.lo, self.hi).astype(np.int64)


def lognormal_lengths(
    input_len: TruncLogNormal,
    output_len: TruncLogNormal,
    *,
    name: str = "lognormal",
    n: int = PARAMETRIC_ATOMS,
) -> LengthDistribution:
    """Independent truncated log-normal input and output lengths on an ``n × n`` grid."""
    s, o = np.meshgrid(input_len.atoms(n), output_len.atoms(n), indexing="ij")
    return LengthDistribution(name, s.ravel(), o.ravel(), np.full(n * n, 1.0 / (n * n)))


def fixed_lengths(input_tokens: int, output_tokens: int) -> LengthDistribution:
    """Every request has the same lengths."""
    return LengthDistribution(
        f"fixed-{input_tokens}-{output_tokens}",
        np.array([input_tokens]),
        np.array([output_tokens]),
        np.array([1.0]),
    )


# ---- arrival processes ------------------------------------------------------------------


@dataclass(frozen=True)
class RenewalArrivals:
    """Renewal arrivals at ``rate_per_s`` with inter-arrival CV ``cv`` (std / mean).

    ``cv == 1`` is a Poisson process (exponential gaps); otherwise gaps are Gamma with
    shape ``1/cv²`` (bursty for ``cv > 1``, smoother for ``cv < 1``).
    """

    rate_per_s: float
    cv: float = 1.0

    def __post_init__(self) -> None:
        check_rate(self.rate_per_s)
        check_cv(self.cv)

    def times_s(self, n: int, rng: np.random.Generator) -> Arr:
        """Arrival times of ``n`` requests, starting after one gap from t = 0."""
        mean_gap = 1.0 / self.rate_per_s
        if self.cv == 0.0:  # deterministic: evenly spaced arrivals
            return mean_gap * np.arange(1, n + 1, dtype=np.float64)
        if self.cv == 1.0:
            gaps = rng.exponential(mean_gap, size=n)
        else:
            shape = 1.0 / self.cv**2
            gaps = rng.gamma(shape, mean_gap / shape, size=n)
        return np.cumsum(gaps)


def poisson(rate_per_s: float) -> RenewalArrivals:
    return RenewalArrivals(rate_per_s, 1.0)


def gamma_arrivals(rate_per_s: float, cv: float) -> RenewalArrivals:
    return RenewalArrivals(rate_per_s, cv)


#: Largest inter-arrival CV accepted (the trace with the burstiest arrivals we know: 13.2).
MAX_ARRIVAL_CV = 1000.0


def check_cv(cv: float) -> None:
    """Inter-arrival CV in [0, MAX_ARRIVAL_CV]: 0 = evenly spaced, 1 = Poisson."""
    if not (isinstance(cv, int | float) and math.isfinite(cv) and 0 <= cv <= MAX_ARRIVAL_CV):
        raise SpecError(
            f"arrival CV must be in [0, {MAX_ARRIVAL_CV:g}] (0 evenly spaced, 1 Poisson), got {cv}"
        )


def check_rate(rate_per_s: float, what: str = "arrival rate") -> None:
    if not (isinstance(rate_per_s, int | float) and math.isfinite(rate_per_s) and rate_per_s > 0):
        raise SpecError(f"{what} must be a positive number of requests/s, got {rate_per_s!r}")


# ---- traces -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Trace:
    """Recorded requests: arrival times (s, from the first), input and output tokens."""

    source: str
    arrival_s: Arr
    input_tokens: IntArr
    output_tokens: IntArr

    @property
    def n(self) -> int:
        return int(self.input_tokens.size)

    @property
    def duration_s(self) -> float:
        return float(self.arrival_s[-1] - self.arrival_s[0]) if self.n > 1 else 0.0

    @property
    def rate_per_s(self) -> float:
        """Mean arrival rate: (n − 1) gaps over the span of the trace."""
        if self.duration_s <= 0:
            raise SpecError(
                f"trace {self.source} has no arrival times (or all equal); pass --rate-per-s"
            )
        return (self.n - 1) / self.duration_s

    @property
    def arrival_cv(self) -> float:
        gaps = np.diff(self.arrival_s)
        if gaps.size < 2 or gaps.mean() <= 0:
            return 1.0
        return float(gaps.std() / gaps.mean())

    def lengths(self) -> LengthDistribution:
        return empirical_lengths(self.input_tokens, self.output_tokens, name=self.source)

    def replay_times_s(self, time_scale: float = 1.0) -> Arr:
        """Arrival times with the clock sped up ``time_scale`` times (2 = twice the rate)."""
        if not (math.isfinite(time_scale) and time_scale > 0):
            raise SpecError(f"trace time scale must be > 0, got {time_scale}")
        return (self.arrival_s - self.arrival_s[0]) / time_scale


_AZURE = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


#: Largest trace accepted by default (rows); a bigger one is refused before any work.
MAX_TRACE_ROWS = 10_000_000
#: Largest token count of one request a trace may hold.
MAX_TRACE_TOKENS = 10_000_000


def load_trace(path: str | Path) -> Trace:
    """Read a trace CSV (Azure or generic format, see the module docstring)."""
    p = Path(path)
    tab = read_csv(p, what="trace", min_rows=0)
    header = list(tab.header)
    if all(h in header for h in _AZURE):
        cols = {"in": header.index(_AZURE[1]), "out": header.index(_AZURE[2])}
        ts_col, azure = header.index(_AZURE[0]), True
    elif "input_tokens" in header and "output_tokens" in header:
        cols = {"in": header.index("input_tokens"), "out": header.index("output_tokens")}
        ts_col = header.index("arrival_s") if "arrival_s" in header else -1
        azure = False
    else:
        raise SpecError(
            f"{p}:1: unrecognized header {','.join(header)!r}; expected "
            "'TIMESTAMP,ContextTokens,GeneratedTokens' (Azure) or "
            "'input_tokens,output_tokens[,arrival_s]'"
        )
    if len(tab) > MAX_TRACE_ROWS:
        raise SpecError(f"{p}: {len(tab)} requests, over the {MAX_TRACE_ROWS} limit; cut it")
    s: list[int] = []
    o: list[int] = []
    t: list[float] = []
    t0: datetime | None = None
    for lineno, row in tab:
        where = f"{p}:{lineno}"
        for key, dest in (("in", s), ("out", o)):
            name = header[cols[key]]
            dest.append(
                parse_int(
                    row[cols[key]], where=where, name=name, min_value=1, max_value=MAX_TRACE_TOKENS
                )
            )
        if ts_col < 0:
            continue
        raw = row[ts_col]
        if azure:
            try:
                ts = datetime.fromisoformat(raw[:26])
            except ValueError:
                raise SpecError(f"{where}: TIMESTAMP {raw!r} is not an ISO date-time") from None
            if t0 is not None and (ts.tzinfo is None) != (t0.tzinfo is None):
                raise SpecError(f"{where}: TIMESTAMP {raw!r} mixes time zones with line 2")
            t0 = t0 or ts
            t.append((ts - t0).total_seconds())
        else:
            t.append(parse_float(raw, where=where, name="arrival_s"))
        if len(t) > 1 and t[-1] < t[-2]:
            raise SpecError(f"{where}: arrival time goes backwards; sort the trace by time")
    if not s:
        raise SpecError(f"{p}: trace has a header but no requests")
    arr = np.asarray(t, dtype=np.float64) if t else np.zeros(len(s))
    return Trace(str(p), arr - arr[0], np.asarray(s, np.int64), np.asarray(o, np.int64))


# ---- workloads and presets --------------------------------------------------------------


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


# ---- service-level objectives ------------------------------------------------------------


@dataclass(frozen=True)
class SLO:
    """Latency targets (DistServe's convention, Zhong et al., OSDI 2024).

    The SLO is *met at a rate* when the ``percentile`` quantile of TTFT is at most
    ``ttft_s`` and that of TPOT at most ``tpot_s``; *attainment* is the fraction of
    requests meeting both targets, and *goodput* the largest rate whose attainment is
    at least ``goal``.
    """

    ttft_s: float
    tpot_s: float
    percentile: float = 0.90
    goal: float = 0.90

    def __post_init__(self) -> None:
        for name in ("ttft_s", "tpot_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise SpecError(f"SLO {name} must be a positive number of seconds, got {v}")
        for name in ("percentile", "goal"):
            v = getattr(self, name)
            if not 0 < v < 1:
                raise SpecError(f"SLO {name} must be a fraction in (0, 1), got {v}")
