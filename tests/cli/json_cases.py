"""One small, quick ``--json`` invocation of every command that has ``--json``.

Used by the JSON contract test (``tests/cli/test_json_contract.py``); a new command with
``--json`` must add its case here (the test fails on a command without one).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hardware.device import load_device
from hardware.roofline import Roofline
from perfmodel.units import MS_PER_S
from perfmodel.validate.convert import COLUMNS

MEASUREMENTS = (
    "h100-sxm,llama-3.1-8b,vllm,bf16,bf16,1,1,128,128,,output_tps_total,20000,,,",
    "h100-sxm,my-model,vllm,bf16,bf16,1,1,128,128,,output_tps_total,20000,,,",
    "h100-sxm,llama-3.1-8b,vllm,bf16,bf16,1,1,128,128,,ttft_ms,50,,16,",
)
CALIBRATION = tuple(
    f"h100-sxm,llama-2-7b,vllm,fp16,fp16,1,1,{n},{n},{b},total_tps_total,{v},,,"
    for n, b, v in ((128, 1, 160.0), (512, 16, 1900.0), (1024, 64, 4000.0))
)
SWEEP = """chunk = 4
[grid]
model = "llama-3.1-8b"
hardware = "h100-sxm"
batch = [1, 8]
input_len = 128
output_len = [2, 8]
"""


def _gemm_csv(path: Path) -> Path:
    """A synthetic bf16 GEMM table: the H100 roofline with 1 % noise."""
    rl = Roofline(load_device("h100-sxm"))
    rng = np.random.default_rng(0)
    lines = ["gemm_dtype,m,n,k,latency_ms"]
    grid = [(n, k) for n in (256, 1024, 4096) for k in (512, 2048, 8192)]
    # the two GEMMs of qwen3-30b-a3b's expert (2048 x 768, gated) for G = 1, 2, 4 experts
    grid += [(nk, 2048) for nk in (1536, 3072, 6144)] + [(2048, k) for k in (768, 1536, 3072)]
    for n, k in grid:
        for m in (1, 8, 64, 256, 1024, 4096):
            t = float(rl.gemm_time_s(m, n, k)) * rng.lognormal(0.0, 0.01)
            lines.append(f"bfloat16,{m},{n},{k},{t * MS_PER_S:.6g}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _long_csv(path: Path, lines: tuple[str, ...]) -> Path:
    path.write_text("\n".join([",".join(COLUMNS), *lines]) + "\n", encoding="utf-8")
    return path


def json_cases(tmp: Path, *, write: bool = True) -> dict[str, list[str]]:
    """Command path -> arguments (``--json`` included); with ``write`` the input files are
    written under ``tmp`` (without: only the names, e.g. to list the commands)."""
    gemm, shapes, spec = tmp / "gemm.csv", tmp / "shapes.csv", tmp / "sweep.toml"
    meas, cal = tmp / "m.csv", tmp / "cal.csv"
    if write:
        _gemm_csv(gemm)
        shapes.write_text("m,n,k,dtype\n16,4096,4096,bf16\n128,8192,4096,fp8\n", encoding="utf-8")
        spec.write_text(SWEEP, encoding="utf-8")
        _long_csv(meas, MEASUREMENTS)
        _long_csv(cal, CALIBRATION)
    moe = ["--model", "qwen3-30b-a3b", "--hardware", "h100-sxm"]
    fit = ["--data", str(gemm), "--features", "gemm", "--time-col", "latency_ms",
           "--hardware", "h100-sxm", "--group-cols", "n,k", "--op", "gemm_bf16",
           "--pieces", "2"]  # fmt: skip
    out = {
        "plan": ["plan", "--model", "llama-3.1-8b", "--devices", "h100-sxm",
                 "--rate-per-s", "2", "--deploy", str(tmp / "deploy.toml")],
        "estimate": ["estimate", "--model", "llama-3.1-8b", "--hardware", "h100-sxm"],
        "capacity": ["capacity"],
        "simulate": ["simulate", "--requests", "300"],
        "sweep": ["sweep", str(spec), "--out", str(tmp / "s.jsonl"), "--scheduler", "serial"],
        "validate": ["validate", "--data", str(meas)],
        "calibrate": ["calibrate", "--data", str(cal), "--engine", "vllm",
                      "--out", str(tmp / "cal.toml"), "--no-cv", "--max-evals", "3"],
        "hardware list": ["hardware", "list"],
        "hardware show": ["hardware", "show", "h100-sxm"],
        "model list": ["model", "list"],
        "model show": ["model", "show", "qwen3-30b-a3b"],
        "predict gemm": ["predict", "gemm", "--hardware", "h100-sxm", "--input", str(shapes)],
        "dispatch solve": ["dispatch", "solve", *moe, "--tokens", "256", "--gpus", "4",
                           "--method", "heuristic"],
        "dispatch place": ["dispatch", "place", *moe, "--tokens", "256", "--gpus", "4",
                           "--time-limit-s", "2"],
        "dispatch phase": ["dispatch", "phase", *moe, "--tokens-per-gpu", "16,256",
                           "--skews", "0,1", "--samples", "1", "--out", str(tmp / "d.html")],
        "profile fit": ["profile", "fit", *fit, "--out", str(tmp / "p.toml")],
        "profile show": ["profile", "show", "h100-sxm:gemm_bf16"],
        "profile crossover": ["profile", "crossover", "--hardware", "h100-sxm",
                              "--model", "qwen3-30b-a3b", "--data", str(gemm), "--boots", "5",
                              "--out", str(tmp / "x.toml")],
        "profile plot": ["profile", "plot", "--profile", "h100-sxm:gemm_bf16", "--data",
                         str(gemm), "--where", "n=4096", "--out", str(tmp / "pp.html")],
        "cache plan": ["cache", "plan", "--model", "qwen3-30b-a3b", "--offload-experts",
                       "--kv-levels", "2", "--expert-levels", "2", "--adapters", "4",
                       "--out", str(tmp / "c.html")],
        "pd plan": ["pd", "plan", "--model", "llama-3.1-8b", "--hardware", "a100-sxm-80gb",
                    "--rate-per-s", "4"],
        "pd phase": ["pd", "phase", "--model", "llama-3.1-8b", "--hardware", "a100-sxm-80gb",
                     "--inputs", "512", "--outputs", "128", "--slo-scales", "1",
                     "--out", str(tmp / "pd.html")],
        "phase stability": ["phase", "stability", "--rates", "4", "--sim-rows", "1",
                            "--sim-requests", "300", "--output-tokens", "64,256",
                            "--kv-grid-tokens", "50000,200000", "--out", str(tmp / "st.html")],
        "claims list": ["claims", "list"],
        "claims check": ["claims", "check", "hobbit-9.93x"],
    }  # fmt: skip
    return {k: [*v, "--json"] for k, v in out.items()}
