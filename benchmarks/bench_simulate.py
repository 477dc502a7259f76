"""Simulator speed: 100,000 requests per configuration and load (prints wall time).

Each run is timed with the decode-only skip-ahead (the default) and without it (every
iteration stepped); both give the same per-request times.

python benchmarks/bench_simulate.py
"""

from __future__ import annotations

import time

from hardware.device import load_device
from perfmodel.model import load_model
from perfmodel.plan import ParallelPlan
from perfmodel.serving import service as q
from perfmodel.sim.simulate import make_setup, simulate_workload
from perfmodel.step.instance import Instance
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


if __name__ == "__main__":
    main()
