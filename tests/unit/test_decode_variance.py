"""The variance of a request's decode time (perfmodel.serving.tagged.decode_variance)
against the same sums over a dense transition matrix.

Mixtral-8x7B on 2×H100 (TensorRT-LLM), chat at ρ = 0.9: the chain has ~900 states, its
autocovariance ~270 lags. The autocovariance was once propagated forward, ``(π∘f̃)·T^k``,
through the law propagator, whose clip of FFT round-off below zero also cut the signed
vector's negative parts: 2.4 % of ``c₀`` off at some lags and the variance of 150 steps'
sum 7.5 % low (0.646 s² instead of 0.699 s²)."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.typing import NDArray

from hardware.device import load_device
from hardware.engine import engine_for
from perfmodel.model import load_model
from perfmodel.plan import ParallelPlan
from perfmodel.serving import service as q
from perfmodel.serving.operating_point import OperatingPoint
from perfmodel.serving.tagged import (
    decode_variance,
    start_dispersion,
    step_autocovariance,
    sum_variance,
)
from perfmodel.step.instance import Instance
from perfmodel.workload.presets import preset


@pytest.fixture(scope="module")
def point() -> tuple[OperatingPoint, NDArray[np.float64]]:
    dev = load_device("h100-sxm")
    inst = Instance(
        load_model("mixtral-8x7b"), dev, ParallelPlan(tp=2), engine=engine_for("auto", dev)
    )
    sv = q.service_rate(inst, preset("chat"), max_batched_tokens=2048)
    op = q.latency(sv, 0.9 * sv.rate_per_s).point
    assert op is not None
    chain = op.chain
    dense = chain.transition(np.eye(chain.states))  # rows e_i·T: laws, exact
    return op, dense


def test_autocovariance_matches_the_dense_chain(
    point: tuple[OperatingPoint, NDArray[np.float64]],
) -> None:
    op, T = point
    pi, tau = op.chain.stationary, op.decode_step_s
    f = tau - pi @ tau
    c = step_autocovariance(op.chain, tau)
    assert 100 < c.size < 400  # followed until |c_k| <= 1e-4 c_0, not cut at the cap
    v, dense = f.copy(), [float((pi * f) @ f)]
    for _ in range(1, c.size):
        v = T @ v
        dense.append(float((pi * f) @ v))
    assert np.max(np.abs(c - np.array(dense))) <= 1e-9 * dense[0]
    assert abs(c[-1]) <= 1e-4 * c[0] < abs(c[-2])


def test_dispersion_matches_the_dense_chain(
    point: tuple[OperatingPoint, NDArray[np.float64]],
) -> None:
    op, T = point
    pi, tau, xi = op.chain.stationary, op.decode_step_s, op.tagged.start_law
    steps = np.array([1.0, 10.0, 50.0, 150.0])
    h, g, dense = np.zeros_like(tau), tau.copy(), []
    for n in range(1, 151):
        h = h + g
        if n in steps:
            dense.append((xi @ h**2 - (xi @ h) ** 2) - (pi @ h**2 - (pi @ h) ** 2))
        g = T @ g
    got = start_dispersion(op.chain, xi, tau, steps)
    assert got == pytest.approx(dense, rel=1e-8, abs=1e-12)


def test_decode_variance_is_both_terms(point: tuple[OperatingPoint, NDArray[np.float64]]) -> None:
    op, _ = point
    ch, tau, xi = op.chain, op.decode_step_s, op.tagged.start_law
    steps = np.array([1.0, 3.0, 40.0, 150.0, 900.0])
    both = decode_variance(ch, xi, tau, steps)
    apart = sum_variance(step_autocovariance(ch, tau), steps) + start_dispersion(ch, xi, tau, steps)
    assert np.array_equal(both, apart)
    # the stationary sum of 150 steps: 0.699 s² here (the forward propagation gave 0.646)
    assert sum_variance(step_autocovariance(ch, tau), np.array([150.0]))[0] == pytest.approx(
        0.6989, rel=2e-3
    )
