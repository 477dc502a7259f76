"""`perfmodel sweep`: grid enumeration, rows equal to `estimate`, resume, Dask = serial."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from hardware.device import load_device
from hardware.engine import engine_for
from perfmodel.errors import SpecError
from perfmodel.estimate import estimate
from perfmodel.model import load_model
from perfmodel.plan import ParallelPlan
from perfmodel.step.instance import Instance
from perfmodel.units import ms
from reports.sweep.evaluate import evaluate_chunk
from reports.sweep.run import run_sweep
from reports.sweep.spec import spec_from_dict

runner = CliRunner()

GRID = {
    "model": ["llama-3.1-8b", "qwen3-30b-a3b"],
    "hardware": "h100-sxm",
    "tp": [1, 2],
    "pp": [1, 2],
    "batch": [1, 7, 64],
    "input_len": [128, 2048],
    "output_len": [1, 2, 33],
}  # 2·2·2·3·2·3 = 144 configurations


def _spec(chunk: int = 40, **grid: object):  # type: ignore[no-untyped-def]
    return spec_from_dict({"chunk": chunk, "grid": {**GRID, **grid}})


def test_grid_is_enumerated_last_axis_fastest() -> None:
    s = _spec()
    assert (s.size, s.chunks) == (144, 4)
    assert list(s.chunk_range(3)) == list(range(120, 144))
    c = s.config(0)
    assert (c["model"], c["tp"], c["pp"], c["batch"], c["input_len"], c["output_len"]) == (
        "llama-3.1-8b", 1, 1, 1, 128, 1,
    )  # fmt: skip
    # 1·(output) + 3·(input) + 6·(batch) + 18·(pp) + 36·(tp) + 72·(model)
    c = s.config(1 * 2 + 1 * 3 + 2 * 6 + 1 * 18 + 0 * 36 + 1 * 72)
    assert (c["model"], c["tp"], c["pp"], c["batch"], c["input_len"], c["output_len"]) == (
        "qwen3-30b-a3b", 1, 2, 64, 2048, 33,
    )  # fmt: skip
    assert c["dtype"] == "bf16"  # fixed parameters take estimate's defaults


@pytest.mark.parametrize("engine", ["auto", "none", "vllm"])
def test_rows_equal_estimate_exactly(engine: str) -> None:
    s = _spec(engine=engine)
    rows = [r for c in range(s.chunks) for r in evaluate_chunk(s, c)]
    assert [r["index"] for r in rows] == list(range(s.size))
    want = {"auto": "trtllm", "none": "none", "vllm": "vllm"}[engine]  # auto on an H100
    assert {r["engine_id"] for r in rows} == {want}
    for r in rows[::5]:
        plan = ParallelPlan(tp=r["tp"], pp=r["pp"])
        dev = load_device(r["hardware"])
        e = estimate(
            Instance(load_model(r["model"]), dev, plan, engine=engine_for(r["engine"], dev)),
            batch=r["batch"],
            input_len=r["input_len"],
            output_len=r["output_len"],
        )
        assert r["ttft_ms"] == ms(e.ttft_s)
        assert r["tpot_ms"] == ms(e.tpot_s)
        assert r["e2e_ms"] == ms(e.e2e_s)
        assert r["output_tokens_per_s"] == e.output_tokens_per_s
        assert r["decode_arith_intensity_flop_per_byte"] == e.decode_arith_intensity
        assert (r["fits"], r["kv_capacity_tokens"]) == (e.memory.fits, e.memory.kv_capacity_tokens)


def test_a_configuration_that_cannot_run_gets_an_error_row() -> None:
    s = _spec(tp=[3], model=["llama-3.1-8b"], pp=[1])  # 32 heads: TP 3 does not divide them
    rows = evaluate_chunk(s, 0)
    assert rows and all("error" in r and "ttft_ms" not in r for r in rows)
    assert "tp" in rows[0]["error"].lower()


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"grid": {**GRID, "speed": [1]}}, "unknown grid parameter(s) ['speed']"),
        ({"grid": {**GRID, "batch": []}}, "grid.batch is an empty list"),
        ({"grid": {**GRID, "tp": [0, 1]}}, "grid.tp = 0: must be a positive integer"),
        ({"grid": {k: v for k, v in GRID.items() if k != "input_len"}}, "input_len is required"),
        ({"chunk": 0, "grid": GRID}, "chunk = 0 must be a positive integer"),
        ({"grid": GRID, "extra": 1}, "unknown top-level key(s) ['extra']"),
    ],
)
def test_bad_specs_say_what_to_change(data: dict[str, object], needle: str) -> None:
    with pytest.raises(SpecError, match=None) as e:
        spec_from_dict(data)
    assert needle in str(e.value)


def _toml(tmp_path: Path, grid: dict[str, object], chunk: int = 40) -> Path:
    lines = [f"chunk = {chunk}", "[grid]"] + [f"{k} = {json.dumps(v)}" for k, v in grid.items()]
    p = tmp_path / "spec.toml"
    p.write_text("\n".join(lines) + "\n")
    return p


def test_cli_errors_exit_2_with_one_line(tmp_path: Path) -> None:
    out = tmp_path / "r.jsonl"
    bad = _toml(tmp_path, {**GRID, "model": ["llama-9"]})
    r = runner.invoke(app, ["sweep", str(bad), "--out", str(out), "--scheduler", "serial"])
    assert r.exit_code == 2 and "llama-9" in r.stderr and "Traceback" not in r.stderr
    out.write_text("something\n")
    good = _toml(tmp_path, GRID)
    r = runner.invoke(app, ["sweep", str(good), "--out", str(out), "--scheduler", "serial"])
    assert r.exit_code == 2 and "--force" in r.stderr
    assert out.read_text() == "something\n"


class _Crash(Exception):
    pass


def test_an_interrupted_sweep_resumes_with_only_the_missing_chunks(tmp_path: Path) -> None:
    s = _spec(chunk=30)  # 5 chunks
    ref = tmp_path / "ref.jsonl"
    run_sweep(s, ref)
    out = tmp_path / "out.jsonl"
    seen = []

    def crash_after_two(n: int) -> None:
        seen.append(n)
        if len(seen) == 2:
            raise _Crash

    with pytest.raises(_Crash):
        run_sweep(s, out, progress=crash_after_two)
    assert len(out.read_text().splitlines()) == 60  # two chunks on disk
    with out.open("a") as f:  # a crash mid-write leaves a cut line: it is truncated
        f.write('{"index": 60, "mod')
    again = run_sweep(s, out)
    assert (again.resumed_chunks, again.computed_chunks) == (2, 3)
    assert out.read_bytes() == ref.read_bytes()
    done = run_sweep(s, out)  # nothing left to do
    assert (done.resumed_chunks, done.computed_chunks) == (5, 0)
    with pytest.raises(SpecError, match="different sweep"):
        run_sweep(_spec(chunk=31), out)


def test_the_command_resumes_into_its_own_file(tmp_path: Path) -> None:
    """`perfmodel sweep` again on the file of a stopped sweep (no --force): only the
    missing chunks run, and the file equals an uninterrupted one. A file the sweep did not
    write is still refused (test_cli_errors_exit_2_with_one_line)."""
    spec = _toml(tmp_path, GRID, chunk=30)  # 144 configurations, 5 chunks
    ref, out = tmp_path / "ref.jsonl", tmp_path / "out.jsonl"
    args = ["sweep", str(spec), "--scheduler", "serial", "--json", "--out"]
    assert runner.invoke(app, [*args, str(ref)]).exit_code == 0
    seen: list[int] = []

    def crash_after_two(n: int) -> None:
        seen.append(n)
        if len(seen) == 2:
            raise _Crash

    from reports.sweep.spec import load_spec

    with pytest.raises(_Crash):
        run_sweep(load_spec(spec), out, progress=crash_after_two)
    r = runner.invoke(app, [*args, str(out)])
    assert r.exit_code == 0, r.stderr
    got = json.loads(r.stdout)
    assert (got["resumed_chunks"], got["computed_chunks"]) == (2, 3)
    assert out.read_bytes() == ref.read_bytes()
    r = runner.invoke(app, [*args, str(out)])  # finished: nothing to do, nothing changed
    assert json.loads(r.stdout)["computed_chunks"] == 0 and out.read_bytes() == ref.read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_a_local_dask_cluster_of_two_processes_writes_the_serial_file(
    tmp_path: Path, suffix: str
) -> None:
    pytest.importorskip("dask.distributed")  # the optional extra (in .[test])
    s = _spec(chunk=20)  # 8 chunks over 2 workers
    serial, dist = tmp_path / f"serial{suffix}", tmp_path / f"dask{suffix}"
    run_sweep(s, serial, scheduler="serial")
    r = run_sweep(s, dist, scheduler="local", workers=2)
    assert (r.workers, r.computed_chunks) == (2, 8)
    assert dist.read_bytes() == serial.read_bytes()


@pytest.mark.slow
def test_the_cluster_workers_keep_freed_heap(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The LocalCluster's worker processes start with ``MALLOC_TOP_PAD_`` set (glibc reads
    it at a process's start: set after the cluster is up, it would reach no worker), as
    this process has it; a setting of the user's own is kept."""
    pytest.importorskip("dask.distributed")

    import reports.cluster as cl
    from reports.cluster import HEAP_PAD_BYTES

    seen: list[dict] = []
    real = cl.open_client

    def client(scheduler: str, workers: int | None):  # type: ignore[no-untyped-def]
        c, cluster, n = real(scheduler, workers)
        seen.append(c.run(lambda: os.environ.get("MALLOC_TOP_PAD_")))
        return c, cluster, n

    monkeypatch.setattr(cl, "open_client", client)
    for name in ("MALLOC_TOP_PAD_", "MALLOC_MMAP_THRESHOLD_"):  # restored after the test
        monkeypatch.setenv(name, "0")
        monkeypatch.delenv(name)
    run_sweep(_spec(chunk=40), tmp_path / "a.jsonl", scheduler="local", workers=2)
    assert len(seen) == 1 and len(seen[0]) == 2
    assert set(seen[0].values()) == {str(HEAP_PAD_BYTES)} == {os.environ["MALLOC_TOP_PAD_"]}
    monkeypatch.setenv("MALLOC_TOP_PAD_", "1048576")
    run_sweep(_spec(chunk=40), tmp_path / "b.jsonl", scheduler="local", workers=2)
    assert set(seen[1].values()) == {"1048576"}


_FAULTS = """
import resource, sys
import numpy as np
if sys.argv[1] == "pad":
    from reports.cluster import keep_freed_heap
    keep_freed_heap()
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
sizes = [1 << 19, 1 << 21, 3 << 20]  # arrays of 4, 16 and 24 MiB
for _ in range(2):
    for n in sizes:
        a = np.ones(n); del a
f0 = faults()
for _ in range(10):
    for n in sizes:
        a = np.ones(n); b = np.ones(n); del a, b
print((faults() - f0) / 60)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_heap_is_reused_without_page_faults() -> None:
    """In a fresh process, arrays of 4-24 MiB allocated and freed over and over: without
    the sweep's heap settings each allocation faults hundreds of its pages in anew (the
    kernel's share of a chunk's time); with them a few dozen, whatever size."""
    import subprocess

    from tests.conftest import REPO

    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    per_alloc = {
        mode: float(
            subprocess.run(
                [sys.executable, "-c", _FAULTS, mode], cwd=REPO, env=env, check=True,
                capture_output=True, text=True,
            ).stdout
        )
        for mode in ("none", "pad")
    }  # fmt: skip
    assert per_alloc["none"] > 200  # of 1,024-6,144 pages
    assert per_alloc["pad"] < 64


def test_a_sweep_stopped_before_its_first_chunk_restarts(tmp_path: Path) -> None:
    """A record with only its header (stopped before the first chunk), an empty record
    (killed before it was flushed), or a record whose results file is gone: the rerun
    starts over without --force. A record that is not one: one line, exit 2."""
    from reports.sweep.run import fingerprint, manifest_path
    from reports.sweep.spec import load_spec

    spec = _toml(tmp_path, GRID, chunk=30)
    out = tmp_path / "o.jsonl"
    man = manifest_path(out)
    args = ["sweep", str(spec), "--scheduler", "serial", "--json", "--out", str(out)]
    head = json.dumps({"fingerprint": fingerprint(load_spec(spec), "jsonl"), "chunks": 5})
    for record, results in ((head + "\n", ""), ("", ""), (head + "\n", None)):
        man.write_text(record)
        out.unlink(missing_ok=True)
        if results is not None:
            out.write_text(results)
        r = runner.invoke(app, args)
        assert r.exit_code == 0, r.stderr
        assert json.loads(r.stdout)["computed_chunks"] == 5
        assert len(out.read_text().splitlines()) == 144
    man.write_text("not json\n")
    r = runner.invoke(app, args)
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "not a sweep's record" in r.stderr


@pytest.mark.parametrize("where", [".", "/", ""])
def test_sweep_out_a_directory_is_one_line(tmp_path: Path, where: str) -> None:
    spec = _toml(tmp_path, GRID)
    r = runner.invoke(app, ["sweep", str(spec), "--scheduler", "serial", "--out", where])
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "directory" in r.stderr or "file name" in r.stderr


@pytest.mark.slow
def test_a_stopped_cluster_sweep_kills_its_running_chunks(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """At the time limit the LocalCluster's workers are killed, not waited for: one chunk
    here takes far longer than the limit (a graceful close waited for it)."""
    pytest.importorskip("dask.distributed")
    import time

    # one chunk of 387,072 configurations: 12 s serial on an idle 2-core machine of 2026-12 (the
    # limit must stay well below it on faster ones)
    grid = {**GRID, "batch": list(range(1, 65)), "input_len": list(range(128, 8192, 32))}
    spec = _toml(tmp_path, grid, chunk=10**6)
    monkeypatch.setenv("PERFMODEL_TIME_LIMIT_S", "4")
    t0 = time.monotonic()
    r = runner.invoke(
        app, ["sweep", str(spec), "--out", str(tmp_path / "o.jsonl"), "--workers", "2",
              "--scheduler", "local"],
    )  # fmt: skip
    assert r.exit_code == 2 and "time limit" in r.stderr
    # killed: ~1.5 s past the limit (the alarm, then the cluster's close); waited for
    # (the close before): ~4.5 s past it
    assert time.monotonic() - t0 < 4 + 3


def test_serial_sweeps_do_not_need_dask(tmp_path: Path) -> None:
    """Without the dask extra the same code runs serially: a serial sweep never imports it."""
    import subprocess

    from tests.conftest import REPO

    spec = _toml(tmp_path, {**GRID, "model": ["llama-3.1-8b"], "pp": [1]})
    code = (
        "import sys; from typer.testing import CliRunner; from cli.main import app; "
        f"r = CliRunner().invoke(app, ['sweep', {str(spec)!r}, '--out', "
        f"{str(tmp_path / 'o.jsonl')!r}, '--scheduler', 'serial']); "
        "assert r.exit_code == 0, r.output; "
        "print('dask' in sys.modules, 'distributed' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]
    assert len((tmp_path / "o.jsonl").read_text().splitlines()) == 36  # 2·3·2·3 configurations


@pytest.mark.parametrize("command", ["sweep", "pd phase"])
def test_a_scheduler_that_does_not_answer_is_one_line_and_no_file(
    tmp_path: Path, monkeypatch, command: str
) -> None:  # type: ignore[no-untyped-def]
    """A scheduler address nobody listens on: after the connect timeout, one line naming
    the address and what to do, exit 2, and neither the results nor their record."""
    pytest.importorskip("dask.distributed")
    import reports.cluster as cl

    monkeypatch.setattr(cl, "CONNECT_TIMEOUT_S", 1)
    spec = _toml(tmp_path, GRID)
    out = tmp_path / ("o.jsonl" if command == "sweep" else "o.html")
    args = [str(spec)] if command == "sweep" else ["--inputs", "128,512", "--outputs", "32"]
    r = runner.invoke(
        app, [*command.split(), *args, "--out", str(out), "--scheduler", "tcp://127.0.0.1:9"]
    )
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("error: no Dask scheduler answers at tcp://127.0.0.1:9 within 1 s")
    assert list(tmp_path.iterdir()) == [spec]


@pytest.mark.parametrize("address", ["http://a:1", "tcp://h:notaport"])
def test_an_address_dask_cannot_read_is_one_line(tmp_path: Path, address: str) -> None:
    pytest.importorskip("dask.distributed")
    out = tmp_path / "o.html"
    r = runner.invoke(app, ["pd", "phase", "--inputs", "128,512", "--outputs", "32",
                            "--out", str(out), "--scheduler", address])  # fmt: skip
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith(f"error: --scheduler {address} is not a scheduler address")
    assert not out.exists()
