"""Speed of the foundation: CLI cold start, batch GEMM prediction, vectorized step time.

Run: python3 benchmarks/bench_foundation.py   (prints the figures; no assertions)
Targets (issue 2): cold start < 0.5 s; predict gemm on 100,000 shapes < 2 s;
step-time evaluation ≥ 100,000 configurations per second.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def best_of(cmd: list[str], n: int = 5) -> float:
    best = float("inf")
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    exe = [sys.executable, "-m", "cli.main"]
    print(f"perfmodel --help cold start:   {best_of([*exe, '--help']):.3f} s (best of 5)")
    print(f"perfmodel estimate cold start: {best_of([*exe, 'estimate']):.3f} s (best of 5)")
    cap = best_of([*exe, "capacity"], 3)
    print(f"perfmodel capacity (README main job): {cap:.3f} s (best of 3)")

    rng = np.random.default_rng(0)
    n = 100_000
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "shapes.csv"
        m = rng.integers(1, 16384, n)
        nn = rng.integers(128, 65536, n)
        k = rng.integers(128, 65536, n)
        p.write_text(
            "m,n,k\n" + "\n".join(f"{a},{b},{c}" for a, b, c in zip(m, nn, k, strict=True)) + "\n"
        )
        t = best_of(
            [
                *exe,
                "predict",
                "gemm",
                "--hardware",
                "h100-sxm",
                "--input",
                str(p),
                "--output",
                str(Path(d) / "o.csv"),
                "--force",
            ],
            n=3,
        )
        print(f"predict gemm, {n:,} shapes (whole command): {t:.3f} s")

    from hardware.device import load_device
    from perfmodel.model import load_model
    from perfmodel.plan import ParallelPlan
    from perfmodel.step.batch import Batch
    from perfmodel.step.time import step_time

    dev = load_device("h100-sxm")
    for mid in ("llama-3.1-70b", "deepseek-v3"):
        model = load_model(mid)
        b = rng.integers(1, 512, 200_000).astype(float)
        c = rng.integers(1, 32768, 200_000).astype(float)
        batch = Batch.decode(b, c) + Batch.prefill(rng.integers(0, 2, 200_000), 512.0)
        step_time(model, dev, batch, plan=ParallelPlan(tp=8))  # warm
        t0 = time.perf_counter()
        reps = 5
        for _ in range(reps):
            step_time(model, dev, batch, plan=ParallelPlan(tp=8))
        dt = (time.perf_counter() - t0) / reps
        print(f"step_time {mid} (mixed batches, tp=8): {len(b) / dt:,.0f} configurations/s")


if __name__ == "__main__":
    main()
