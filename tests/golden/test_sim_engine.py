"""The simulator's engine after its split into admit / schedule / step / skip-ahead: the
same numbers, bit for bit, as the single-function loop it replaced.

GOLDEN was recorded with that loop (``run_engine`` as one 318-line function, before the
split) on the scenarios below: steady chat traffic, recompute preemptions in a small KV
cache, a small token budget with tiny chunks, a time limit cutting the run, and a burst at
t = 0. Every recorded value is compared with a relative tolerance of 1e-12 (the float
operations are the same, in the same order), with and without the decode-only skip-ahead.
"""

import math

import numpy as np
import pytest

from hardware.device import load_device
from perfmodel.model import load_model
from perfmodel.plan import ParallelPlan
from perfmodel.sim.simulate import simulate
from perfmodel.step.instance import Instance
from perfmodel.step.table import build_step_table
from perfmodel.workload.presets import preset

# name: (workload, requests, rate req/s (0: all at t = 0), KV tokens, budget B, chunk C, limit s)
SCENARIOS = {
    "chat_mid": ("chat", 3000, 20.0, 400_000, 512, 512, math.inf),
    "chat_preempt": ("chat", 2000, 40.0, 30_000, 512, 256, math.inf),
    "code_budget_128": ("code", 2000, 80.0, 2_000_000, 128, 64, math.inf),
    "chat_small_budget": ("chat", 300, 50.0, 2_000_000, 32, 4, math.inf),
    "chat_tmax": ("chat", 3000, 60.0, 200_000, 512, 512, 30.0),
    "burst_t0": ("chat", 1500, 0.0, 120_000, 512, 512, math.inf),
}

GOLDEN = {
    "chat_mid": {
        "iterations": 11074,
        "preemptions": 0,
        "rejected": 0,
        "busy_s": 155.47664274786825,
        "end_s": 155.71985222217774,
        "n_first": 3000,
        "n_finish": 3000,
        "sum_first": 225905.6826286243,
        "sum_finish": 235034.56349683515,
        "max_finish": 155.71985222217774,
        "n_queue": 11074,
        "sum_queue_t": 869499.5759560595,
        "sum_queue_len": 30418,
        "sum_kv": 813096762,
    },
    "chat_preempt": {
        "iterations": 19315,
        "preemptions": 5004,
        "rejected": 0,
        "busy_s": 218.40556592842583,
        "end_s": 218.4249188693515,
        "n_first": 2000,
        "n_finish": 2000,
        "sum_first": 212096.72262965405,
        "sum_finish": 216864.79249803512,
        "max_finish": 218.4249188693515,
        "n_queue": 19315,
        "sum_queue_t": 2123275.032075964,
        "sum_queue_len": 14188649,
        "sum_kv": 552405510,
    },
    "code_budget_128": {
        "iterations": 31226,
        "preemptions": 0,
        "rejected": 0,
        "busy_s": 247.5974988096001,
        "end_s": 247.6071752800629,
        "n_first": 2000,
        "n_finish": 2000,
        "sum_first": 246090.35725236568,
        "sum_finish": 246510.11411012887,
        "max_finish": 247.6071752800629,
        "n_queue": 31226,
        "sum_queue_t": 3870522.8456886956,
        "sum_queue_len": 27738223,
        "sum_kv": 236919178,
    },
    "chat_small_budget": {
        "iterations": 12564,
        "preemptions": 0,
        "rejected": 0,
        "busy_s": 98.31633283228669,
        "end_s": 98.31754198736158,
        "n_first": 300,
        "n_finish": 300,
        "sum_first": 14095.449640670742,
        "sum_finish": 14578.675282324428,
        "max_finish": 98.31754198736158,
        "n_queue": 12564,
        "sum_queue_t": 617349.8891026196,
        "sum_queue_len": 1597732,
        "sum_kv": 167193544,
    },
    "chat_tmax": {
        "iterations": 1793,
        "preemptions": 0,
        "rejected": 0,
        "busy_s": 29.932701514728464,
        "end_s": 30.013771339498305,
        "n_first": 706,
        "n_finish": 624,
        "sum_first": 10162.93027219566,
        "sum_finish": 9964.241204344065,
        "max_finish": 29.996497108853582,
        "n_queue": 1793,
        "sum_queue_t": 26108.13213932084,
        "sum_queue_len": 935547,
        "sum_kv": 171517060,
    },
    "burst_t0": {
        "iterations": 4730,
        "preemptions": 1,
        "rejected": 0,
        "busy_s": 72.23601315820156,
        "end_s": 72.23601315820156,
        "n_first": 1500,
        "n_finish": 1500,
        "sum_first": 47624.403611276255,
        "sum_finish": 52818.14499559762,
        "max_finish": 72.23601315820156,
        "n_queue": 4730,
        "sum_queue_t": 184796.529277758,
        "sum_queue_len": 2838516,
        "sum_kv": 403412323,
    },
}


@pytest.fixture(scope="module")
def model_device():  # type: ignore[no-untyped-def]
    return load_model("llama-3.1-8b"), load_device("h100-sxm")


@pytest.mark.parametrize("skip_ahead", [True, False])
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_engine_numbers_unchanged(model_device, name: str, skip_ahead: bool) -> None:  # type: ignore[no-untyped-def]
    m, d = model_device
    wl, n, rate, M, B, C, tmax = SCENARIOS[name]
    w = preset(wl)
    rng = np.random.default_rng(11)
    s, o = w.lengths.sample(n, rng)
    arr = w.arrivals(rate).times_s(n, rng) if rate > 0 else np.zeros(n)
    r = simulate(
        build_step_table(Instance(m, d, ParallelPlan(tp=1)), B),
        arrival_s=arr,
        input_tokens=s,
        output_tokens=o,
        kv_capacity_tokens=M,
        max_batched_tokens=B,
        chunk_size=C,
        max_time_s=tmax,
        skip_ahead=skip_ahead,
    )
    ft, fi = r.first_token_s, r.finish_s
    ok_f, ok_i = np.isfinite(ft), np.isfinite(fi)
    got = dict(
        iterations=r.iterations,
        preemptions=r.preemptions,
        rejected=r.rejected,
        busy_s=r.busy_s,
        end_s=r.end_s,
        n_first=int(ok_f.sum()),
        n_finish=int(ok_i.sum()),
        sum_first=float(ft[ok_f].sum()),
        sum_finish=float(fi[ok_i].sum()),
        max_finish=float(fi[ok_i].max(initial=0.0)),
        n_queue=int(r.queue_t_s.size),
        sum_queue_t=float(r.queue_t_s.sum()),
        sum_queue_len=int(r.queue_len.sum()),
        sum_kv=int(r.kv_used_tokens.sum()),
    )
    want = GOLDEN[name]
    for key, v in want.items():
        assert got[key] == pytest.approx(v, rel=1e-12, abs=0), (name, key)
    assert math.isfinite(r.end_s)
