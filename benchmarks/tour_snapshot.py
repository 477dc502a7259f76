"""Snapshot the README tour's numbers, to show a refactoring changed no answer.

    python3 benchmarks/tour_snapshot.py --write before.json
    python3 benchmarks/tour_snapshot.py --diff before.json

Each command of the tour runs with ``--json`` (small, fast arguments); ``--diff``
compares every number with a relative tolerance of 1e-9 and lists what moved.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMANDS: list[list[str]] = [
    ["hardware", "show", "h100-sxm"],
    ["model", "show", "llama-3.1-70b"],
    ["estimate", "--model", "llama-3.1-70b", "--hardware", "h100-sxm", "--tp", "8"],
    ["estimate", "--model", "llama-3.1-70b", "--hardware", "h100-sxm", "--tp", "4", "--pp", "2"],
    ["estimate", "--model", "deepseek-v3", "--hardware", "h200-sxm", "--tp", "8"],
    ["capacity"],
    ["capacity", "--model", "llama-3.1-70b", "--hardware", "h100-sxm", "--tp", "4",
     "--workload", "code", "--rate-per-s", "5"],
    ["capacity", "--model", "qwen3-30b-a3b", "--hardware", "mi300x", "--tp", "1"],
    ["simulate", "--requests", "3000"],
    ["pd", "plan", "--model", "llama-3.1-8b", "--hardware", "a100-sxm-80gb",
     "--workload", "chat", "--rate-per-s", "4", "--ttft-slo-ms", "400", "--tpot-slo-ms", "60"],
    ["cache", "plan", "--model", "qwen3-30b-a3b", "--hardware", "h100-sxm", "--rate-per-s", "2"],
    ["dispatch", "solve", "--model", "qwen3-30b-a3b", "--tokens", "2048", "--skew", "1.0",
     "--gpus", "8", "--replicas", "8", "--hardware", "h100-sxm", "--method", "all"],
    ["dispatch", "place", "--model", "qwen3-30b-a3b", "--tokens", "2048", "--skew", "1.0",
     "--gpus", "8", "--slots-per-gpu", "20", "--hardware", "h100-sxm", "--time-limit-s", "10"],
    ["profile", "crossover", "--hardware", "h100-sxm", "--model", "qwen3-235b-a22b"],
]  # fmt: skip
VOLATILE = {"elapsed_s", "solve_s", "solve_time_s", "wall_s", "time_s", "runtime_s"}


def run(cmd: list[str]) -> object:
    out = subprocess.run(
        [sys.executable, "-m", "cli.main", *cmd, "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    if out.returncode != 0:
        return {"exit": out.returncode, "stderr": out.stderr.strip()[-300:]}
    return json.loads(out.stdout)


def diff(a: object, b: object, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        # keys only in the new snapshot are additions (new output fields), not changes
        out = [f"{path}.{k}: removed" for k in a.keys() - b.keys() if k not in VOLATILE]
        for k in a.keys() & b.keys():
            if k not in VOLATILE:
                out += diff(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: length {len(a)} vs {len(b)}"]
        pairs = enumerate(zip(a, b, strict=True))
        return [d for i, (x, y) in pairs for d in diff(x, y, f"{path}[{i}]")]
    if isinstance(a, float | int) and isinstance(b, float | int) and not isinstance(a, bool):
        ok = math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) or (a != a and b != b)
        return [] if ok else [f"{path}: {a} -> {b}"]
    return [] if a == b else [f"{path}: {a!r} -> {b!r}"]


def main() -> int:
    ap = argparse.ArgumentParser()
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", type=Path)
    g.add_argument("--diff", type=Path)
    args = ap.parse_args()
    snap = {" ".join(c): run(c) for c in COMMANDS}
    if args.write:
        args.write.write_text(json.dumps(snap, indent=1, sort_keys=True))
        bad = [k for k, v in snap.items() if isinstance(v, dict) and "exit" in v]
        print(f"wrote {len(snap)} commands ({len(bad)} failed: {bad})")
        return 0
    before = json.loads(args.diff.read_text())
    moved = [d for k in before for d in diff(before[k], snap.get(k), k)]
    print("\n".join(moved[:200]) if moved else f"identical: {len(before)} commands")
    return 1 if moved else 0


if __name__ == "__main__":
    raise SystemExit(main())
