"""The discrete-event simulator: exact step table, hand-checked runs, and the analytic model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hardware.device import load_device
from perfmodel import queueing as q
from perfmodel.batch import Batch
from perfmodel.model import load_model
from perfmodel.parallel import ParallelPlan
from perfmodel.simulate import make_setup, saturation_rate_per_s, simulate, simulate_workload
from perfmodel.step import step_time
from perfmodel.steptable import build_step_table, random_batches
from perfmodel.workload import Workload, load_trace, preset

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "azure-llm-2023"
M8 = load_model("llama-3.1-8b")
H100 = load_device("h100-sxm")


@pytest.mark.parametrize(
    ("mid", "dev", "tp"),
    [
        ("llama-3.1-8b", "h100-sxm", 1),
        ("mixtral-8x7b", "a100-sxm-80gb", 2),
        ("deepseek-v3", "h200-sxm", 8),
    ],
)
def test_step_table_equals_step_time(mid: str, dev: str, tp: int) -> None:
    m, d, plan = load_model(mid), load_device(dev), ParallelPlan(tp=tp)
    table = build_step_table(m, d, plan, 4096)
    assert table.exact
    b = random_batches(4096, 200, np.random.default_rng(11))
    ref = step_time(m, d, b, plan=plan).total_s
    assert np.allclose(table.batch_time_s(b), ref, rtol=1e-9)


def test_lone_request_hand_checked() -> None:
    """One request (100 in, 3 out): TTFT = its prefill step; then decodes at 100 and 101."""
    table = build_step_table(M8, H100, ParallelPlan(), 512)
    r = simulate(
        table,
        arrival_s=[0.5],
        input_tokens=[100],
        output_tokens=[3],
        kv_capacity_tokens=10_000,
        max_batched_tokens=512,
    )
    pre = float(step_time(M8, H100, Batch.prefill(1, 100)).total_s)
    d0 = float(step_time(M8, H100, Batch.decode(1, 100)).total_s)
    d1 = float(step_time(M8, H100, Batch.decode(1, 101)).total_s)
    assert r.ttft_s[0] == pytest.approx(pre, rel=1e-9)
    assert r.e2e_s[0] == pytest.approx(pre + d0 + d1, rel=1e-9)
    assert r.tpot_s[0] == pytest.approx((d0 + d1) / 2, rel=1e-9)
    assert r.iterations == 3


def test_chunked_prefill_and_rejection() -> None:
    table = build_step_table(M8, H100, ParallelPlan(), 256)
    r = simulate(
        table,
        arrival_s=[0.0, 0.0],
        input_tokens=[600, 5_000],
        output_tokens=[1, 1],
        kv_capacity_tokens=4_000,
        max_batched_tokens=256,
    )
    assert r.rejected == 1  # 5,001 tokens can never fit in 4,000
    assert r.iterations == 3  # 600 tokens in chunks of 256, 256, 88
    chunks = [Batch.prefill(1, c, ctx) for c, ctx in ((256, 0), (256, 256), (88, 512))]
    want = sum(float(step_time(M8, H100, b).total_s) for b in chunks)
    assert r.ttft_s[0] == pytest.approx(want, rel=1e-9)


def test_preemption_keeps_everything_finishing() -> None:
    """A KV cache far too small for the decode growth forces recompute preemptions."""
    table = build_step_table(M8, H100, ParallelPlan(), 2048)
    rng = np.random.default_rng(5)
    n = 300
    r = simulate(
        table,
        arrival_s=np.zeros(n),
        input_tokens=rng.integers(100, 400, n),
        output_tokens=rng.integers(50, 300, n),
        kv_capacity_tokens=6_000,
        max_batched_tokens=2048,
    )
    assert r.preemptions > 0
    assert r.completed.all()
    assert (r.kv_used_tokens <= 6_000).all()


# (model, device, tp, workload, kv override): compute- and memory-bound cases
CONFIGS = [
    ("llama-3.1-8b", "h100-sxm", 1, "chat", None),
    ("llama-3.1-8b", "h100-sxm", 1, "code", None),
    ("mixtral-8x7b", "a100-sxm-80gb", 2, "chat", None),
    ("llama-3.1-8b", "a100-sxm-80gb", 1, "chat", 60_000),
]


@pytest.mark.parametrize(("mid", "dev", "tp", "wl", "kv"), CONFIGS)
def test_analytic_rate_within_10pct_of_simulated(
    mid: str, dev: str, tp: int, wl: str, kv: int | None
) -> None:
    m, d, plan, w = load_model(mid), load_device(dev), ParallelPlan(tp=tp), preset(wl)
    sr = q.service_rate(m, d, plan, w, kv_capacity_tokens=kv)
    setup = make_setup(
        m, d, plan, kv_capacity_tokens=sr.kv_capacity_tokens, max_batched_tokens=8192
    )
    sat = saturation_rate_per_s(setup, w.lengths, n_requests=2500, seed=2)
    assert sr.rate_per_s == pytest.approx(sat, rel=0.10)
    if kv is not None:
        assert sr.binding == "memory"


@pytest.mark.parametrize(
    ("mid", "dev", "tp", "wl"),
    [
        ("llama-3.1-8b", "h100-sxm", 1, "chat"),
        ("mixtral-8x7b", "a100-sxm-80gb", 2, "chat"),
        ("llama-3.1-8b", "h100-sxm", 1, "code"),
    ],
)
def test_mean_latency_within_20pct_at_half_load(mid: str, dev: str, tp: int, wl: str) -> None:
    m, d, plan, w = load_model(mid), load_device(dev), ParallelPlan(tp=tp), preset(wl)
    sr = q.service_rate(m, d, plan, w)
    lam = 0.5 * sr.rate_per_s
    est = q.latency(sr, lam)
    setup = make_setup(
        m, d, plan, kv_capacity_tokens=sr.kv_capacity_tokens, max_batched_tokens=8192
    )
    r = simulate_workload(setup, w.lengths, w.arrivals(lam), n_requests=3000, seed=4)
    assert est.ttft_mean_s == pytest.approx(r.ttft().mean_s, rel=0.2)
    assert est.tpot_mean_s == pytest.approx(r.tpot().mean_s, rel=0.2)


def test_queue_grows_only_above_the_predicted_rate() -> None:
    m, d, plan, w = M8, H100, ParallelPlan(), preset("chat")
    sr = q.service_rate(m, d, plan, w, kv_capacity_tokens=100_000)
    setup = make_setup(m, d, plan, kv_capacity_tokens=100_000, max_batched_tokens=8192)
    # memory-bound here; the analytic rate is ~16 % above the simulated one (see report)
    below = simulate_workload(
        setup, w.lengths, w.arrivals(0.7 * sr.rate_per_s), n_requests=3000, seed=8
    )
    above = simulate_workload(
        setup, w.lengths, w.arrivals(1.1 * sr.rate_per_s), n_requests=3000, seed=8
    )
    assert above.queue_growth_per_s() > 0.1 * sr.rate_per_s
    assert below.queue_growth_per_s() < 0.01 * sr.rate_per_s


@pytest.mark.parametrize("file", ["conv.csv", "code.csv"])
def test_azure_replay(file: str) -> None:
    """1× replay: kept up on 1× H100 (8B); predicted unstable on 2× A100 (70B) and it is."""
    if not (DATA / file).exists():
        pytest.skip("../shared/data/azure-llm-2023 not present")
    tr = load_trace(DATA / file)
    w = Workload.from_trace(tr)
    ok = q.service_rate(M8, H100, ParallelPlan(), w)
    assert q.stability(ok, tr.rate_per_s).stable
    setup = make_setup(
        M8, H100, ParallelPlan(), kv_capacity_tokens=ok.kv_capacity_tokens, max_batched_tokens=8192
    )
    r = simulate(
        setup.table,
        arrival_s=tr.replay_times_s(1.0),
        input_tokens=tr.input_tokens,
        output_tokens=tr.output_tokens,
        kv_capacity_tokens=setup.kv_capacity_tokens,
        max_batched_tokens=8192,
    )
    assert r.completed.all()
    # keeps up: no net queue growth, done within a minute of the last arrival (the code
    # trace's bursts -- inter-arrival CV 13 -- still give multi-second p99 TTFT)
    assert abs(r.queue_growth_per_s()) < 0.01
    assert r.end_s < tr.duration_s + 60
    assert r.ttft().p50_s < 0.5
    m70, a100, p2 = load_model("llama-3.1-70b"), load_device("a100-sxm-80gb"), ParallelPlan(tp=2)
    bad = q.service_rate(m70, a100, p2, w)
    assert not q.stability(bad, tr.rate_per_s).stable
    s2 = make_setup(
        m70, a100, p2, kv_capacity_tokens=bad.kv_capacity_tokens, max_batched_tokens=8192
    )
    n = 2500
    r2 = simulate(
        s2.table,
        arrival_s=tr.replay_times_s(1.0)[:n],
        input_tokens=tr.input_tokens[:n],
        output_tokens=tr.output_tokens[:n],
        kv_capacity_tokens=s2.kv_capacity_tokens,
        max_batched_tokens=8192,
    )
    assert r2.queue_growth_per_s() > 0.2 * (tr.rate_per_s - bad.rate_per_s)
    assert r2.queue_len.max() > 100
