"""Analytic queueing model vs the discrete-event simulator.

Service rate: 3 models (dense 8B, dense 70B, MoE Mixtral-8x7B) × 2 devices × {chat,
code}, each at the KV capacity of the memory model and at a forced small KV capacity
(``--small-kv-tokens``, strongly memory-bound): the predicted μ against the simulator's
saturation rate (infinite backlog). Latency: mean TTFT/TPOT at 30/50/70/80 % of μ
against simulated Poisson runs (default KV capacity).

    python benchmarks/validate_queueing.py [--requests N] [--small-kv-tokens M] [--no-latency]
"""

from __future__ import annotations

import argparse
import time

from hardware.device import load_device
from perfmodel import queueing as q
from perfmodel.model import load_model
from perfmodel.parallel import ParallelPlan
from perfmodel.simulate import make_setup, saturation_rate_per_s, simulate_workload
from perfmodel.workload import preset

CONFIGS = [
    ("llama-3.1-8b", "h100-sxm", 1),
    ("llama-3.1-8b", "a100-sxm-80gb", 1),
    ("llama-3.1-70b", "h100-sxm", 4),
    ("llama-3.1-70b", "a100-sxm-80gb", 4),
    ("mixtral-8x7b", "h100-sxm", 2),
    ("mixtral-8x7b", "a100-sxm-80gb", 2),
]
LOADS = (0.3, 0.5, 0.7, 0.8)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=6000)
    ap.add_argument("--small-kv-tokens", type=int, default=100_000)
    ap.add_argument("--no-latency", action="store_true")
    args = ap.parse_args()
    t_start = time.time()
    rate_rows = []
    lat_rows = []
    for mid, dev, tp in CONFIGS:
        for wl in ("chat", "code"):
            m, d, plan, w = load_model(mid), load_device(dev), ParallelPlan(tp=tp), preset(wl)
            for kv in (None, args.small_kv_tokens):
                sr = q.service_rate(m, d, plan, w, kv_capacity_tokens=kv)
                setup = make_setup(
                    m, d, plan, kv_capacity_tokens=sr.kv_capacity_tokens, max_batched_tokens=8192
                )
                sat = saturation_rate_per_s(setup, w.lengths, n_requests=args.requests, seed=1)
                name = f"{mid} {tp}x{dev} {wl}"
                rate_rows.append((name, sr, sat))
                if kv is not None or args.no_latency:
                    continue
                for u in LOADS:
                    lam = u * sr.rate_per_s
                    est = q.latency(sr, lam)
                    r = simulate_workload(
                        setup, w.lengths, w.arrivals(lam), n_requests=args.requests, seed=2
                    )
                    lat_rows.append((name, u, est, r.ttft().mean_s, r.tpot().mean_s))
    print("service rate: analytic μ vs simulated saturation (infinite backlog)")
    print(
        f"{'config':40s} {'KV tokens':>9s} {'bound':6s} {'μ_c':>7s} {'μ_m':>7s} {'μ':>7s} "
        f"{'sim':>7s} {'err':>7s}"
    )
    errs = []
    for name, sr, sat in rate_rows:
        e = sr.rate_per_s / sat - 1
        errs.append(abs(e))
        print(
            f"{name:40s} {sr.kv_capacity_tokens:9d} {sr.binding:6s} "
            f"{sr.compute_rate_per_s:7.3f} {sr.memory_rate_per_s:7.3f} "
            f"{sr.rate_per_s:7.3f} {sat:7.3f} {e:+7.1%}"
        )
    print(
        f"{len(errs)} rows: max |err| {max(errs):.1%}, mean |err| {sum(errs) / len(errs):.1%}, "
        f"within 10 %: {sum(e <= 0.10 for e in errs)}/{len(errs)}\n"
    )
    if lat_rows:
        print("mean latency: analytic vs simulated (Poisson arrivals)")
        print(f"{'config':40s} {'ρ':>4s} {'TTFT ms':>16s} {'err':>6s} {'TPOT ms':>16s} {'err':>6s}")
        worst: dict[float, float] = {}
        for name, u, est, ttft, tpot in lat_rows:
            et, ep = est.ttft_mean_s / ttft - 1, est.tpot_mean_s / tpot - 1
            worst[u] = max(worst.get(u, 0.0), abs(et), abs(ep))
            print(
                f"{name:40s} {u:4.1f} {est.ttft_mean_s * 1e3:7.1f} /{ttft * 1e3:7.1f} {et:+6.0%} "
                f"{est.tpot_mean_s * 1e3:7.2f} /{tpot * 1e3:7.2f} {ep:+6.0%}"
            )
        print(
            "worst |err| by utilization: "
            + ", ".join(f"{u:.1f}: {v:.0%}" for u, v in worst.items())
        )
    print(f"total {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()
