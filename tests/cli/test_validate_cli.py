"""Validation: the published-table converter, the long-format reader, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from hardware.engine import load_engine
from perfmodel.errors import SpecError
from perfmodel.validate.convert import COLUMNS, convert_published, write_long_csv
from perfmodel.validate.data import read_measurements
from tests.conftest import shared_file

runner = CliRunner()
HEADER = ",".join(COLUMNS)


def _csv(tmp_path: Path, *lines: str) -> Path:
    p = tmp_path / "m.csv"
    p.write_text("\n".join([HEADER, *lines]) + "\n", encoding="utf-8")
    return p


def test_converter_reads_units_and_layouts_as_published() -> None:
    conv = convert_published(shared_file("published"))
    rows = conv.rows
    assert len(rows) == 1682  # 2,383 published rows - 92 left out - 609 repeats merged
    assert (
        sum(
            r == "attention-DP / expert-parallel layout (DEPn) is not a TP plan"
            for _, r in conv.skipped
        )
        == 8
    )
    # one "MI250 GPU" is two GCDs: the 7B model on "1 MI250" runs TP2 on mi250 GCDs
    mi = [r for r in rows if r["device"] == "mi250"]
    assert mi and {int(r["tp"]) for r in mi} <= {2, 4, 8}
    # Argonne throughput is input + output tokens/s
    assert {r["metric"] for r in rows if r["source"].startswith("argonne")} <= {
        "total_tps_total",
        "ttft_ms",
    }
    # perf overview ~v1.1 is per GPU (15 rows, 8 of them DEPn), the others total
    per_gpu = [
        r for r in rows if r["metric"] == "output_tps_per_gpu" and "perf_overview" in r["source"]
    ]
    assert len(per_gpu) == 7 and {r["engine"] for r in per_gpu} == {"trtllm@1.1"}
    # FP8 KV cache in every version (trtllm-bench build --quantization FP8 forces it)
    fp8_013 = {
        r["kv_precision"] for r in rows if r["engine"] == "trtllm@0.13" and r["precision"] == "fp8"
    }
    assert fp8_013 == {"fp8"}
    # every model maps to a catalog id except the two the catalog lacks
    assert {r["model"] for r in rows if not r["model"].islower()} == {
        "Llama 4 Maverick",
        "GPT-OSS 20B",
    }


def test_converter_merges_repeats_into_the_median(tmp_path: Path) -> None:
    conv = convert_published(shared_file("published"))
    # Argonne TRT-LLM A100 Llama-2-7B 128/128 batch 16 appears in three files
    hit = [
        r
        for r in conv.rows
        if r["engine"] == "trtllm"
        and r["device"] == "a100-sxm-80gb"
        and r["model"] == "llama-2-7b"
        and r["isl"] == "128"
        and r["batch_size"] == "16"
        and r["tp"] == "1"
    ]
    assert len(hit) == 1 and len(hit[0]["source"].split()) >= 2
    out = tmp_path / "long.csv"
    write_long_csv(conv.rows, out)
    assert len(read_measurements(out)) == len(conv.rows)


def test_reader_names_row_and_column(tmp_path: Path) -> None:
    p = _csv(tmp_path, "h100-sxm,llama-3.1-8b,vllm,bf16,bf16,1,1,128,128,,tokens,5,,,")
    with pytest.raises(SpecError, match=r"m.csv:2: metric 'tokens'"):
        read_measurements(p)
    p = _csv(tmp_path, "h100-sxm,llama-3.1-8b,vllm,bf16,bf16,zero,1,128,128,,ttft_ms,5,,,")
    with pytest.raises(SpecError, match="tp must be an integer"):
        read_measurements(p)


def test_cli_validate_json_and_unrepresentable(tmp_path: Path) -> None:
    p = _csv(
        tmp_path,
        "h100-sxm,llama-3.1-8b,vllm,bf16,bf16,1,1,128,128,,output_tps_total,20000,,,",
        "h100-sxm,my-model,vllm,bf16,bf16,1,1,128,128,,output_tps_total,20000,,,",
        "h100-sxm,llama-3.1-8b,vllm,bf16,bf16,1,1,128,128,,ttft_ms,50,,16,",
    )
    r = runner.invoke(app, ["validate", "--data", str(p), "--json"])
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    a, b, c = d["rows"]
    assert a["status"] == "ok" and a["predicted"] > 0 and a["engine_used"] == "vllm"
    assert a["error_pct"] == pytest.approx(100 * (a["predicted"] / 20000 - 1))
    assert b["status"] == "unrepresentable" and "my-model" in b["reason"]
    assert c["status"] == "unrepresentable" and "closed-loop" in c["reason"]
    assert d["summary"]["all"]["rows"] == 1 and d["summary"]["all"]["unrepresentable"] == 2


def test_cli_validate_bad_input_is_one_line(tmp_path: Path) -> None:
    r = runner.invoke(app, ["validate", "--data", str(tmp_path / "absent.csv")])
    assert r.exit_code == 2
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: cannot read")
    bad = tmp_path / "bad.csv"
    bad.write_text("device,model\nh100-sxm,x\n", encoding="utf-8")
    r = runner.invoke(app, ["validate", "--data", str(bad)])
    assert r.exit_code == 2 and "missing column" in r.stderr


def test_cli_calibrate_writes_a_loadable_engine(tmp_path: Path) -> None:
    lines = [
        f"h100-sxm,llama-2-7b,vllm,fp16,fp16,1,1,{n},{n},{b},total_tps_total,{v},,,"
        for n, b, v in ((128, 1, 160.0), (512, 16, 1900.0), (1024, 64, 4000.0))
    ]
    p = _csv(tmp_path, *lines)
    out = tmp_path / "cal.toml"
    r = runner.invoke(
        app,
        [
            "calibrate",
            "--data",
            str(p),
            "--engine",
            "vllm",
            "--out",
            str(out),
            "--no-cv",
            "--max-evals",
            "3",
        ],
    )
    assert r.exit_code == 0, r.stderr
    e = load_engine(out)
    assert e.family == "vllm" and e.provenance["rows"] == 3
    assert e.provenance["fit"]["rows"] == 3
    # fitted on these rows: in-sample error below the start file's
    assert e.provenance["fit"]["median_abs_error_pct"] < 100


def test_estimate_offline_with_engine_caps() -> None:
    r = runner.invoke(
        app,
        [
            "estimate",
            "--model",
            "llama-3.1-8b",
            "--hardware",
            "h100-sxm",
            "--tp",
            "1",
            "--offline",
            "--engine",
            "vllm",
            "--input-len",
            "128",
            "--output-len",
            "128",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["engine"] == "vllm"
    # vLLM's max_num_seqs = 256 binds long before 456k KV tokens would
    assert d["offline"]["batch"] == 256 and d["offline"]["binding"] == "max_num_seqs"
    out = d["offline"]["output_tokens_per_s"]
    assert out == pytest.approx(256 / d["offline"]["iteration_s"])
    r = runner.invoke(app, ["estimate", "--engine", "tgi"])
    assert r.exit_code == 2 and "unknown engine" in r.stderr
