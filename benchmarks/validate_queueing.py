"""Analytic queueing model vs the discrete-event simulator.

Service rate: 3 models (dense 8B, dense 70B, MoE Mixtral-8x7B) × 2 devices × {chat,
code}, each at the KV capacity of the memory model and at a forced small KV capacity
(``--small-kv-tokens``, strongly memory-bound): the predicted μ against the simulator's
saturation rate (infinite backlog).

Latency: the full table of mean and p90 TTFT/TPOT at 30/50/70/80 % of μ (default KV
capacity), analytic (``queueing.latency``) against simulated Poisson runs. Each
simulated value averages ``--seeds`` runs of ``--requests`` requests, without the
requests that arrive in the first 10 % of a run (the warm-up from an empty engine); the
``±`` column is the spread (max − min)/2 of the per-seed means of TPOT, the noisier of
the two. Also printed: the time of one ``queueing.latency`` call.

    python benchmarks/validate_queueing.py [--requests N] [--seeds K] [--small-kv-tokens M]
                                           [--no-latency] [--no-rates]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from hardware.device import load_device
from perfmodel.model import load_model
from perfmodel.plan import ParallelPlan
from perfmodel.serving import service as q
from perfmodel.sim.simulate import SimResult, make_setup, saturation_rate_per_s, simulate_workload
from perfmodel.step.instance import Instance
from perfmodel.workload.presets import preset

CONFIGS = [
    ("llama-3.1-8b", "h100-sxm", 1),
    ("llama-3.1-8b", "a100-sxm-80gb", 1),
    ("llama-3.1-70b", "h100-sxm", 4),
    ("llama-3.1-70b", "a100-sxm-80gb", 4),
    ("mixtral-8x7b", "h100-sxm", 2),
    ("mixtral-8x7b", "a100-sxm-80gb", 2),
]
LOADS = (0.3, 0.5, 0.7, 0.8)
BUDGET = 8192
WARMUP = 0.1


def _steady(r: SimResult) -> tuple[float, float, float, float]:
    """Mean and p90 of TTFT and TPOT over the requests arriving after the warm-up."""
    keep = r.arrival_s >= WARMUP * r.arrival_s[-1]
    ttft = (r.first_token_s - r.arrival_s)[keep & np.isfinite(r.first_token_s)]
    multi = keep & r.completed & (r.output_tokens >= 2)
    tpot = ((r.finish_s - r.first_token_s) / np.maximum(r.output_tokens - 1, 1))[multi]
    return (
        float(ttft.mean()),
        float(np.quantile(ttft, 0.9)),
        float(tpot.mean()),
        float(np.quantile(tpot, 0.9)),
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=30_000)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--small-kv-tokens", type=int, default=100_000)
    ap.add_argument("--no-latency", action="store_true")
    ap.add_argument("--no-rates", action="store_true")
    args = ap.parse_args()
    t_start = time.time()
    rate_rows = []
    lat_rows = []
    calls: list[float] = []
    for mid, dev, tp in CONFIGS:
        for wl in ("chat", "code"):
            m, d, plan, w = load_model(mid), load_device(dev), ParallelPlan(tp=tp), preset(wl)
            name = f"{mid} {tp}x{dev} {wl}"
            for kv in (None, args.small_kv_tokens):
                if args.no_rates and kv is not None:
                    continue
                sr = q.service_rate(Instance(m, d, plan), w, kv_capacity_tokens=kv)
                setup = make_setup(
                    Instance(m, d, plan),
                    kv_capacity_tokens=sr.kv_capacity_tokens,
                    max_batched_tokens=BUDGET,
                )
                if not args.no_rates:
                    sat = saturation_rate_per_s(setup, w.lengths, n_requests=6000, seed=1)
                    rate_rows.append((name, sr, sat))
                if kv is not None or args.no_latency:
                    continue
                for u in LOADS:
                    lam = u * sr.rate_per_s
                    t0 = time.perf_counter()
                    est = q.latency(sr, lam)
                    calls.append(time.perf_counter() - t0)
                    runs = np.array(
                        [
                            _steady(
                                simulate_workload(
                                    setup,
                                    w.lengths,
                                    w.arrivals(lam),
                                    n_requests=args.requests,
                                    seed=11 + k,
                                )
                            )
                            for k in range(args.seeds)
                        ]
                    )
                    spread = (runs[:, 2].max() - runs[:, 2].min()) / 2 / runs[:, 2].mean()
                    lat_rows.append((name, u, est, runs.mean(axis=0), spread))
    if rate_rows:
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
            f"{len(errs)} rows: max |err| {max(errs):.1%}, "
            f"mean |err| {sum(errs) / len(errs):.1%}, "
            f"within 10 %: {sum(e <= 0.10 for e in errs)}/{len(errs)}\n"
        )
    if lat_rows:
        print(
            f"latency: analytic / simulated ({args.seeds} seeds × {args.requests} requests, "
            f"Poisson arrivals, first {WARMUP:.0%} dropped)"
        )
        print(
            f"{'config':34s} {'ρ':>4s} {'TTFT mean ms':>17s} {'err':>6s} {'TPOT mean ms':>17s} "
            f"{'err':>6s} {'±sim':>5s} {'TTFT p90 ms':>17s} {'err':>6s} {'TPOT p90 ms':>17s} "
            f"{'err':>6s}"
        )
        worst: dict[float, float] = {}
        worst_p90: dict[float, float] = {}
        for name, u, est, sim, spread in lat_rows:
            ttft, ttft90, tpot, tpot90 = sim
            err = [
                est.ttft_mean_s / ttft - 1,
                est.tpot_mean_s / tpot - 1,
                est.ttft_p90_s / ttft90 - 1,
                est.tpot_p90_s / tpot90 - 1,
            ]
            worst[u] = max(worst.get(u, 0.0), abs(err[0]), abs(err[1]))
            worst_p90[u] = max(worst_p90.get(u, 0.0), abs(err[2]), abs(err[3]))
            print(
                f"{name:34s} {u:4.1f} "
                f"{est.ttft_mean_s * 1e3:8.1f}/{ttft * 1e3:8.1f} {err[0]:+6.1%} "
                f"{est.tpot_mean_s * 1e3:8.2f}/{tpot * 1e3:8.2f} {err[1]:+6.1%} {spread:5.1%} "
                f"{est.ttft_p90_s * 1e3:8.1f}/{ttft90 * 1e3:8.1f} {err[2]:+6.1%} "
                f"{est.tpot_p90_s * 1e3:8.2f}/{tpot90 * 1e3:8.2f} {err[3]:+6.1%}"
            )
        n_below = sum(1 for _, u, *_ in lat_rows if u < 0.8)
        ok_below = sum(
            1
            for _, u, est, sim, _ in lat_rows
            if u < 0.8
            and abs(est.ttft_mean_s / sim[0] - 1) <= 0.2
            and abs(est.tpot_mean_s / sim[2] - 1) <= 0.2
        )
        print(
            "worst |err| of the means by utilization: "
            + ", ".join(f"{u:.1f}: {v:.1%}" for u, v in worst.items())
        )
        print(
            "worst |err| of the p90s by utilization:  "
            + ", ".join(f"{u:.1f}: {v:.1%}" for u, v in worst_p90.items())
        )
        print(f"means within 20 % below 80 % utilization: {ok_below}/{n_below} rows")
        print(
            f"queueing.latency: {len(calls)} calls, mean {np.mean(calls) * 1e3:.0f} ms, "
            f"max {np.max(calls) * 1e3:.0f} ms"
        )
    print(f"total {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()
