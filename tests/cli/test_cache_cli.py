"""``perfmodel cache plan`` (and its figure, ``--out``) through Typer's CliRunner."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()
BASE = ["--model", "llama-3.1-8b", "--hardware", "a100-40gb", "--ttft-slo-ms", "1000"]


def test_plan_json_reports_split_binding_and_marginals() -> None:
    args = [
        "cache",
        "plan",
        *BASE,
        "--rate-per-s",
        "4",
        "--adapters",
        "50",
        "--adapter-rank",
        "64",
        "--kv-levels",
        "3",
        "--adapter-levels",
        "3",
        "--json",
    ]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["feasible"] and d["at_rate"]["stable"]
    assert d["at_rate"]["utilization"] < 1
    assert sum(d["split_gib"].values()) == pytest.approx(d["pool_budget_gib"])
    assert set(d["marginal_objective_per_gib"]) == {"kv", "adapters"}
    # rank-64 q,k,v,o adapter of Llama-3.1-8B: 64·(2·(4096+4096) + 2·(4096+1024))·32·2 B
    per = 64 * (2 * 8192 + 2 * 5120) * 32 * 2
    assert d["split_gib"]["adapters"] * 2**30 / per == pytest.approx(d["adapters_resident"])


def test_plan_unstable_rate_is_a_result_not_an_error() -> None:
    r = runner.invoke(app, ["cache", "plan", *BASE, "--rate-per-s", "500", "--kv-levels", "2"])
    assert r.exit_code == 0
    assert "no split is stable" in r.stdout


def test_curve_writes_html_and_refuses_to_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "c.html"
    args = [
        "cache",
        "plan",
        *BASE,
        "--rate-per-s",
        "2",
        "--adapters",
        "30",
        "--kv-levels",
        "2",
        "--adapter-levels",
        "2",
        "--out",
        str(out),
    ]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    html = out.read_text()
    assert "plotly" in html and "adapters, LRU (Che)" in html and "<script" in html
    r2 = runner.invoke(app, args)
    assert r2.exit_code == 2 and "--force" in r2.output
    r3 = runner.invoke(app, [*args, "--force", "--json"])
    assert r3.exit_code == 0, r3.output
    (curve,) = json.loads(r3.stdout)["hit_curves"]
    hits = curve["hit_ratio"]
    # LRU hit ratio grows with the cache and is 1 when all 30 adapters fit
    assert all(b >= a - 1e-12 for a, b in itertools.pairwise(hits))
    assert curve["cache_size"][-1] == 30 and hits[-1] == pytest.approx(1.0)


def test_bad_input_one_line_errors() -> None:
    cases = [
        (["--budget-gib", "100"], "capacity of one a100-40gb"),
        (["--adapters", "5", "--adapter-rank", "20000"], "cannot fit even alone"),
        (["--adapter-source", "tape"], "--adapter-source"),
        (["--offload-experts"], "needs an MoE model"),
        (["--workload", "nope"], "unknown workload"),
    ]
    for extra, msg in cases:
        r = runner.invoke(app, ["cache", "plan", *BASE, "--rate-per-s", "1", *extra])
        assert r.exit_code == 2, (extra, r.output)
        assert msg in r.output and "Traceback" not in r.output
        assert r.output.strip().startswith("error:") or "error:" in r.output


def test_expert_counts_csv_zero_popularity(tmp_path: Path) -> None:
    p = tmp_path / "counts.csv"
    p.write_text(
        "step,layer,"
        + ",".join(f"e{i}" for i in range(128))
        + "\n"
        + "0,0,"
        + ",".join("0" for _ in range(128))
        + "\n"
    )
    r = runner.invoke(
        app,
        [
            "cache",
            "plan",
            "--model",
            "qwen3-30b-a3b",
            "--hardware",
            "a100-40gb",
            "--offload-experts",
            "--expert-counts",
            str(p),
            "--rate-per-s",
            "0.1",
        ],
    )
    assert r.exit_code == 2 and "zero-popularity" in r.output
