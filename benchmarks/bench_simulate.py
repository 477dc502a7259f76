"""Simulator speed: 100,000 requests per configuration and load (prints wall time).

Each run is timed with the decode-only skip-ahead (the default) and without it (every
iteration stepped); both give the same per-request times. ``--engine`` instead times the
engine loop alone (``run_engine`` on pre-sampled requests) in iterations per second,
beside a bare ``heapq`` event loop (one pop and one push per event, the floor of any
Python discrete-event loop) measured in the same run: best of 5 rounds, each the bare
loop then every case, timed in CPU seconds (wall beside), so that other processes on a
shared machine slow both alike. Each line also gives the engine's rate in events (its
iterations, arrivals and completions, what a discrete-event loop of the engine would pop):
at high load a request's arrival and completion are as frequent as iterations.

python benchmarks/bench_simulate.py [--engine]
"""

from __future__ import annotations

import heapq
import math
import random
import sys
import time
from collections.abc import Callable

import numpy as np

from hardware.device import load_device
from perfmodel.model import load_model
from perfmodel.plan import ParallelPlan
from perfmodel.serving import service as q
from perfmodel.serving.servemix import DEFAULT_WATERMARK
from perfmodel.sim.engine import run_engine
from perfmodel.sim.engine_state import EngineState
from perfmodel.sim.simulate import make_setup, simulate_workload
from perfmodel.step.instance import Instance
from perfmodel.step.table import build_step_table
from perfmodel.workload.presets import preset

N = 100_000


def main() -> None:
    for mid, dev, tp in (("llama-3.1-8b", "h100-sxm", 1), ("mixtral-8x7b", "a100-sxm-80gb", 2)):
        for wl in ("chat", "code"):
            m, d, plan, w = load_model(mid), load_device(dev), ParallelPlan(tp=tp), preset(wl)
            sr = q.service_rate(Instance(m, d, plan), w)
            t0 = time.perf_counter()
            setup = make_setup(
                Instance(m, d, plan),
                kv_capacity_tokens=sr.kv_capacity_tokens,
                max_batched_tokens=8192,
            )
            t_table = time.perf_counter() - t0
            for u in (0.3, 0.8, 1.2):
                dt = {}
                for skip in (True, False):
                    t0 = time.perf_counter()
                    r = simulate_workload(
                        setup,
                        w.lengths,
                        w.arrivals(u * sr.rate_per_s),
                        n_requests=N,
                        seed=0,
                        skip_ahead=skip,
                    )
                    dt[skip] = time.perf_counter() - t0
                print(
                    f"{mid:14s} {tp}x{dev:14s} {wl:4s} ρ={u:.1f}: {N} requests, "
                    f"{r.iterations:>9,} iterations in {dt[True]:5.2f} s with skip-ahead, "
                    f"{dt[False]:5.2f} s without ({dt[False] / r.iterations * 1e6:4.1f} "
                    f"µs/iteration; table {t_table * 1e3:.0f} ms)"
                )


def bare_event_loop_s(events: int = 1_000_000, pending: int = 64) -> tuple[float, float]:
    """(CPU, wall) seconds of a bare heapq loop: pop the next event, push its successor."""
    rng = random.Random(0)
    heap = [(rng.random(), i) for i in range(pending)]
    heapq.heapify(heap)
    pop, push, rnd = heapq.heappop, heapq.heappush, rng.random
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(events):
        t, i = pop(heap)
        push(heap, (t + rnd(), i))
    return time.process_time() - c0, time.perf_counter() - w0


def engine_cases(n_requests: int = 20_000) -> list[tuple[str, Callable[[], EngineState], bool]]:
    """(case, a fresh engine state, skip-ahead) for Llama-3.1-8B on one H100, chat."""
    m, d, plan, w = (
        load_model("llama-3.1-8b"),
        load_device("h100-sxm"),
        ParallelPlan(tp=1),
        preset("chat"),
    )
    inst = Instance(m, d, plan)
    sr = q.service_rate(inst, w)
    M, B = sr.kv_capacity_tokens, 8192
    table = build_step_table(inst, B)
    out = []
    for u in (0.3, 0.8):
        rng = np.random.default_rng(0)
        s_in, o_out = w.lengths.sample(n_requests, rng)
        arr = w.arrivals(u * sr.rate_per_s).times_s(n_requests, rng)

        def state(
            arr: np.ndarray = arr, s_in: np.ndarray = s_in, o_out: np.ndarray = o_out
        ) -> EngineState:
            return EngineState(
                table, arr, s_in, o_out, kv_capacity_tokens=M, max_batched_tokens=B,
                chunk_size=B, reserve_tokens=int(DEFAULT_WATERMARK * M),
                max_time_s=float("inf"), queue_samples=2000,
            )  # fmt: skip

        for skip in (True, False):
            out.append((f"ρ={u:.1f} {'skip-ahead' if skip else 'every iteration'}", state, skip))
    return out


def engine_report(repeats: int = 5) -> None:
    """Best of ``repeats`` rounds, each the bare loop then every case (interleaved, so a
    busy machine slows both alike); rates from CPU time, wall time beside."""
    cases = engine_cases()
    bare = (math.inf, math.inf)
    best: dict[str, tuple[float, float, int, int]] = {}
    for _ in range(repeats):
        b = bare_event_loop_s()
        bare = (min(bare[0], b[0]), min(bare[1], b[1]))
        for case, state, skip in cases:
            e = state()  # the state's construction is not timed (it converts the inputs)
            c0, w0 = time.process_time(), time.perf_counter()
            r = run_engine(e, skip_ahead=skip)
            cpu, wall = time.process_time() - c0, time.perf_counter() - w0
            old = best.get(case, (math.inf, math.inf, 0, 0))
            events = r.iterations + e.n + int(np.isfinite(r.finish_s).sum())
            best[case] = (min(old[0], cpu), min(old[1], wall), r.iterations, events)
    per_event = bare[0] / 1e6
    print(
        f"bare heapq event loop: {1e6 / bare[0] / 1e6:.2f} M events/s CPU "
        f"({1e6 / bare[1] / 1e6:.2f} M/s wall; best of {repeats})"
    )
    for case, (cpu, wall, its, events) in best.items():
        print(
            f"run_engine llama-3.1-8b 1xh100-sxm chat {case}: {its / cpu / 1e6:.2f} M iterations/s "
            f"CPU ({cpu / its / per_event:.1f}x the bare loop's time per event; wall "
            f"{its / wall / 1e6:.2f} M/s, {wall / its / (bare[1] / 1e6):.1f}x; "
            f"{events / its:.2f} events/iteration: {cpu / events / per_event:.1f}x per event)"
        )


if __name__ == "__main__":
    engine_report() if "--engine" in sys.argv else main()
