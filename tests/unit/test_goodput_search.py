"""The goodput search (false position on the miss probability) and the FFT lengths."""

from __future__ import annotations

import pytest

from hardware.device import load_device
from perfmodel.model import load_model
from perfmodel.serving import goodput as q_goodput
from perfmodel.serving import service as q
from perfmodel.serving.compound_poisson import fft_size
from perfmodel.step.instance import Instance
from perfmodel.workload.presets import preset
from perfmodel.workload.slo import SLO


@pytest.fixture(scope="module")
def chat_rate() -> q.ServiceRate:
    inst = Instance(load_model("llama-3.1-8b"), load_device("h100-sxm"))
    return q.service_rate(inst, preset("chat"))


@pytest.mark.parametrize(
    ("ttft_s", "tpot_s", "goal"), [(0.5, 0.05, 0.9), (1.0, 0.03, 0.99), (0.2, 0.05, 0.5)]
)
def test_goodput_meets_and_a_rate_tol_above_fails(
    chat_rate: q.ServiceRate,
    monkeypatch: pytest.MonkeyPatch,
    ttft_s: float,
    tpot_s: float,
    goal: float,
) -> None:
    """The bisection's guarantee with fewer estimates: the answer meets the goal, the
    first failing rate is within rel_tol·μ above it, in at most 8 estimates (halving
    [μ·1e-4, μ] to 1e-3·μ takes 10, plus the one at μ·1e-4)."""
    calls: list[float] = []
    real = q_goodput.latency

    def counted(sr: q.ServiceRate, rate: float, **kw: object) -> object:
        calls.append(rate)
        return real(sr, rate, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(q_goodput, "latency", counted)
    slo = SLO(ttft_s=ttft_s, tpot_s=tpot_s, percentile=0.9, goal=goal)
    g = q_goodput.goodput(chat_rate, slo, rel_tol=1e-3)
    mu = chat_rate.rate_per_s
    assert g.feasible and g.at_goodput is not None and g.at_goodput.attainment >= goal
    assert len(calls) <= 8
    # every evaluated rate above the answer failed, and one lies within 1e-3·μ of it
    above = [r for r in calls if r > g.rate_per_s]
    nearest = min([*above, mu])
    assert nearest - g.rate_per_s <= 1e-3 * mu * (1 + 1e-9)
    monkeypatch.setattr(q_goodput, "latency", real)
    fails = q_goodput.slo_attainment(q.latency(chat_rate, nearest), slo) if nearest < mu else None
    assert fails is None or not fails.meets_goal


def _smooth(m: int) -> bool:
    for p in (2, 3, 5):
        while m % p == 0:
            m //= p
    return m == 1


def test_fft_size_is_the_smallest_5_smooth_length() -> None:
    for n in range(1, 3000):
        s = fft_size(n)
        assert s >= n and _smooth(s)
        assert not any(_smooth(k) for k in range(n, s))
    assert fft_size(1026) == 1080  # 2·(32·16 + 1) states: 2048 as a power of two
