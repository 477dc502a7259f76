"""`predict gemm` bulk I/O: numpy's reader for clean files, the row reader for the rest."""

import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from cli.main import app
from hardware.gemm_predict import read_gemm_shapes

runner = CliRunner()

# 2·m·n·k FLOP at 80 % of the H100's 989.4 TFLOP/s bf16 peak, plus the 5 µs launch floor
BIG_MS = (2 * 4096**3 / (0.8 * 989.4e12) + 5e-6) * 1e3


def run(*args: str) -> tuple[int, str, str]:
    r = runner.invoke(app, list(args))
    return r.exit_code, r.stdout, r.stderr


def _shapes_file(tmp_path: Path, rows: int, *, extra: str = "") -> Path:
    rng = np.random.default_rng(7)
    mnk = rng.integers(1, 8192, size=(rows, 3))
    dts = np.array(["bf16", "fp8", "", "fp16", "bfloat16"])[rng.integers(0, 5, rows)]
    p = tmp_path / "shapes.csv"
    body = "".join(f"{a},{b},{c},{d}\n" for (a, b, c), d in zip(mnk.tolist(), dts, strict=True))
    p.write_text("m,n,k,dtype\n" + body + extra)
    return p


def test_bulk_reader_agrees_with_the_row_reader(tmp_path: Path) -> None:
    p = _shapes_file(tmp_path, 3000)
    bulk = read_gemm_shapes(p)
    rows = read_gemm_shapes(p, keep_rows=True)
    assert bulk.bulk and not rows.bulk
    np.testing.assert_array_equal(bulk.shapes, rows.shapes)
    assert bulk.dtypes.tolist() == rows.dtypes.tolist()
    assert set(bulk.dtypes.tolist()) == {"bf16", "fp8", "fp16"}  # '' and bfloat16 -> bf16


def test_output_copies_every_row_and_appends_the_roofline_time(tmp_path: Path) -> None:
    p = _shapes_file(tmp_path, 3000, extra="\n4096,4096,4096,bf16\n\n")  # blank lines skipped
    out = tmp_path / "out.csv"
    code, _, err = run(
        "predict", "gemm", "--hardware", "h100-sxm", "--input", str(p), "--output", str(out)
    )
    assert code == 0, err
    got = list(csv.DictReader(io.StringIO(out.read_text())))
    src = [r for r in csv.DictReader(io.StringIO(p.read_text())) if any(r.values())]
    assert len(got) == len(src) == 3001
    assert all(
        {k: r[k] for k in ("m", "n", "k", "dtype")} == s for r, s in zip(got, src, strict=True)
    )
    assert float(got[-1]["latency_ms"]) == pytest.approx(BIG_MS, rel=1e-4)
    # same numbers as the JSON path (row reader)
    code, js, _ = run("predict", "gemm", "--hardware", "h100-sxm", "--input", str(p), "--json")

    ref = np.array([d["latency_ms"] for d in json.loads(js)])
    np.testing.assert_allclose([float(r["latency_ms"]) for r in got], ref, rtol=1e-5)


def test_a_measured_latency_column_is_kept(tmp_path: Path) -> None:
    p = tmp_path / "m.csv"
    p.write_text("m,n,k,latency_ms\n4096,4096,4096,0.25\n")
    code, out, err = run("predict", "gemm", "--hardware", "h100-sxm", "--input", str(p))
    assert code == 0, err
    (row,) = csv.DictReader(io.StringIO(out))
    assert row["latency_ms"] == "0.25"
    assert float(row["predicted_latency_ms"]) == pytest.approx(BIG_MS, rel=1e-4)
    p.write_text("m,n,k,latency_ms,predicted_latency_ms\n1,2,3,4,5\n")
    code, _, err = run("predict", "gemm", "--hardware", "h100-sxm", "--input", str(p))
    assert code == 2 and "rename one" in err


@pytest.mark.parametrize(
    ("bad", "needle"),
    [
        ("7,8,x,bf16", ":1502: k = 'x' is not an integer"),
        ("7,-8,9,bf16", ":1502: n = -8 must be >= 1"),
        ("7.5,8,9,bf16", ":1502: m = '7.5' is not an integer"),
        ("7,8,9,fp9", ":1502: unknown dtype 'fp9'"),
    ],
)
def test_a_bad_row_in_a_large_file_is_named(tmp_path: Path, bad: str, needle: str) -> None:
    good = _shapes_file(tmp_path, 3000).read_text().splitlines(keepends=True)
    p = tmp_path / "bad.csv"
    p.write_text("".join([*good[:1501], bad + "\n", *good[1501:]]))  # line 1502 of the file
    code, _, err = run("predict", "gemm", "--hardware", "h100-sxm", "--input", str(p))
    assert code == 2 and needle in err and "Traceback" not in err


@pytest.mark.parametrize("block_chars", [7, 64, 1 << 22])
def test_copy_through_keeps_every_line_at_any_block_size(tmp_path: Path, block_chars) -> None:
    """Lines cut by a block boundary are joined again; CRLF line ends dropped, empty
    lines skipped as the row reader skips them, blanks inside fields kept; every row gets
    its own prediction."""
    p = tmp_path / "s.csv"
    p.write_bytes(b"m,n,k\r\n1,2,3\r\n\r\n40, 50,60\r\n\r\n7,8,9")  # no final newline
    from hardware import gemm_predict as gp

    data = read_gemm_shapes(p)
    assert data.bulk and data.shapes.tolist() == [[1, 2, 3], [40, 50, 60], [7, 8, 9]]
    with p.open(encoding="utf-8-sig", newline=None) as f:  # as csv_chunks reads it
        f.readline()
        lines = [ln for b in gp._line_blocks(f, block_chars) for ln in b]
    assert lines == ["1,2,3", "40, 50,60", "7,8,9"]
    text = "".join(gp.csv_chunks(p, data, "latency_ms", np.array([0.5, 1 / 3, 2e-7])))
    assert text == "m,n,k,latency_ms\n1,2,3,0.5\n40, 50,60,0.333333\n7,8,9,2e-07\n"


def test_integers_written_as_floats_are_read_in_bulk(tmp_path: Path) -> None:
    """``1024.0`` is not an int64 for numpy: the float pass takes it (still in bulk)."""
    p = tmp_path / "f.csv"
    p.write_text("m,n,k,dtype\n4096.0,4096,4096,bf16\n1,2,3e0,fp8\n")
    data = read_gemm_shapes(p)
    assert data.bulk and data.shapes.tolist() == [[4096, 4096, 4096], [1, 2, 3]]
    assert data.dtypes.tolist() == ["bf16", "fp8"]


@pytest.mark.parametrize("raw", [b"m,n,k\r1,2,3\r4,5,6\r", b"m,n,k\r\r\n1,2,3\r\r\n4,5,6\r\r\n"])
def test_cr_line_ends_keep_every_row(tmp_path: Path, raw: bytes) -> None:
    """CR-only (old Mac) and CR CR LF line ends: one output row per input row, no stray
    CR (numpy's reader splits them so; the copy-through must too)."""
    p = tmp_path / "cr.csv"
    p.write_bytes(raw)
    code, out, err = run("predict", "gemm", "--hardware", "h100-sxm", "--input", str(p))
    assert code == 0, err
    rows = out.split("\n")
    assert rows[0] == "m,n,k,latency_ms" and "\r" not in out
    assert [r.rsplit(",", 1)[0] for r in rows[1:3]] == ["1,2,3", "4,5,6"] and rows[3] == ""


def test_non_ascii_fields_do_not_crash_the_reader(tmp_path: Path) -> None:
    """numpy 2.4's int64 parser segfaults, within a few hundred reads, on a field with
    characters beyond the BMP (found by tests/fuzz): such files skip the integer pass.
    In a child process, so that a crash fails this test and not the run."""
    import subprocess
    import sys

    from tests.conftest import REPO

    p = tmp_path / "u.csv"
    p.write_bytes(b"m,n,k,dtype\n\xf3\xa5\x98\x89\xf4\x84\x9d\xb5$,0,0\n")
    code = (
        "import sys; from pathlib import Path; from hardware.gemm_predict import "
        "read_gemm_shapes; from perfmodel.errors import SpecError\n"
        "for _ in range(400):\n"
        "    try: read_gemm_shapes(Path(sys.argv[1]))\n"
        "    except SpecError: pass\n"
        "print('ok')"
    )
    r = subprocess.run([sys.executable, "-c", code, str(p)], cwd=REPO, capture_output=True)
    assert r.returncode == 0 and r.stdout.strip() == b"ok", r.stderr[-300:]
