"""Kernel efficiencies of the linear layers vLLM runs, from Vidur's per-operator profile.

vLLM's unquantized linear layers are ``torch.nn.functional.linear`` (cuBLAS), the same in
V0 and V1; V1 removes most of what lies *between* the kernels (host time: persistent
batch, a separate engine-core process; blog.vllm.ai/2025/01/27/v1-alpha-release), so its
iteration is close to the sum of its kernels. This fits the roofline's GEMM compute and
memory-streaming efficiencies to measured kernel times of exactly those layers:
``../shared/data/vidur-profiling/<dev>__<model>__mlp.csv`` (Microsoft Vidur's profile,
PyTorch on the GPU; columns ``time_stats.<op>.median`` in ms), the four projections
``attn_pre_proj`` (QKV), ``attn_post_proj`` (O), ``mlp_up_proj`` (gate + up when gated)
and ``mlp_down_proj`` of every model and tensor-parallel degree of the device.

Model of one kernel (``hardware.roofline``): ``max(F/(e_c·peak), B/(e_m·BW)) + o`` with
``F, B`` from ``gemm_flops_bytes`` (128-row tiles) and ``o`` the roofline's per-kernel
overhead as the step model uses it (``DEFAULT_OVERHEAD_S``, fixed, not fitted); ``e_c``
and ``e_m`` minimise the soft-L1 relative error (as ``hardware.calibrate``). Vidur's A100
is the 80 GB SXM part (a batch-1 up projection streams 1.65 TB/s, above the 40 GB part's
1.555 TB/s peak), its H100 the SXM part; the efficiencies are fractions of that
device's peak. Printed: the fit, its median / p90 APE, the leave-one-model-out spread
and the median APE per token bucket.

    PYTHONPATH=. python benchmarks/fit_vidur_linear.py [--device a100|h100]
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from hardware.device import load_device
from hardware.roofline import DEFAULT_OVERHEAD_S, Roofline, gemm_flops_bytes

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "vidur-profiling"
DEVICES = {"a100": "a100-sxm-80gb", "h100": "h100-sxm"}
OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
BUCKETS = ((1, 16), (17, 128), (129, 512), (513, 2048), (2049, 1 << 20))


def read_rows(dev: str, folder: Path = DATA) -> dict[str, np.ndarray]:
    """One row per (file row, projection): m, n, k, measured seconds, model name."""
    out: dict[str, list] = {"m": [], "n": [], "k": [], "t": [], "model": []}
    for path in sorted(folder.glob(f"{dev}__*__mlp.csv")):
        model = path.name.split("__")[1]
        with path.open(encoding="utf-8") as f:
            for r in csv.DictReader(f):
                tp = int(r["num_tensor_parallel_workers"])
                h, heads, kv = int(r["n_embd"]), int(r["n_head"]), int(r["n_kv_head"])
                inter, d = int(r["n_expanded_embd"]), int(r["n_embd"]) // int(r["n_head"])
                gated = 2 if r["use_gated_mlp"] == "True" else 1
                shapes = {
                    "attn_pre_proj": ((heads + 2 * kv) * d // tp, h),
                    "attn_post_proj": (h, heads * d // tp),
                    "mlp_up_proj": (gated * inter // tp, h),
                    "mlp_down_proj": (h, inter // tp),
                }
                for op in OPS:
                    n, k = shapes[op]
                    out["m"].append(int(r["num_tokens"]))
                    out["n"].append(n)
                    out["k"].append(k)
                    out["t"].append(float(r[f"time_stats.{op}.median"]) * 1e-3)
                    out["model"].append(model)
    return {key: np.asarray(v) for key, v in out.items()}


def fit(device_id: str, rows: dict[str, np.ndarray]) -> tuple[float, float]:
    """``(e_c, e_m)`` with the per-kernel overhead fixed at ``DEFAULT_OVERHEAD_S``."""
    dev = load_device(device_id)
    f, b = gemm_flops_bytes(rows["m"], rows["n"], rows["k"], act_bytes=2.0)
    ideal = Roofline(dev, eff_compute=1.0, eff_memory=1.0, overhead_s=0.0).times(f, b, dtype="bf16")
    t = rows["t"]

    def res(p: np.ndarray) -> np.ndarray:
        busy = np.maximum(ideal.compute_s * p[0], ideal.memory_s * p[1])
        return (busy + DEFAULT_OVERHEAD_S) / t - 1.0

    r = least_squares(
        res, np.array([1.25, 1.25]), bounds=([1.0, 1.0], [1e3, 1e3]), loss="soft_l1",
        f_scale=0.02,
    )  # fmt: skip
    return float(1.0 / r.x[0]), float(1.0 / r.x[1])


def ape(device_id: str, rows: dict[str, np.ndarray], ec: float, em: float) -> np.ndarray:
    f, b = gemm_flops_bytes(rows["m"], rows["n"], rows["k"], act_bytes=2.0)
    pred = Roofline(load_device(device_id), eff_compute=ec, eff_memory=em).time_s(
        f, b, dtype="bf16"
    )
    return np.abs(pred / rows["t"] - 1.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=sorted(DEVICES), default="a100")
    a = ap.parse_args()
    dev_id = DEVICES[a.device]
    rows = read_rows(a.device)
    ec, em = fit(dev_id, rows)
    e = ape(dev_id, rows, ec, em)
    models = sorted(set(rows["model"]))
    print(f"{dev_id}: {len(e)} kernel times from {len(models)} models, overhead "
          f"{DEFAULT_OVERHEAD_S * 1e6:.0f} us per kernel (fixed)")  # fmt: skip
    print(f"  fit: gemm_compute {ec:.3f}  memory {em:.3f}  "
          f"MdAPE {100 * np.median(e):.1f} %  p90 {100 * np.quantile(e, 0.9):.1f} %")  # fmt: skip
    for lo, hi in BUCKETS:
        sel = (rows["m"] >= lo) & (rows["m"] <= hi)
        if sel.any():
            mdape = 100 * np.median(e[sel])
            print(f"  tokens {lo:>5d}-{hi:<7d} rows {sel.sum():5d}  MdAPE {mdape:5.1f} %")
    held: list[float] = []
    for model in models:
        train = {k: v[rows["model"] != model] for k, v in rows.items()}
        test = {k: v[rows["model"] == model] for k, v in rows.items()}
        c, m = fit(dev_id, train)
        held.append(float(np.median(ape(dev_id, test, c, m))))
        print(f"  without {model:32s} gemm_compute {c:.3f} memory {m:.3f}  "
              f"held-out MdAPE {100 * held[-1]:.1f} %")  # fmt: skip
    print(f"  leave-one-model-out median of MdAPEs {100 * np.median(held):.1f} %")


if __name__ == "__main__":
    main()
