"""Speed acceptance figures (issue 14), with the machine's load before and after.

    PYTHONPATH=. python benchmarks/bench_speed.py [--only SECTION ...] [--repeats N]
        [--aiconfigurator BIN]

Sections: ``startup`` (``--help``, ``hardware list``, ``capacity``: wall and CPU, best and
median of N, the ``-X importtime`` total; the capacity job's compute after its imports),
``pd`` (the three PD questions of the issue: wall and CPU of the whole process, median;
with ``--aiconfigurator BIN`` the same questions asked of aiconfigurator 0.12.0's
``cli default``), ``gemm`` (``predict gemm`` on 10⁶ shapes: wall and peak RSS),
``sim`` (``run_engine`` iterations/s vs a bare heapq loop, see ``bench_simulate.py``),
``sweep`` (10⁵ configurations: serial vs a 2-process LocalCluster, then a run killed
halfway and resumed), ``plan`` (issue 16's plan command and ``perfmodel plan``: cold,
warm, and warm evaluations with the MILPs solved again), ``phase`` (``pd phase``: the
default grid, the SLO panel at 20 x 20; ``phase-lengths`` adds the length panel at
20 x 20, minutes; neither runs by default), ``stability`` (``phase stability``'s default
grid: forked, serial, LocalCluster; not by default). Every figure is a median over repeats: the
machine may be shared.
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

PD_CASES = [  # (label, model, hardware, ISL, OSL, rate req/s) at TTFT 1 s, TPOT 20 ms, 8 GPUs
    ("Qwen3-32B 8xH200 4000/1000", "qwen3-32b", "h200-sxm", 4000, 1000, 2.0),
    ("Llama-3.1-70B 8xH100 2048/512", "llama-3.1-70b", "h100-sxm", 2048, 512, 1.0),
    ("Qwen3-30B-A3B 8xH200 4000/1000", "qwen3-30b-a3b", "h200-sxm", 4000, 1000, 2.0),
]
AIC_ARGS = {  # the same questions for aiconfigurator 0.12.0 (`cli default`)
    "qwen3-32b": ["--model-path", "Qwen/Qwen3-32B", "--system", "h200_sxm"],
    "llama-3.1-70b": ["--model-path", "meta-llama/Meta-Llama-3.1-70B", "--system", "h100_sxm"],
    "qwen3-30b-a3b": ["--model-path", "Qwen/Qwen3-30B-A3B", "--system", "h200_sxm"],
}
SWEEP_SPEC = """chunk = 2000
[grid]
model = ["llama-3.1-8b", "llama-3.1-70b", "qwen3-30b-a3b", "mixtral-8x7b", "qwen3-32b"]
hardware = ["h100-sxm", "a100-sxm-80gb", "mi300x", "h200-sxm", "l40s"]
tp = [1, 2, 4, 8]
batch = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
input_len = [128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536]
output_len = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
"""  # 5·5·4·10·10·10 = 100,000 configurations


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def speed_index(rounds: int = 5) -> str:
    """The machine's speed now: the CPU seconds of a fixed pure-Python loop (3·10⁶ integer
    multiply-adds), best and median of ``rounds``. A shared VM's load average can read
    idle while this moves by 1.7x within minutes (0.28-0.50 s seen on the 2-core VM of
    2026-12-02): quote the figures below with it."""
    runs = []
    for _ in range(rounds):
        t, acc = time.process_time(), 0
        for i in range(3_000_000):
            acc += i * i
        runs.append(time.process_time() - t)
    return f"speed index {min(runs):.3f} / {statistics.median(runs):.3f} s (best / median)"


def timed(cmd: list[str], *, env: dict[str, str] | None = None) -> tuple[float, float, int]:
    """(wall s, CPU s user+system, exit code) of a child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, r.returncode


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "cli.main", *args]


def medians(cmd: list[str], repeats: int) -> tuple[float, float, int]:
    runs = [timed(cmd) for _ in range(repeats)]
    return (
        statistics.median(r[0] for r in runs),
        statistics.median(r[1] for r in runs),
        max(r[2] for r in runs),
    )


def import_seconds(args: list[str]) -> float:
    """Sum of the self times ``python -X importtime`` reports for ``perfmodel ARGS``: the
    import cost, less sensitive to a shared machine's load than the wall time."""
    cmd = [sys.executable, "-X", "importtime", "-m", "cli.main", *args]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    rows = [ln.split("|") for ln in r.stderr.splitlines() if ln.startswith("import time:")]
    return sum(int(c[0].split(":")[1]) for c in rows if c[0].split(":")[1].strip().isdigit()) / 1e6


#: the capacity job's work after its imports, timed inside one process (CPU and wall)
_COMPUTE = """
import io, os, sys, time, contextlib
import cli.main, cli.options, perfmodel.serving.capacity
t, c = time.perf_counter(), time.process_time()
with contextlib.redirect_stdout(io.StringIO()):
    try:
        cli.main.build_app(["capacity"])(["capacity"])
    except SystemExit:
        pass
print(time.perf_counter() - t, time.process_time() - c)
"""


def startup(repeats: int) -> None:
    print(f"\n== start-up ({repeats} runs: best / median; CPU = user + system)")
    for label, args, target in (
        ("perfmodel --help", ["--help"], 0.25),
        ("perfmodel hardware list", ["hardware", "list"], None),
        ("perfmodel capacity (README main job)", ["capacity"], 0.5),
    ):
        runs = [timed(cli(*args)) for _ in range(repeats)]
        walls, cpus = [r[0] for r in runs], [r[1] for r in runs]
        rc = max(r[2] for r in runs)
        goal = f"  (target <= {target} s wall on an idle machine)" if target else ""
        print(
            f"{label:38s} wall {min(walls):5.2f} / {statistics.median(walls):5.2f} s, "
            f"CPU {min(cpus):5.2f} / {statistics.median(cpus):5.2f} s, "
            f"imports {import_seconds(args):5.2f} s, exit {rc}{goal}"
        )
    out = [
        subprocess.run(
            [sys.executable, "-c", _COMPUTE], cwd=REPO, capture_output=True, text=True
        ).stdout.split()
        for _ in range(repeats)
    ]
    wall = min(float(o[0]) for o in out if o)
    cpu = min(float(o[1]) for o in out if o)
    print(
        f"{'capacity compute (after its imports)':38s} wall {wall:5.2f} s, CPU {cpu:5.2f} s (best)"
    )


def pd(repeats: int, aic: str | None, tmp: Path) -> None:
    print(f"\n== pd plan, TTFT 1 s / TPOT 20 ms, --max-gpus 8 (median of {repeats})")
    for label, model, hw, isl, osl, rate in PD_CASES:
        trace = tmp / f"isl{isl}_osl{osl}.csv"
        trace.write_text(f"input_tokens,output_tokens\n{isl},{osl}\n")
        cmd = cli(
            "pd", "plan", "--model", model, "--hardware", hw, "--trace", str(trace),
            "--rate-per-s", str(rate), "--ttft-slo-ms", "1000", "--tpot-slo-ms", "20",
            "--max-gpus", "8",
        )  # fmt: skip
        wall, cpu, rc = medians(cmd, repeats)
        line = f"{label:32s} perfmodel {wall:6.2f} s wall {cpu:6.2f} s CPU (exit {rc})"
        if aic:
            a = [aic, "cli", "default", *AIC_ARGS[model], "--total-gpus", "8"]
            a += ["--isl", str(isl), "--osl", str(osl), "--ttft", "1000", "--tpot", "20"]
            aw, ac, arc = timed(a)
            line += f"; aiconfigurator {aw:6.2f} s wall {ac:6.2f} s CPU (exit {arc})"
            line += f"; CPU ratio {ac / max(cpu, 1e-9):.1f}x"
        print(line)


def _grid(axis: str, lo: float, hi: float, n: int) -> str:
    """``--grid``'s ``n`` geometric values of ``axis`` from ``lo`` to ``hi`` (one axis of
    the 20 x 20 panels), as a list option."""
    from cli.validate import geometric_axis

    return ",".join(f"{v:g}" for v in geometric_axis(axis, [lo, hi], n))


def phase(repeats: int, tmp: Path, *, lengths20: bool) -> None:
    """Issue 14's ``pd phase`` item (a 20 x 20 grid per panel): the default grid (2
    workers, then serial), the SLO panel at 20 x 20 (beside a one-cell length panel) and,
    with ``lengths20``, the length panel at 20 x 20 (beside a one-cell SLO panel; once:
    minutes)."""
    out = str(tmp / "pd_phase.html")
    base = cli("pd", "phase", "--out", out, "--force")
    one = ["--inputs", "512", "--outputs", "128"]
    cases = [
        ("default grid, 2 workers", [*base, "--workers", "2"], repeats),
        ("default grid, serial", [*base, "--workers", "1"], repeats),
        (
            "SLO panel 20x20",
            [*base, *one, "--slo-scales", _grid("slo_scales", 0.25, 4, 20)],
            repeats,
        ),
    ]
    if lengths20:
        grid = [
            "--inputs",
            _grid("inputs", 128, 8192, 20),
            "--outputs",
            _grid("outputs", 32, 2048, 20),
        ]
        cases.append(("length panel 20x20", [*base, *grid, "--slo-scales", "1"], 1))
    print(f"\n== pd phase (median of {repeats}; the 20x20 length panel once)")
    for label, cmd, n in cases:
        wall, cpu, rc = medians(cmd, n)
        print(f"{label:26s} {wall:7.2f} s wall {cpu:7.2f} s CPU (exit {rc})  load: {uptime()}")


def gemm(tmp: Path) -> None:
    import numpy as np

    print("\n== predict gemm, 10^6 shapes (whole command)")
    rng = np.random.default_rng(0)
    n = 10**6
    mnk = rng.integers(1, 16384, size=(n, 3))
    dts = np.array(["bf16", "fp8", "", "fp16"])[rng.integers(0, 4, n)]
    src = tmp / "shapes.csv"
    with src.open("w") as f:
        f.write("m,n,k,dtype\n")
        f.writelines(f"{a},{b},{c},{d}\n" for (a, b, c), d in zip(mnk.tolist(), dts, strict=True))
    out = tmp / "pred.csv"
    probe = (
        "import resource, subprocess, sys; "
        "r = subprocess.run(sys.argv[1:], capture_output=True); "
        "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)"
    )
    walls, rss = [], []
    for _ in range(3):
        cmd = cli("predict", "gemm", "--hardware", "h100-sxm", "--input", str(src))
        cmd += ["--output", str(out), "--force"]
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-c", probe, *cmd], cwd=REPO, capture_output=True)
        walls.append(time.perf_counter() - t0)
        rss.append(int(r.stdout.split()[1]) / 1024)
    print(
        f"predict gemm 10^6 shapes: {statistics.median(walls):.2f} s wall, "
        f"{statistics.median(rss):.0f} MB peak RSS (median of 3; target <= 2 s, <= 200 MB)"
    )


def sim() -> None:
    from bench_simulate import engine_report

    print("\n== simulator loop")
    engine_report()


def _sweep_cmd(spec: Path, out: Path, scheduler: str) -> list[str]:
    cmd = cli("sweep", str(spec), "--out", str(out), "--scheduler", scheduler)
    return cmd + (["--workers", "2"] if scheduler == "local" else [])


def sweep(tmp: Path) -> None:
    print("\n== sweep, 100,000 configurations (static-batch estimates)")
    spec = tmp / "sweep.toml"
    spec.write_text(SWEEP_SPEC)
    serial, dist = tmp / "serial.jsonl", tmp / "dask.jsonl"
    ws, cs, rc1 = timed([*_sweep_cmd(spec, serial, "serial"), "--force"])
    wd, _cd, rc2 = timed([*_sweep_cmd(spec, dist, "local"), "--force"])
    same = serial.read_bytes() == dist.read_bytes()
    print(f"serial: {ws:.1f} s wall ({cs:.1f} s CPU, exit {rc1})")
    print(f"LocalCluster, 2 worker processes: {wd:.1f} s wall (exit {rc2}); {ws / wd:.2f}x")
    print(f"files identical: {same}")
    # kill halfway, then resume
    res = tmp / "resume.jsonl"
    done = res.with_name(res.name + ".done")
    p = subprocess.Popen(
        _sweep_cmd(spec, res, "local"), cwd=REPO, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    total = 50
    while p.poll() is None:
        if done.exists() and len(done.read_text().splitlines()) - 1 >= total // 2:
            os.killpg(p.pid, signal.SIGKILL)  # the CLI and its worker processes
            break
        time.sleep(0.2)
    p.wait()
    before = len(done.read_text().splitlines()) - 1
    r = subprocess.run(
        [*_sweep_cmd(spec, res, "local"), "--json"], cwd=REPO, capture_output=True, text=True
    )
    import json

    d = json.loads(r.stdout) if r.returncode == 0 else {}
    print(
        f"killed with {before}/{total} chunks on disk; the restart computed "
        f"{d.get('computed_chunks')} and found {d.get('resumed_chunks')} done; "
        f"result identical to serial: {res.read_bytes() == serial.read_bytes()}"
    )


PLAN_ISSUE = [  # issue 16's command
    "plan", "--model", "llama-3.1-70b", "--workload", "chat", "--rate-per-s", "50",
    "--ttft-slo-ms", "1000", "--tpot-slo-ms", "50",
    "--devices", "h100-sxm,h200-sxm,a100-sxm-80gb,l40s,mi300x", "--json",
]  # fmt: skip


def plan(repeats: int, tmp: Path) -> None:
    """Issue 16: the plan command cold (a fresh empty cache each run), warm (evaluations
    and MILP solutions cached) and with cached evaluations but the MILPs solved again
    (what a new --rate-per-s costs); ``perfmodel plan`` (README main job) cold and warm."""
    import shutil

    print(f"\n== plan (wall and CPU of the whole process, median of {repeats})")
    readme = ["--no-limits", "plan"]  # cold on a loaded machine it can pass the 50 s limit
    for label, args in (("issue 16 command", PLAN_ISSUE), ("perfmodel plan (README)", readme)):
        rows = []
        for mode in ("cold", "warm", "warm evaluations, MILPs solved"):
            runs = []
            for i in range(repeats):
                d = tmp / f"plan-{label[:5]}-{mode[:4]}-{i if mode == 'cold' else 0}"
                if mode != "cold" and not d.exists():
                    timed(cli(*args), env={**os.environ, "PERFMODEL_CACHE_DIR": str(d)})
                if mode.startswith("warm evaluations"):
                    shutil.rmtree(d / "fleet-milp", ignore_errors=True)
                runs.append(timed(cli(*args), env={**os.environ, "PERFMODEL_CACHE_DIR": str(d)}))
            wall = statistics.median(r[0] for r in runs)
            cpu = statistics.median(r[1] for r in runs)
            rows.append(f"  {mode:32s} {wall:6.2f} s wall {cpu:6.2f} s CPU "
                        f"(exit {max(r[2] for r in runs)})")  # fmt: skip
        print(f"{label} (target <= 2 s wall cold and warm, 2 idle cores):")
        print("\n".join(rows))


def stability(repeats: int, tmp: Path) -> None:
    """Issue 14's ``phase stability`` item: its default grid (10,080 cells, 24 simulated
    points), the jobs in two forked workers (the default), serially, and on a 2-process
    LocalCluster."""
    out = str(tmp / "stability.html")
    base = cli("phase", "stability", "--out", out, "--force")
    print(f"\n== phase stability, default grid (median of {repeats})")
    for label, extra in (
        ("2 forked workers", []),
        ("serial", ["--workers", "1"]),
        ("LocalCluster, 2 workers", ["--scheduler", "local", "--workers", "2"]),
    ):
        wall, cpu, rc = medians([*base, *extra], repeats)
        print(f"{label:26s} {wall:7.2f} s wall {cpu:7.2f} s CPU (exit {rc})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=["startup", "pd", "gemm", "sim", "sweep", "plan"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--aiconfigurator", help="aiconfigurator 0.12.0 executable (own venv)")
    a = ap.parse_args()
    print("load:", uptime(), "|", speed_index())
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        if "startup" in a.only:
            startup(a.repeats)
        if "pd" in a.only:
            pd(max(a.repeats // 2, 1), a.aiconfigurator, tmp)
        if "gemm" in a.only:
            gemm(tmp)
        if "sim" in a.only:
            sim()
        if "sweep" in a.only:
            sweep(tmp)
        if "plan" in a.only:
            plan(max(a.repeats // 2, 1), tmp)
        if "stability" in a.only:
            stability(max(a.repeats // 2, 1), tmp)
        if "phase" in a.only or "phase-lengths" in a.only:
            phase(max(a.repeats // 2, 1), tmp, lengths20="phase-lengths" in a.only)
    print("\nload:", uptime(), "|", speed_index())


if __name__ == "__main__":
    main()
