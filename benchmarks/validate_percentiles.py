"""p90 TTFT and TPOT: analytic latency model vs the discrete-event simulator.

Issue 12 item 5 / issue 16: the latency percentiles must agree with the simulator
(p90 TPOT within 10 % below 80 % utilization) so that a plan made at headroom 1 meets
its SLO when simulated. Configurations as the planner builds them (chunked prefill,
``--max-batched-tokens`` 8192, the engine KV capacity): a dense model on two devices
and a MoE model (full-resolution preset lengths), Poisson arrivals at ρ = 0.3, 0.5, 0.7
of μ, on chat and code. Each simulated value pools ``--seeds`` runs of ``--requests``
requests, the first 10 % of arrivals dropped (warm-up).

    python benchmarks/validate_percentiles.py [--requests N] [--seeds K] [--workload W]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from hardware.device import load_device
from perfmodel.model import load_model
from perfmodel.plan import ParallelPlan
from perfmodel.serving import service as q
from perfmodel.sim.simulate import make_setup, simulate_workload
from perfmodel.step.instance import Instance
from perfmodel.units import MS_PER_S
from perfmodel.workload.presets import preset

CONFIGS = [
    ("llama-3.1-70b", "h100-sxm", 4),
    ("llama-3.1-70b", "mi300x", 8),
    ("mixtral-8x7b", "h100-sxm", 2),
]
LOADS = (0.3, 0.5, 0.7)
BUDGET = 8192
WARMUP = 0.1


def _p90s(runs: list) -> tuple[float, float]:
    ttft, tpot = [], []
    for r in runs:
        keep = r.arrival_s >= WARMUP * r.arrival_s[-1]
        ttft.append((r.first_token_s - r.arrival_s)[keep])
        multi = keep & (r.output_tokens >= 2)
        tpot.append(((r.finish_s - r.first_token_s) / np.maximum(r.output_tokens - 1, 1))[multi])
    return float(np.quantile(np.concatenate(ttft), 0.9)), float(
        np.quantile(np.concatenate(tpot), 0.9)
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=8000)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--workload", default="chat,code", help="comma-separated presets")
    args = ap.parse_args()
    t0 = time.time()
    print(f"p90 analytic / simulated, {args.seeds} seeds x {args.requests} requests, Poisson")
    print(
        f"{'config':40s} {'ρ':>4s} {'TTFT p90 ms':>17s} {'err':>7s} {'TPOT p90 ms':>15s} "
        f"{'err':>7s}"
    )
    worst_tpot = worst_ttft = 0.0
    for wl, (mid, dev, tp) in ((a, c) for a in args.workload.split(",") for c in CONFIGS):
        w = preset(wl)
        inst = Instance(load_model(mid), load_device(dev), ParallelPlan(tp=tp))
        sr = q.service_rate(inst, w, max_batched_tokens=BUDGET)
        setup = make_setup(
            inst,
            kv_capacity_tokens=sr.engine_kv_capacity_tokens,
            max_batched_tokens=sr.max_batched_tokens,
            chunk_size=sr.chunk_size,
        )
        for u in LOADS:
            lam = u * sr.rate_per_s
            est = q.latency(sr, lam)
            runs = [
                simulate_workload(setup, w.lengths, w.arrivals(lam), n_requests=args.requests,
                                  seed=11 + k)
                for k in range(args.seeds)
            ]  # fmt: skip
            ttft90, tpot90 = _p90s(runs)
            e1 = est.ttft_p90_s / ttft90 - 1
            e2 = est.tpot_p90_s / tpot90 - 1
            worst_ttft, worst_tpot = max(worst_ttft, abs(e1)), max(worst_tpot, abs(e2))
            print(
                f"{f'{mid} {tp}x{dev} {wl}':40s} {u:4.1f} "
                f"{est.ttft_p90_s * MS_PER_S:8.1f}/{ttft90 * MS_PER_S:8.1f} {e1:+7.1%} "
                f"{est.tpot_p90_s * MS_PER_S:7.2f}/{tpot90 * MS_PER_S:7.2f} {e2:+7.1%}"
            )
    print(f"worst |err| p90 TTFT {worst_ttft:.1%}, p90 TPOT {worst_tpot:.1%} (ρ ≤ 0.7)")
    print(f"total {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
