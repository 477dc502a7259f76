"""PD planner benchmark: planning speed and the simulator check of plans.

Run: ``python benchmarks/bench_pd.py [--quick]``. Prints

1. the wall time of a plan for Llama-3.1-70B on H100 (chat, TTFT 1 s / TPOT 50 ms,
   10 req/s; colocated baseline included), best of 3 runs;
2. the simulator check on 2 models × 3 workload/SLO settings: each plan is simulated
   at its design rate (does it meet its p90 TTFT and p90 TPOT targets?) and its
   simulated goodput (bisection on the rate, common random numbers) is compared with
   the plan's predicted goodput (the allocation's capacity at the SLO).
"""

from __future__ import annotations

import argparse
import time

from hardware.device import load_device
from perfmodel.model import load_model
from perfmodel.pd.models import planner_lengths
from perfmodel.pd.simulate import run_at_rate, sample_requests, simulated_goodput
from perfmodel.workload.presets import Workload
from perfmodel.workload.slo import SLO
from solvers.pd.plan import plan_pd

# (model, device, dtype, workload, TTFT s, TPOT s, design rate req/s)
CASES = [
    ("opt-13b", "a100-sxm-80gb", "fp16", "sharegpt", 0.20, 0.100, 20.0),
    ("opt-13b", "a100-sxm-80gb", "fp16", "chat", 0.40, 0.040, 12.0),
    ("opt-13b", "a100-sxm-80gb", "fp16", "code", 2.00, 0.040, 4.0),
    ("llama-3.1-70b", "h100-sxm", "bf16", "chat", 1.00, 0.050, 10.0),
    ("llama-3.1-70b", "h100-sxm", "bf16", "chat", 0.40, 0.030, 10.0),
    ("llama-3.1-70b", "h100-sxm", "bf16", "code", 3.00, 0.060, 4.0),
]


def bench_plan_speed() -> None:
    m, d = load_model("llama-3.1-70b"), load_device("h100-sxm")
    w = Workload("chat", planner_lengths("chat"))
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        p = plan_pd(m, w, SLO(1.0, 0.05), 10.0, prefill_devices=[d])
        times.append(time.perf_counter() - t0)
    print(
        f"plan llama-3.1-70b on h100-sxm, chat, TTFT 1 s / TPOT 50 ms, 10 req/s: "
        f"best {min(times):.2f} s (runs {', '.join(f'{t:.2f}' for t in times)}); "
        f"{p.prefill_instances}P:{p.decode_instances}D, {p.gpus} GPUs, {p.verdict}"
    )


def bench_sim_check(n_requests: int) -> None:
    print(
        f"\nsimulator check ({n_requests} requests per run, p90/p90 criterion, goodput by "
        "bisection to 2%):"
    )
    hdr = (
        f"{'model':14} {'workload':9} {'SLO ms':>10} {'rate':>5} {'plan':>22} {'GPUs':>4} "
        f"{'sim p90 TTFT/TPOT ms @design':>29} {'ok':>3} {'pred g/GPU':>10} {'sim g/GPU':>9} "
        f"{'err':>6}"
    )
    print(hdr)
    worst = 0.0
    all_ok = True
    for model_id, dev_id, dtype, wl, ttft, tpot, rate in CASES:
        m, d = load_model(model_id), load_device(dev_id)
        w = Workload(wl, planner_lengths(wl))
        slo = SLO(ttft, tpot)
        p = plan_pd(
            m, w, slo, rate, prefill_devices=[d], dtype=dtype, kv_dtype=dtype, baseline=False
        )
        req = sample_requests(w.lengths, n_requests, seed=7)
        r = run_at_rate(p.deployment, w.lengths, req, rate)
        tq, pq = r.quantiles_s(slo.percentile)
        ok = r.meets(slo)
        g = simulated_goodput(
            p.deployment,
            w.lengths,
            slo,
            hi_rate_per_s=p.capacity_rate_per_s,
            n_requests=n_requests,
            seed=7,
        )
        pred = p.goodput_per_gpu
        sim = g / p.gpus
        err = pred / sim - 1 if sim > 0 else float("inf")
        worst = max(worst, abs(err))
        all_ok &= ok
        shape = " + ".join(f"{a.instances}x{a.config.label.split()[1]}" for a in p.prefill)
        shape += " | " + " + ".join(f"{a.instances}x{a.config.label.split()[1]}" for a in p.decode)
        print(
            f"{model_id:14} {wl:9} {ttft * 1e3:>5.0f}/{tpot * 1e3:<4.0f} {rate:>5.1f} "
            f"{shape:>22} {p.gpus:>4} {tq * 1e3:>14.1f} / {pq * 1e3:<12.1f} "
            f"{'yes' if ok else 'NO':>3} {pred:>10.3f} {sim:>9.3f} {err:>+6.1%}"
        )
    print(f"all plans meet their SLO at the design rate: {all_ok}; worst |error| {worst:.1%}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer simulated requests")
    args = ap.parse_args()
    bench_plan_speed()
    bench_sim_check(1500 if args.quick else 6000)


if __name__ == "__main__":
    main()
