"""Every reproducer of the hardening issue: exit 2 and one clear line, or the right answer."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from tests.fuzz.corpus import GOOD_CONFIG, GOOD_DEVICE, refused

runner = CliRunner()


@pytest.fixture()
def d(tmp_path: Path) -> Path:
    (tmp_path / "cfg_binary.json").write_bytes(bytes(range(256)))
    (tmp_path / "shapes_utf16.csv").write_bytes("m,n,k\n1,2,3\n".encode("utf-16"))
    (tmp_path / "cfg_nan.json").write_text(json.dumps(GOOD_CONFIG).replace("4096", "NaN", 1))
    (tmp_path / "cfg_inf.json").write_text(json.dumps(GOOD_CONFIG).replace("4096", "Infinity", 1))
    (tmp_path / "deep.json").write_text("[" * 200_000)
    (tmp_path / "deep.toml").write_text("a = " + "{b = " * 3000 + "1" + "}" * 3000)
    (tmp_path / "shapes_inf.csv").write_text("m,n,k\ninf,1024,1024\n")
    (tmp_path / "shapes.csv").write_text("m,n,k\n1024,1024,1024\n")
    (tmp_path / "gemm.csv").write_text(
        "m,n,k,latency_ms\n"
        + "".join(f"{m},1024,1024,{0.01 + m / 1e5:.6g}\n" for m in (1, 64, 4096))
    )
    (tmp_path / "neg_peers.toml").write_text(GOOD_DEVICE.replace("peers = 7", "peers = -3"))
    for name, extra in (
        ("bert", {"model_type": "bert", "architectures": ["BertForMaskedLM"]}),
        ("mamba", {"model_type": "mamba"}),
        ("jamba", {"model_type": "jamba", "attn_layer_period": 8}),
        ("qwen3_next", {"layer_types": ["linear_attention"] * 3 + ["full_attention"]}),
    ):
        (tmp_path / f"{name}.json").write_text(json.dumps({**GOOD_CONFIG, **extra}))
    return tmp_path


TRACEBACKS = [
    (["model", "show", "{d}/cfg_binary.json"], "is not UTF-8 text"),
    (["predict", "gemm", "--hardware", "h100-sxm", "--input", "{d}/shapes_utf16.csv"], "UTF-16"),
    (["model", "show", "{d}/cfg_nan.json"], "NaN is not a number"),
    (["model", "show", "{d}/cfg_inf.json"], "Infinity is not a number"),
    (["model", "show", "{d}/deep.json"], "nested deeper than 64 levels"),
    (["hardware", "show", "{d}/deep.toml"], "nested deeper than 64 levels"),
    (["predict", "gemm", "--hardware", "h100-sxm", "--input", "{d}/shapes_inf.csv"],
     ":2: m = 'inf' is not an integer"),
    (["predict", "gemm", "--hardware", "h100-sxm", "--input", "{d}/shapes.csv", "--output",
      "{d}", "--force"], "is a directory"),
    (["profile", "plot", "--data", "{d}/gemm.csv", "--hardware", "h100-sxm", "--profile",
      "h100-sxm:gemm_bf16", "--out", "{d}", "--force"], "is a directory"),
    (["cache", "plan", "--out", "{d}", "--force"], "is a directory"),
    (["predict", "gemm", "--hardware", "h100-sxm", "--input", "{d}/shapes.csv", "--output",
      "/proc/x.csv"], "cannot write in /proc"),
    (["phase", "stability", "--out", "/proc/x.html"], "cannot write in /proc"),
    (["estimate", "--output-len", "99999999999999999999"], "--output-len must be <="),
    (["capacity", "--arrival-cv", "1e300"], "--arrival-cv must be <= 1000"),
    (["simulate", "--seed", "-1"], "--seed must be a non-negative integer"),
    (["dispatch", "phase", "--model", "mixtral-8x7b", "--skews", "-1", "--out", "{d}/x.html"],
     "--skews: '-1' must be >= 0"),
    (["dispatch", "phase", "--model", "mixtral-8x7b", "--skews", "nan", "--out", "{d}/x.html"],
     "--skews: 'nan' is not a finite number"),
    (["pd", "phase", "--workload", "chat", "--outputs", "-5", "--out", "{d}/x.html"],
     "--outputs: '-5' must be >= 1"),
    (["pd", "phase", "--workload", "chat", "--outputs", "nan", "--out", "{d}/x.html"],
     "--outputs: 'nan' is not a finite number"),
    (["pd", "plan", "--workload", "chat", "--kv-link", "carrier-pigeon"], "--kv-link must be"),
    (["dispatch", "phase", "--model", "mixtral-8x7b", "--gpus-per-node", "0", "--out",
      "{d}/x.html"], "--gpus-per-node must be a positive integer"),
    (["dispatch", "place", "--model", "mixtral-8x7b", "--migration-cost-us", "nan"],
     "--migration-cost-us: nan is not a finite number"),
]  # fmt: skip

HANGS = [
    (["simulate", "--requests", "1000000000"], "over the work limit"),
    (["simulate", "--max-batched-tokens", "1"], "needs at least"),
    (["cache", "plan", "--adapters", "1000000000"], "over the work limit"),
    (["cache", "plan", "--kv-levels", "100000"], "--kv-levels must be <= 10000"),
    (["dispatch", "solve", "--model", "mixtral-8x7b", "--tokens", "10000000000", "--method",
      "heuristic"], "over the work limit"),
]  # fmt: skip

WRONG_ANSWERS = [
    (["hardware", "show", "{d}/neg_peers.toml"], "'peers' must be a whole number >= 0, got -3"),
    (["model", "show", "{d}/bert.json"], "is encoder-only"),
    (["model", "show", "{d}/mamba.json"], "state-space (Mamba) layers"),
    (["model", "show", "{d}/jamba.json"], "state-space (Mamba) layers"),
    (["model", "show", "{d}/qwen3_next.json"], "layer_types has 4 entries for 32 layers"),
    (["dispatch", "place", "--model", "mixtral-8x7b", "--tokens", "0"],
     "--tokens must be a positive integer"),
    (["estimate", "--tp", "nan"], "--tp: 'nan' is not an integer"),
]  # fmt: skip


def _args(args: list[str], d: Path) -> list[str]:
    return [a.replace("{d}", str(d)) for a in args]


@pytest.mark.parametrize(("args", "needle"), TRACEBACKS + HANGS + WRONG_ANSWERS)
def test_reproducer_is_one_clear_line(d: Path, args: list[str], needle: str) -> None:
    t0 = time.monotonic()
    line = refused(_args(args, d))
    assert needle in line, line
    assert time.monotonic() - t0 < 10  # refused up front, not after minutes of work


def test_typer_usage_error_is_exactly_one_line() -> None:
    r = runner.invoke(app, ["estimate", "--tp", "nan"])
    assert r.exit_code == 2 and r.stderr == "error: --tp: 'nan' is not an integer\n"


@pytest.mark.parametrize(
    ("args", "header"),
    [
        (["predict", "gemm", "--hardware", "h100-sxm", "--input", "F"], "m,n,k"),
        (["capacity", "--trace", "F", "--json"], "input_tokens,output_tokens,arrival_s"),
        (["dispatch", "solve", "--model", "mixtral-8x7b", "--counts", "F", "--method",
          "heuristic", "--json"], "step,layer," + ",".join(f"e{i}" for i in range(8))),
    ],
)  # fmt: skip
def test_bom_csv_is_accepted(tmp_path: Path, args: list[str], header: str) -> None:
    rows = {
        "m,n,k": "1024,1024,1024",
        "input_tokens,output_tokens,arrival_s": "100,20,0\r\n100,20,1\r\n100,20,2",
    }.get(header, "0,0," + ",".join(str(10 * i + 5) for i in range(8)))
    p = tmp_path / "excel.csv"
    p.write_bytes(b"\xef\xbb\xbf" + f"{header}\r\n{rows}\r\n".encode())
    r = runner.invoke(app, [str(p) if a == "F" else a for a in args])
    assert r.exit_code == 0, r.output
    assert "\ufeff" not in r.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    "args",
    [
        ["pd", "phase", "--workload", "chat", "--out", "{d}/pd.html"],
        ["simulate", "--model", "llama-3.1-405b", "--hardware", "h100-sxm", "--tp", "8",
         "--pp", "2"],
    ],
)  # fmt: skip
def test_slow_defaults_end_within_60_s(d: Path, args: list[str], monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Minutes of work on defaults: either done or stopped with one line within 60 s."""
    monkeypatch.delenv("PERFMODEL_TIME_LIMIT_S", raising=False)
    t0 = time.monotonic()
    r = runner.invoke(app, _args(args, d))
    assert time.monotonic() - t0 < 60
    assert r.exit_code in (0, 2)
    if r.exit_code == 2:
        assert r.stderr.startswith("error: stopped after 50 s, the time limit")
        assert len(r.stderr.strip().splitlines()) == 1
        assert not (d / "pd.html").exists()
