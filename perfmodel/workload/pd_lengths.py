"""Built-in workloads discretized for the PD planner (the presets and a ShareGPT stand-in)."""

from __future__ import annotations

import math
from functools import cache

from perfmodel.errors import SpecError
from perfmodel.special import ndtr
from perfmodel.workload.lengths import LengthDistribution, TruncLogNormal, lognormal_lengths
from perfmodel.workload.presets import PRESETS

PLANNER_ATOMS = 64  # mid-quantiles per marginal when a preset is discretized for planning


def planner_lengths(name: str, atoms: int = PLANNER_ATOMS) -> LengthDistribution:
    """A built-in workload (``chat``, ``code``, ``sharegpt``) discretized for planning.

    ``chat``/``code`` are the Azure-trace presets of ``perfmodel.workload`` at ``atoms``
    mid-quantiles per marginal. ``sharegpt`` is a parametric stand-in for DistServe's
    ShareGPT set (mean input ≈ 755, mean output ≈ 200 tokens, Zhong et al. OSDI 2024):
    truncated log-normals with the log-spreads of the Azure conversation trace (0.8265,
    0.7728), truncated to OPT's 2048-token context as input ≤ 1536 and output ≤ 512,
    and ``mu`` chosen so the truncated means are 755 and 200.
    """
    if name == "sharegpt":
        return lognormal_lengths(*_sharegpt(), name="sharegpt", n=atoms)
    if name not in PRESETS:
        raise SpecError(f"unknown workload {name!r}; valid: chat, code, sharegpt (or --trace CSV)")
    i, o = PRESETS[name]
    return lognormal_lengths(i, o, name=name, n=atoms)


def _trunc_lognormal_mean(mu: float, sigma: float, lo: int, hi: int) -> float:
    a, b = ((math.log(v) - mu) / sigma for v in (lo, hi))
    z = ndtr(b) - ndtr(a)
    return math.exp(mu + sigma**2 / 2) * (ndtr(b - sigma) - ndtr(a - sigma)) / z


def _fit_mu(mean: float, sigma: float, lo: int, hi: int) -> float:
    from scipy import optimize  # only for sharegpt: ~0.15 s of import

    return float(
        optimize.brentq(lambda mu: _trunc_lognormal_mean(mu, sigma, lo, hi) - mean, 0.0, 12.0)
    )


@cache
def _sharegpt() -> tuple[TruncLogNormal, TruncLogNormal]:
    """The ShareGPT stand-in's input and output marginals (``mu`` fitted when first asked)."""
    return (
        TruncLogNormal(_fit_mu(755.0, 0.8265, 4, 1536), 0.8265, 4, 1536),
        TruncLogNormal(_fit_mu(200.0, 0.7728, 4, 512), 0.7728, 4, 512),
    )
