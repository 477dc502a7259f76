"""The recommended fleet meets its SLO in the discrete-event simulator (dense, MoE, PD),
and a heterogeneous fleet that beats every single device type, with the reason.

Consistency with the project's own simulator, not validation against real engines. Every
case is planned at headroom 1 (the planned rate is the simulated rate): the latency
percentiles agree with the simulator (``benchmarks/validate_percentiles.py``: p90 TTFT and
TPOT within 9 % at ρ ≤ 0.7) and the PD phases are each sized to ``√goal`` so that the
joint attainment meets the goal. Before those fixes the dense and PD cases needed 15-20 %
headroom (Llama-3.1-8B on one H100 at 22.8 req/s: 97.2 % predicted, 83.2 % simulated;
Llama-3.1-70B PD on MI300X: 81.6 % simulated).
"""

from __future__ import annotations

import pytest

from hardware.device import load_device
from perfmodel.cost.prices import catalog_prices
from perfmodel.model import load_model
from perfmodel.workload.slo import SLO
from solvers.fleet.candidates import planning_workload
from solvers.fleet.plan import PlanInputs, plan_fleet
from solvers.fleet.verify import verify_fleet

pytestmark = pytest.mark.slow
SLO_CHAT = SLO(1.0, 0.05, 0.9, 0.9)


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PERFMODEL_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "plan-cache"))


def _plan(
    model: str, devices: list[str], rate: float, *, pd: bool, headroom: float, buckets: int = 1
) -> tuple:
    devs = tuple(load_device(d) for d in devices)
    inp = PlanInputs(
        load_model(model), planning_workload("chat"), SLO_CHAT, rate, devs,
        catalog_prices(devs), allow_pd=pd, headroom=headroom, buckets=buckets,
    )  # fmt: skip
    return verify_fleet(plan_fleet(inp), inp), inp


def _meets(result) -> None:  # type: ignore[no-untyped-def]
    assert result.verification
    for v in result.verification:
        assert v.simulated_attainment >= SLO_CHAT.goal, v.summary


def test_dense_heterogeneous_fleet_beats_every_single_type_and_meets_slo() -> None:
    # 72 req/s: 3 H100 and an A100 for the remainder beat 4 H100
    r, _ = _plan("llama-3.1-8b", ["h100-sxm", "a100-sxm-80gb", "l40s"], 72.0,
                 pd=False, headroom=1.0)  # fmt: skip
    rec = r.recommendation
    assert len(rec.device_types) > 1, rec.summary
    cost = rec.economics.cost_per_hour_usd
    for t, alt in r.best_single_device.items():
        assert alt.fleet is not None
        assert cost < alt.fleet.economics.cost_per_hour_usd - 1e-6, (t, alt.fleet.summary)
    why = " ".join(r.why)
    assert "less than the best single-type fleet" in why and "remainder" in why
    _meets(r)


def test_moe_fleet_meets_slo_in_simulation() -> None:
    r, _ = _plan("mixtral-8x7b", ["h100-sxm", "h200-sxm", "mi300x"], 40.0, pd=False,
                 headroom=1.0)  # fmt: skip
    assert load_model("mixtral-8x7b").is_moe
    _meets(r)


def test_pd_fleet_meets_slo_in_simulation() -> None:
    # 40 req/s: 14 TP1 prefill + a TP4 decode (with 2 colocated TP1) simulate at 94-95 %
    # over three seeds; at 50 req/s the TP2 decode the plan picks sits where TPOT is
    # steep in the batch and the simulated attainment spreads 87-93 % across seeds
    r, _ = _plan("llama-3.1-70b", ["mi300x"], 40.0, pd=True, headroom=1.0)
    assert r.recommendation.disaggregated
    _meets(r)


def test_size_buckets_route_short_requests_to_the_cheap_device() -> None:
    # Mélange's idea with queueing: three input-length buckets; the short prompts go
    # mostly to L40S, the long ones to H100, and every pool meets the goal in simulation
    # with no headroom (the L40S pool sees only short requests).
    r, _ = _plan("llama-3.1-8b", ["h100-sxm", "a100-sxm-80gb", "l40s"], 120.0, pd=False,
                 headroom=1.0, buckets=3)  # fmt: skip
    rec = r.recommendation
    assert set(rec.device_types) == {"h100-sxm", "l40s"}, rec.summary
    cost = rec.economics.cost_per_hour_usd
    for alt in r.best_single_device.values():
        assert alt.fleet is not None and cost < alt.fleet.economics.cost_per_hour_usd
    l40s = next(p for p in rec.pools if p.candidate.device.id == "l40s")
    h100 = next(p for p in rec.pools if p.candidate.device.id == "h100-sxm")
    shortest = min(
        (b for b, _ in l40s.buckets + h100.buckets), key=lambda b: int(b.split()[1].split("-")[0])
    )
    assert dict(l40s.buckets).get(shortest, 0.0) > 0.5  # most short requests on L40S
    assert dict(h100.buckets).get(shortest, 0.0) < 0.5
    assert len(h100.buckets) > len(l40s.buckets)  # the longer buckets only on H100
    assert any("of input" in w and "go to" in w for w in r.why)
    _meets(r)
