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
from functools import cached_property
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from perfmodel.errors import SpecError

Arr = NDArray[np.float64]


IntArr = NDArray[np.int64]


def distinct_weights(values: ArrayLike, weights: Arr) -> tuple[NDArray[Any], Arr]:
    """The distinct values of the integers ``values`` (ascending) and the summed
    ``weights`` of each: ``np.unique`` then ``np.bincount`` of the inverse. Token counts
    (non-negative, at most a few times as many as the atoms) are counted by value in one
    ``bincount`` instead, without the sort (a preset's 262,144 atoms: ~1 ms, not ~20 ms);
    the weights of each value are added in the same order, so the sums are the same."""
    v = np.asarray(values)
    if v.dtype.kind in "iu" and v.size and v.min() >= 0 and v.max() < 4 * v.size + 65536:
        present = np.flatnonzero(np.bincount(v))
        summed = np.bincount(v, weights=weights)[present]
        return present.astype(v.dtype), np.asarray(summed, dtype=np.float64)
    u, inv = np.unique(v, return_inverse=True)
    return u, np.asarray(np.bincount(inv, weights=weights), dtype=np.float64)


PARAMETRIC_ATOMS = 512


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

    @cached_property
    def _float_tokens(self) -> tuple[Arr, Arr]:
        """The inputs and outputs as floats, converted once (a preset has 262,144 atoms
        and the service rate takes a dozen expectations)."""
        s, o = self.input_tokens.astype(float), self.output_tokens.astype(float)
        s.flags.writeable = o.flags.writeable = False
        return s, o

    def expect(self, f: Callable[[Arr, Arr], ArrayLike]) -> float:
        """``E[f(s, o)]`` over the atoms (``f`` gets read-only float arrays of inputs and
        outputs)."""
        v = np.asarray(f(*self._float_tokens))
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
        # the standard normal CDF and its inverse, without scipy (perfmodel.special)
        from perfmodel.special import ndtr, ndtri

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
