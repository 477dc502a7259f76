"""The decode-batch noise's slopes (``servemix.decode_sensitivities``) do not take a GEMM
row tile's jump for the cost of one more decoder."""

from __future__ import annotations

import itertools

import numpy as np

from hardware.device import load_device
from hardware.engine import engine_for
from perfmodel.model import load_model
from perfmodel.serving.servemix import decode_sensitivities, noise_coefficient
from perfmodel.serving.service import latency, service_rate
from perfmodel.step.batch import Batch
from perfmodel.step.instance import Instance
from perfmodel.workload.lengths import fixed_lengths
from perfmodel.workload.presets import Workload
from solvers.pd.enumerate import parallel_plan

MODEL = load_model("llama-3.1-8b")
H100 = load_device("h100-sxm")
INST = Instance(MODEL, H100, parallel_plan(1, "bf16", "bf16"), engine=engine_for("auto", H100))


def _decode_s(n: float, ctx: float) -> float:
    return float(INST.iteration_s(Batch.decode(np.array([n]), np.array([ctx])))[0])


def test_one_more_decoder_across_a_row_tile_costs_the_slope_around_it() -> None:
    """511.65 → 512.65 decode rows start a fifth 128-row tile: that step is many times the
    slope around it (a whole tile's compute). The sensitivity there is the step from
    510.65, the slope a few rows off, not the jump."""
    ctx = 190.0
    jump = _decode_s(512.65, ctx * 511.65 / 512.65) - _decode_s(511.65, ctx)
    dn, dk = decode_sensitivities(INST, 511.65, ctx)
    away, _ = decode_sensitivities(INST, 500.0, ctx)
    assert jump > 10 * away > 0
    assert abs(dn / away - 1) < 0.05
    assert dk > 0
    # away from a tile the step up is kept, to the bit
    t = INST.iteration_s(Batch(*[np.zeros(2)] * 4, np.array([500.0, 501.0]),
                               np.array([500 * ctx, 500 * ctx])))  # fmt: skip
    assert away == float(t[1] - t[0])


def test_noise_coefficient_is_the_mean_square_slope() -> None:
    """``E[(a + b·c)²] = a² + 2ab·E[c] + b²·E[c²]``: contexts 100 and 300, equally likely."""
    a, b = 2e-5, 3e-8
    want = 0.5 * ((a + b * 100) ** 2 + (a + b * 300) ** 2)
    assert abs(noise_coefficient(a, b, 200.0, 0.5 * (100**2 + 300**2)) / want - 1) < 1e-12


def test_p90_tpot_stays_above_its_mean_where_the_decoders_cross_a_tile() -> None:
    """159-token prompts, 62-token outputs, TP1 on H100 (compute-bound): at 0.9843-0.9844 μ
    about 511.5 requests decode and one more crosses the 512-row tile. The p90 TPOT was
    26.6 ms there against a 55.8 ms mean (a decode-batch variance of 231 s² from the
    tile's jump) and 59.5 ms at 0.984 μ; it now rises with the rate and stays above the
    mean."""
    sv = service_rate(INST, Workload("f", fixed_lengths(159, 62)), max_batched_tokens=2048)
    rates = [f * sv.rate_per_s for f in (0.984, 0.9843, 0.9844, 0.9846)]
    ests = [latency(sv, r) for r in rates]
    p90 = [e.tpot_quantile_s(0.9) for e in ests]
    assert all(b >= a for a, b in itertools.pairwise(p90))
    assert all(q > e.tpot_mean_s for q, e in zip(p90, ests, strict=True))
