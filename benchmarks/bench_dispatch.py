"""Expert-dispatch benchmark: MILP solve times, heuristic quality and heuristic speed.

Run: ``python3 benchmarks/bench_dispatch.py [--instances 1000] [--seed 0]``

1. MILP on 8 GPUs × 128 experts × 2 replicas (derived H100 profile of a Qwen3-235B
   expert, 128-row tiles) over tokens per GPU × skew: solve time, status, gap.
2. 1,000 random instances (2–8 GPUs × 8–64 experts, 1–3 replicas, 8–2048 tokens per
   GPU, Zipf skew 0–1.5, tiles of 128 or none): share of instances where the
   heuristic is within 2% of the MILP optimum, and where it is never worse than the
   best proxy (token / activated / static) — with the token proxy by max-flow (the
   default) and, for reference, by the LP rounded by largest remainder; and whether
   the max-flow token balance reaches the LP's optimum level on every instance.
3. Heuristic time (median, p90) on 8 GPUs × 256 experts: every expert on 2 GPUs, and
   an EPLB placement with 32 redundant experts (288 slots); the token proxy's time by
   max-flow and by LP on the same instances.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from hardware.device import load_device
from perfmodel.moe.expert import derived_expert_profile
from perfmodel.moe.routing import expert_popularity, sample_counts
from solvers.dispatch.solve import (
    Placement,
    best_proxy,
    dispatch_heuristic,
    dispatch_token,
    make_problem,
    round_robin_placement,
    solve_milp,
    token_lp,
)
from solvers.placement.eplb import rebalance_experts


def _random_placement(rng: np.random.Generator, E: int, G: int) -> Placement:
    reps = int(rng.integers(1, min(3, G) + 1))
    pl = round_robin_placement(E, G, replicas=reps).replicas.copy()
    extra = int(rng.integers(0, E // 4 + 1))
    for i in rng.integers(0, E, size=extra):
        pl[i, rng.integers(0, G)] = 1
    return Placement(pl)


def milp_section(prof: object) -> None:
    print("== MILP: 8 GPUs x 128 experts x 2 replicas (h100-sxm, Qwen3-235B expert, tile 128)")
    pl = round_robin_placement(128, 8, replicas=2)
    times = []
    for tpg in (16, 64, 256, 512, 1024, 2048):
        for skew in (0.0, 0.8, 1.2):
            rng = np.random.default_rng([tpg, int(skew * 10)])
            c = sample_counts(expert_popularity(128, exponent=skew, seed=rng), 8 * tpg, 8, seed=rng)
            r = solve_milp(make_problem(c[0], pl, prof), time_limit_s=10.0)  # type: ignore[arg-type]
            times.append(r.solve_time_s)
            print(
                f"  tokens/GPU {tpg:5d} skew {skew:.1f}: {r.status:10s} gap {r.gap or 0:.1e} "
                f"makespan {r.makespan_s * 1e6:8.1f} us  solve {r.solve_time_s:6.2f} s"
            )
    print(f"  max solve time {max(times):.2f} s, median {np.median(times):.2f} s")


def quality_section(prof: object, n: int, seed: int) -> None:
    print(f"== heuristic vs MILP on {n} random instances (up to 8 GPUs x 64 experts)")
    rng = np.random.default_rng(seed)
    within = never_worse = never_worse_lp = flow_exact = not_proven = 0
    worst = 0.0
    t_milp, t_heur = [], []
    for _ in range(n):
        G = int(rng.choice([2, 4, 8]))
        E = int(rng.choice([e for e in (8, 16, 32, 64) if e >= G]))
        tpg = int(np.exp(rng.uniform(np.log(8), np.log(2048))))
        skew = float(rng.uniform(0.0, 1.5))
        k = int(min(8, E // 2))
        tile = 128 if rng.random() < 0.75 else 1
        c = sample_counts(expert_popularity(E, exponent=skew, seed=rng), G * tpg, k, seed=rng)[0]
        p = make_problem(c, _random_placement(rng, E, G), prof, tile_rows=tile)  # type: ignore[arg-type]
        m = solve_milp(p, time_limit_s=10.0)
        t_milp.append(m.solve_time_s)
        not_proven += m.status != "optimal"
        _, prox = best_proxy(p)
        bp = min(r.makespan_s for r in prox.values())
        lp_tok = dispatch_token(p, solver="lp")
        _, lp_level = token_lp(p)
        flow_exact += prox["token"].gpu_tokens.max() == np.ceil(lp_level - 1e-7)
        h = dispatch_heuristic(p)
        t_heur.append(h.solve_time_s)
        ratio = h.makespan_s / m.makespan_s - 1.0
        worst = max(worst, ratio)
        within += ratio <= 0.02
        never_worse += h.makespan_s <= bp * (1 + 1e-9)
        never_worse_lp += h.makespan_s <= min(bp, lp_tok.makespan_s) * (1 + 1e-9)
    print(
        f"  heuristic within 2% of MILP: {100 * within / n:.1f}% (worst {100 * worst:.1f}% above)"
    )
    print(f"  heuristic never worse than best proxy: {100 * never_worse / n:.1f}%")
    print(
        "  ... counting the LP-rounded token balance as a proxy too: "
        f"{100 * never_worse_lp / n:.1f}%"
    )
    print(f"  max-flow token balance at the LP optimum (integer: its ceiling): {flow_exact}/{n}")
    print(
        f"  heuristic time: median {1e3 * np.median(t_heur):.3f} ms, "
        f"p90 {1e3 * np.percentile(t_heur, 90):.3f} ms"
    )
    print(
        f"  MILP solve time: median {np.median(t_milp):.3f} s, max {max(t_milp):.2f} s; "
        f"{not_proven} stopped at the 10 s limit (compared with their best found)"
    )


def speed_section(prof: object) -> None:
    print("== heuristic time, 8 GPUs x 256 experts (h100-sxm profile, tile 128)")
    for name in ("2 replicas each", "EPLB 288 slots"):
        ts: list[float] = []
        t_flow: list[float] = []
        t_lp: list[float] = []
        for tpg in (16, 64, 256, 1024):
            for rep in range(10):
                rng = np.random.default_rng([tpg, rep])
                pop = expert_popularity(256, exponent=1.0, seed=rng)
                c = sample_counts(pop, 8 * tpg, 8, seed=rng)[0]
                if name.startswith("2"):
                    pl = round_robin_placement(256, 8, replicas=2)
                else:
                    r = rebalance_experts(pop * 8 * tpg * 8, 288, 1, 1, 8)
                    pl = Placement.from_slots(
                        r.phy2log[0], r.slot_gpu(), num_experts=256, num_gpus=8
                    )
                p = make_problem(c, pl, prof)  # type: ignore[arg-type]
                dispatch_heuristic(p)  # warm
                for _ in range(5):
                    t0 = time.perf_counter()
                    dispatch_heuristic(p)
                    ts.append(time.perf_counter() - t0)
                t_flow.append(dispatch_token(p).solve_time_s)
                t_lp.append(dispatch_token(p, solver="lp").solve_time_s)
        a = np.array(ts) * 1e3
        print(
            f"  {name:16s}: median {np.median(a):.3f} ms, p90 {np.percentile(a, 90):.3f} ms "
            f"({len(a)} runs, 16-1024 tokens/GPU, skew 1.0)"
        )
        print(
            f"  {'':16s}  token proxy: max-flow median {1e3 * np.median(t_flow):.3f} ms, "
            f"LP median {1e3 * np.median(t_lp):.3f} ms"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--instances", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-milp", action="store_true")
    a = ap.parse_args()
    prof = derived_expert_profile(load_device("h100-sxm"), 4096, 1536)
    speed_section(prof)
    if not a.skip_milp:
        milp_section(prof)
    quality_section(prof, a.instances, a.seed)


if __name__ == "__main__":
    main()
