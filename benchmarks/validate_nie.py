"""Nie–Si–Zhou's published stable rates (arXiv 2605.04595, T2 of formal_models.md) vs the model.

Llama-3-8B (the catalog's llama-3.1-8b: the same architecture) on one A100, vLLM v1,
chunked prefill 512 (``max_num_batched_tokens`` = chunk = 512), KV cache ``M`` = 131,000
tokens, Poisson arrivals; lengths uniform: 1:1 ``s, o ~ U(10, 1600)``, 2:1
``s ~ U(10, 2133), o ~ U(10, 1066)``, 1:2 reversed; "mixed" = the first half of the
requests 2:1, the second half 1:2 (predicted as the two halves served one after the
other: the harmonic mean of their rates); 8 GPUs = 8 independent replicas behind round
robin (``8·μ``). LongBench v2 has no published length distribution here:
unrepresentable.

Which A100: ``M`` = 131,000 tokens (17.2 GB of BF16 KV) is what vLLM's 0.9 memory
fraction leaves on a 40 GB A100 (this project's memory model: 150–171k tokens), not on
an 80 GB one (450k+). Both are printed. Engines: none (the engine-less roofline),
``vllm`` (the calibrated 2024-era V0 file) and ``vllm@0.8`` (V1, prefix caching on: a
preempted request recomputes only what was evicted, ``perfmodel.serving.preemption``).
``--sim`` adds the discrete-event simulator's saturation rate (it preempts and recomputes,
through the engine's prefix cache if it has one) and, for an engine with a prefix
cache, the simulator with the cache off (``sim −pc``).

    PYTHONPATH=. python benchmarks/validate_nie.py [--sim] [--requests N]

error = predicted / measured − 1 (negative: the model is pessimistic).
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np

from hardware.device import load_device
from hardware.engine import load_engine
from perfmodel.model import load_model
from perfmodel.plan import ParallelPlan
from perfmodel.serving.service import service_rate
from perfmodel.sim.simulate import make_setup, simulate_workload
from perfmodel.step.instance import Instance
from perfmodel.workload.lengths import LengthDistribution
from perfmodel.workload.presets import Workload

M_TOKENS = 131_000
CHUNK = 512
#: published stable rates, req/s (Nie, Si, Zhou, arXiv 2605.04595, via formal_models.md T2)
MEASURED = {"1:1": 3.387, "2:1": 3.650, "1:2": 2.969, "mixed": 3.137, "8 GPUs 1:1": 26.710}
SPLITS = {"1:1": (1600, 1600), "2:1": (2133, 1066), "1:2": (1066, 2133)}


def uniform_lengths(s_hi: int, o_hi: int, n: int = 64) -> LengthDistribution:
    """``s ~ U(10, s_hi)``, ``o ~ U(10, o_hi)`` independent, at ``n`` mid-quantiles each."""
    u = (np.arange(n) + 0.5) / n
    s = np.round(10 + u * (s_hi - 10)).astype(np.int64)
    o = np.round(10 + u * (o_hi - 10)).astype(np.int64)
    ss, oo = np.meshgrid(s, o, indexing="ij")
    return LengthDistribution(f"U{s_hi}/{o_hi}", ss.ravel(), oo.ravel(), np.full(n * n, 1 / n**2))


def predicted_rates(inst: Instance) -> dict[str, tuple[float, float]]:
    """Per split: (μ req/s, recomputed tokens per request)."""
    out = {}
    for name, (s_hi, o_hi) in SPLITS.items():
        sr = service_rate(
            inst,
            Workload(name, uniform_lengths(s_hi, o_hi)),
            kv_capacity_tokens=M_TOKENS,
            max_batched_tokens=CHUNK,
            chunk_size=CHUNK,
        )
        out[name] = (sr.rate_per_s, sr.recompute_tokens)
    mixed = 2.0 / (1.0 / out["2:1"][0] + 1.0 / out["1:2"][0])
    out["mixed"] = (mixed, float("nan"))
    out["8 GPUs 1:1"] = (8 * out["1:1"][0], out["1:1"][1])
    return out


def simulated_rates(inst: Instance, requests: int, *, cache: bool = True) -> dict[str, float]:
    """The simulator's saturation rate per split; ``cache=False`` turns the engine's prefix
    cache off (a preempted request then recomputes everything it held)."""
    setup = make_setup(
        inst, kv_capacity_tokens=M_TOKENS, max_batched_tokens=CHUNK, chunk_size=CHUNK
    )
    if not cache:
        setup = replace(setup, prefix_cache_block_tokens=0)
    out = {}
    for name, (s_hi, o_hi) in SPLITS.items():
        res = simulate_workload(
            setup, uniform_lengths(s_hi, o_hi), None, n_requests=requests, seed=1
        )
        out[name] = res.saturation_throughput_per_s()
    out["mixed"] = 2.0 / (1.0 / out["2:1"] + 1.0 / out["1:2"])
    out["8 GPUs 1:1"] = 8 * out["1:1"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sim", action="store_true", help="also run the simulator")
    ap.add_argument("--requests", type=int, default=3000)
    a = ap.parse_args()
    model = load_model("llama-3.1-8b")
    print(
        f"{'device':14s} {'engine':9s} {'split':11s} {'measured':>8s} {'predicted':>9s} "
        f"{'error':>7s} {'R tok':>6s}"
        + (f" {'sim':>7s} {'error':>7s} {'sim -pc':>7s} {'error':>7s}" if a.sim else "")
    )
    for dev in ("a100-40gb", "a100-sxm-80gb"):
        for eng in (None, "vllm", "vllm@0.8"):
            inst = Instance(model, load_device(dev), ParallelPlan(),
                            engine=load_engine(eng) if eng else None)  # fmt: skip
            pred = predicted_rates(inst)
            sim = simulated_rates(inst, a.requests) if a.sim else {}
            pc = a.sim and inst.engine is not None and inst.engine.prefix_caching
            nopc = simulated_rates(inst, a.requests, cache=False) if pc else {}
            for split, meas in MEASURED.items():
                mu, rec = pred[split]
                line = (f"{dev:14s} {eng or 'none':9s} {split:11s} {meas:8.3f} {mu:9.3f} "
                        f"{mu / meas - 1:+7.1%} {rec:6.0f}")  # fmt: skip
                if a.sim:
                    line += f" {sim[split]:7.3f} {sim[split] / meas - 1:+7.1%}"
                    if nopc:
                        line += f" {nopc[split]:7.3f} {nopc[split] / meas - 1:+7.1%}"
                print(line)
    print("LongBench v2 (measured 0.610 req/s): unrepresentable (no length distribution)")


if __name__ == "__main__":
    main()
