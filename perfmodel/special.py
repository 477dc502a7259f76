"""Special functions on the CLI's start-up path, without importing ``scipy.special``.

``scipy.special`` (and ``scipy.linalg``) pull in scipy's array-API layer, ~0.3 s of start-up
on an idle machine, for four functions: the normal CDF and its inverse, the regularized
lower incomplete gamma function and the Poisson CDF. They are computed here from
:mod:`math` and numpy; ``tests/unit/test_special.py`` checks them against scipy over a
grid (relative error below 1e-12 where scipy's value is not tiny).

* :func:`ndtr` ``Φ(x) = erfc(−x/√2)/2`` (:func:`math.erfc` is accurate in both tails).
* :func:`ndtri` Acklam's rational approximation (relative error 1.15e-9) refined by one
  Halley step on ``Φ``: the error is then that of ``erfc``.
* :func:`gammainc` ``P(a, x) = x^a e^{−x}/Γ(a+1) · Σ_{n≥0} x^n/((a+1)…(a+n))``. The series
  has positive terms (no cancellation) and converges for every ``x``; it is summed in
  blocks of terms (one cumulative product each), and where the upper tail
  ``Q(a, x) ≤ x^a e^{−x}/(Γ(a)·min(x, x − a + 1))`` (``x > a``) is below 1e-17, ``P`` is
  1 to the last bit. The prefactor's logarithm is taken as
  ``a·(log(x/a) − u) − ½·log(2πa) − c(a)``, ``u = (x − a)/a`` (Stirling, ``c`` its
  correction series; ``log1p(u)`` for ``|u| < ½``), for ``a ≥ 10``, so that its absolute
  error stays ``~ε·|x − a|``.
  Shapes above :data:`GAMMAINC_MAX_SHAPE` go to scipy (imported then; the latency
  mixtures' shapes are below 100).

And :func:`distinct_sorted`, ``np.unique`` of a 1-D array of numbers without its first
call's import of ``numpy.ma`` (~12 ms: the PD planner's two step-time grids).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

Arr = NDArray[np.float64]
BoolArr = NDArray[np.bool_]

#: Shapes ``a`` above this are passed to ``scipy.special.gammainc`` (the series needs
#: ``~9√a`` terms and the prefactor's error grows like ``ε·√a``).
GAMMAINC_MAX_SHAPE = 1e4
_SERIES_BLOCK = 64  # series terms per cumulative product
_LOG_TAIL = math.log(1e-17)  # an upper tail below this leaves P = 1.0 exactly
_STIRLING_FROM = 10.0  # shapes from which the prefactor uses Stirling's series
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
_SQRT2 = math.sqrt(2.0)
_SQRT_2PI = math.sqrt(2.0 * math.pi)


def ndtr(x: float) -> float:
    """Standard normal CDF ``Φ(x)``."""
    return 0.5 * math.erfc(-x / _SQRT2)


_ERFC = np.frompyfunc(math.erfc, 1, 1)
#: below this ``erfc(−x/√2)`` is near the smallest double: :func:`log_ndtr` switches to
#: the asymptotic series there (its first omitted term, 10395/x¹², is < 1e-15 from here)
_LOG_NDTR_ASYMPTOTIC_BELOW = -37.0


def ndtr_array(x: ArrayLike) -> Arr:
    """:func:`ndtr` element-wise (``scipy.special.ndtr``)."""
    a = np.asarray(x, dtype=np.float64)
    return np.asarray(0.5 * _ERFC(-a / _SQRT2), dtype=np.float64)


def log_ndtr(x: ArrayLike) -> Arr:
    """``log Φ(x)`` element-wise (``scipy.special.log_ndtr``): ``log1p(−Φ(−x))`` above 0,
    ``log(erfc(−x/√2)/2)`` down to −37, and below that the asymptotic series
    ``log φ(x) − log(−x) + log(1 − 1/x² + 3/x⁴ − 15/x⁶ + 105/x⁸ − 945/x¹⁰)``."""
    a = np.asarray(x, dtype=np.float64)
    out = np.empty_like(a)
    hi = a > 0
    out[hi] = np.log1p(-ndtr_array(-a[hi]))
    mid = ~hi & (a >= _LOG_NDTR_ASYMPTOTIC_BELOW)
    out[mid] = np.log(ndtr_array(a[mid]))
    lo = ~hi & ~mid & ~np.isnan(a)
    z = a[lo]
    r = 1.0 / (z * z)
    series = 1.0 + r * (-1.0 + r * (3.0 + r * (-15.0 + r * (105.0 - 945.0 * r))))
    out[lo] = -0.5 * z * z - math.log(_SQRT_2PI) - np.log(-z) + np.log(series)
    out[np.isnan(a)] = np.nan
    return out


# Acklam's coefficients (P. J. Acklam, "An algorithm for computing the inverse normal
# cumulative distribution function", 2003): central region and tails.
_A = (-3.969683028665376e01, 2.209460984245205e02, -2.759285104469687e02,
      1.383577518672690e02, -3.066479806614716e01, 2.506628277459239e00)  # fmt: skip
_B = (-5.447609879822406e01, 1.615858368580409e02, -1.556989798598866e02,
      6.680131188771972e01, -1.328068155288572e01)  # fmt: skip
_C = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e00,
      -2.549732539343734e00, 4.374664141464968e00, 2.938163982698783e00)  # fmt: skip
_D = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00,
      3.754408661907416e00)  # fmt: skip
_P_LOW = 0.02425


def _acklam(p: float) -> float:
    if p < _P_LOW or p > 1.0 - _P_LOW:
        q = math.sqrt(-2.0 * math.log(p if p < _P_LOW else 1.0 - p))
        c, d = _C, _D
        x = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / (
            (((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1.0
        )
        return x if p < _P_LOW else -x
    q = p - 0.5
    r = q * q
    a, b = _A, _B
    return (
        (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5])
        * q
        / (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1.0)
    )


def _ndtri_one(p: float) -> float:
    if not 0.0 < p < 1.0:
        if p == 0.0:
            return -math.inf
        if p == 1.0:
            return math.inf
        return math.nan
    if p > 0.5:  # 1 − p is exact here; the lower tail keeps the relative accuracy
        return -_ndtri_one(1.0 - p)
    x = _acklam(p)
    # one Halley step on Φ(x) − p
    e = 0.5 * math.erfc(-x / _SQRT2) - p
    u = e * _SQRT_2PI * math.exp(0.5 * x * x)
    return x - u / (1.0 + 0.5 * x * u)


def ndtri(p: ArrayLike) -> Arr:
    """Inverse of the standard normal CDF, element-wise (``±inf`` at 0 and 1)."""
    pa = np.asarray(p, dtype=np.float64)
    return np.array([_ndtri_one(float(v)) for v in pa.ravel()]).reshape(pa.shape)


@dataclass(frozen=True)
class _ShapeConstants:
    """What :func:`gammainc` needs of the shapes alone (a mixture's CDF reuses them)."""

    log_a: Arr
    lgamma_a1: Arr  # lgamma(a + 1) below _STIRLING_FROM (0 above)
    stirling: Arr  # −½·log(2πa) − c(a) from _STIRLING_FROM on (0 below)
    big: BoolArr  # a ≥ _STIRLING_FROM
    any_big: bool


_CONSTANTS: dict[bytes, _ShapeConstants] = {}
_CONSTANTS_KEPT = 64


def _shape_constants(a: Arr) -> _ShapeConstants:
    """The constants of the shapes ``a`` (any shape; cached for small arrays)."""
    key = a.tobytes() + str(a.shape).encode()
    hit = _CONSTANTS.get(key)
    if hit is not None:
        return hit
    big = a >= _STIRLING_FROM
    inv = 1.0 / np.where(big, a, 1.0)
    inv2 = inv * inv
    corr = inv * (1 / 12 - inv2 * (1 / 360 - inv2 * (1 / 1260 - inv2 * (1 / 1680 - inv2 / 1188))))
    flat = a.ravel().tolist()
    lg = np.array([0.0 if v >= _STIRLING_FROM else math.lgamma(v + 1.0) for v in flat])
    stirling = np.where(big, -_HALF_LOG_2PI - 0.5 * np.log(np.where(big, a, 1.0)) - corr, 0.0)
    c = _ShapeConstants(np.log(a), lg.reshape(a.shape), stirling, big, bool(big.any()))
    if a.size <= 4096:
        if len(_CONSTANTS) >= _CONSTANTS_KEPT:
            _CONSTANTS.pop(next(iter(_CONSTANTS)))
        _CONSTANTS[key] = c
    return c


def _log_prefactor(a: Arr, x: Arr, c: _ShapeConstants | None = None) -> Arr:
    """``log(x^a e^{−x}/Γ(a + 1))`` for ``a > 0``, ``x > 0`` (``c``: the constants of
    ``a``, which may be ``a`` before broadcasting against ``x``)."""
    c = _shape_constants(a) if c is None else c
    log_x = np.log(x)
    out = a * log_x - x - c.lgamma_a1
    if c.any_big:
        u = (x - a) / a
        # log(x/a): log1p near 1 (keeps the bulk accurate), the difference of logs far off
        log_ratio = np.where(np.abs(u) < 0.5, np.log1p(np.clip(u, -0.5, 0.5)), log_x - c.log_a)
        out = np.where(c.big, a * (log_ratio - u) + c.stirling, out)
    return np.asarray(out)


def _series(a: Arr, x: Arr) -> Arr:
    """``Σ_{n≥0} x^n/((a+1)…(a+n))`` to double precision (positive terms), in blocks of
    terms (16, 32, then 64), each one cumulative product; the elements not yet converged
    go on (``x = 0`` sums nothing)."""
    total = np.ones(a.shape)
    last = np.ones(a.shape)  # the latest term
    active = np.flatnonzero(x > 0)
    aa, xx = a[active], x[active]
    start, block = 0.0, 16
    while active.size:
        k = np.arange(start + 1.0, start + block + 1.0)
        terms = np.cumprod(xx[:, None] / (aa[:, None] + k), axis=1)
        terms *= last[active][:, None]
        total[active] += terms.sum(axis=1)
        last[active] = terms[:, -1]
        start += block
        block = min(2 * block, _SERIES_BLOCK)
        # the rest is below last·r/(1 − r) with r = x/(a + start + 1) once r < 1
        r = xx / (aa + start + 1.0)
        more = (r >= 1.0) | (last[active] * r > 1e-17 * (1.0 - r) * total[active])
        active, aa, xx = active[more], aa[more], xx[more]
    return total


def gammainc(a: ArrayLike, x: ArrayLike) -> Arr:
    """Regularized lower incomplete gamma ``P(a, x)`` for shapes ``a > 0``, ``x ≥ 0``
    (element-wise with broadcasting; what ``scipy.special.gammainc`` returns)."""
    a0, x0 = np.asarray(a, np.float64), np.asarray(x, np.float64)
    full = np.broadcast_shapes(a0.shape, x0.shape)
    ok = (a0 > 0) & (a0 <= GAMMAINC_MAX_SHAPE)
    if not ok.all():
        aa, xa = (np.broadcast_to(v, full).ravel() for v in (a0, x0))
        return _gammainc_checked(aa, xa, np.broadcast_to(ok, full).ravel()).reshape(full)
    pos = np.isfinite(x0) & (x0 > 0)
    x1 = np.where(pos, x0, 1.0)
    logp = _log_prefactor(a0, x1, _shape_constants(a0))
    with np.errstate(divide="ignore", invalid="ignore"):
        d = np.minimum(x1, x1 - a0 + 1.0)
        cut = (x1 > a0) & (logp + np.log(a0) - np.log(d) < _LOG_TAIL)
    # the cut elements (P = 1) and x = 0 sum no series terms
    xs = np.where(cut | ~pos, 0.0, x1)
    aa = np.broadcast_to(a0, full).ravel()
    series = _series(aa, np.broadcast_to(xs, full).ravel()).reshape(full)
    vals = np.where(cut, 1.0, np.minimum(np.exp(logp) * series, 1.0))
    vals = np.where(pos, vals, np.where(x0 == 0, 0.0, np.where(np.isposinf(x0), 1.0, np.nan)))
    return np.asarray(vals, dtype=np.float64).reshape(full)


def _gammainc_checked(a: Arr, x: Arr, ok: BoolArr) -> Arr:
    """:func:`gammainc` where some shapes are out of the series' range: NaN for ``a ≤ 0``
    or NaN, scipy's value above :data:`GAMMAINC_MAX_SHAPE`."""
    out = np.full(a.size, np.nan)
    if ok.any():
        out[ok] = gammainc(a[ok], x[ok])
    wide = (a > GAMMAINC_MAX_SHAPE) & ~np.isnan(x)
    if wide.any():
        from scipy.special import gammainc as scipy_gammainc

        out[wide] = scipy_gammainc(a[wide], x[wide])
    return out


def poisson_cdf(k_max: int, rate: float) -> Arr:
    """``P(K ≤ k)`` for ``k = 0 … k_max``, ``K ~ Poisson(rate)``, ``rate > 0``: the running
    sum of the pmf, each ``rate^k e^{−rate}/k!`` the prefactor of :func:`gammainc`."""
    return np.cumsum(poisson_pmf(np.arange(k_max + 1), rate))


def poisson_pmf(k: ArrayLike, rate: float) -> Arr:
    """``P(K = k) = rate^k e^{−rate}/k!`` for ``K ~ Poisson(rate)``, ``rate > 0``, ``k ≥ 0``
    (the prefactor of :func:`gammainc`: accurate for large ``k`` and ``rate`` too)."""
    ka = np.asarray(k, dtype=np.float64)
    flat = ka.ravel()
    out = np.full(flat.size, math.exp(-rate))
    pos = flat > 0
    if pos.any():
        out[pos] = np.exp(_log_prefactor(flat[pos], np.full(int(pos.sum()), float(rate))))
    return out.reshape(ka.shape)


def distinct_sorted(x: ArrayLike) -> Arr:
    """The distinct values of ``x`` (1-D, no NaN) in ascending order: ``np.unique(x)``'s
    values, by a sort and a comparison of neighbours (what it does for such an array)."""
    s = np.sort(np.asarray(x, dtype=np.float64).ravel())
    keep = np.ones(s.shape, dtype=bool)
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]
