"""``perfmodel capacity`` / ``simulate`` through Typer's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()


def test_capacity_defaults_json() -> None:
    r = runner.invoke(app, ["capacity", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["binding"] in ("compute", "memory")
    assert d["service_rate_per_s"] == min(d["compute_rate_per_s"], d["memory_rate_per_s"])
    assert d["stable"] and abs(d["utilization"] - 0.7) < 1e-9  # default rate: 0.7·μ
    lat = d["latency"]
    assert lat["ttft_p50_ms"] <= lat["ttft_p90_ms"] <= lat["ttft_p99_ms"]
    assert d["sizing"]["instances"] == 1


def test_capacity_unstable_rate_is_a_result() -> None:
    r = runner.invoke(app, ["capacity", "--rate-per-s", "500", "--json"])
    assert r.exit_code == 0
    d = json.loads(r.output)
    assert not d["stable"] and d["margin"] < 0
    assert d["latency"]["ttft_mean_ms"] is None  # unbounded -> null, never NaN
    assert d["sizing"]["necessary_instances"] >= 500 / d["service_rate_per_s"]


def test_capacity_bad_input_exits_2(tmp_path: Path) -> None:
    r = runner.invoke(app, ["capacity", "--rate-per-s", "-1"])
    assert r.exit_code == 2 and "--rate-per-s must be > 0" in r.output
    bad = tmp_path / "t.csv"
    bad.write_text("input_tokens,output_tokens\n10,5\n10,x\n")
    r = runner.invoke(app, ["capacity", "--trace", str(bad)])
    assert r.exit_code == 2 and "t.csv:3" in r.output
    r = runner.invoke(app, ["capacity", "--workload", "nope"])
    assert r.exit_code == 2 and "unknown workload" in r.output


def test_capacity_infeasible_slo_says_best() -> None:
    r = runner.invoke(app, ["capacity", "--ttft-slo-ms", "1", "--json"])
    assert r.exit_code == 0
    g = json.loads(r.output)["goodput"]
    assert not g["feasible"] and "best achievable p90 TTFT" in g["explanation"]


def test_simulate_json() -> None:
    r = runner.invoke(app, ["simulate", "--requests", "1500", "--seed", "3", "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["completed"] == 1500 and d["rejected"] == 0
    assert d["ttft"]["p50_ms"] <= d["ttft"]["p99_ms"]
    assert abs(d["throughput_per_s"] / d["rate_per_s"] - 1) < 0.1


def test_capacity_names_its_engine_and_the_engine_changes_the_answer() -> None:
    from typer.testing import CliRunner

    from cli.main import app

    runner = CliRunner()
    plain = runner.invoke(app, ["capacity", "--engine", "none", "--json"])
    vllm = runner.invoke(app, ["capacity", "--engine", "vllm", "--json"])
    default = runner.invoke(app, ["capacity", "--json"])
    assert plain.exit_code == 0 and vllm.exit_code == 0, vllm.output
    a, b = json.loads(plain.stdout), json.loads(vllm.stdout)
    assert a["engine"] is None and "engine-less roofline" in a["engine_accuracy"]
    # the default is the device's calibrated engine: TensorRT-LLM on an H100, named so
    c = json.loads(default.stdout)
    assert c["engine"] == "trtllm" and "the default on h100-sxm" in c["engine_accuracy"]
    assert b["engine"] == "vllm" and "expect" in b["engine_accuracy"]
    # host overhead and kernel efficiencies of a real engine can only slow the instance
    assert b["service_rate_per_s"] < 0.9 * a["service_rate_per_s"]
    bad = runner.invoke(app, ["capacity", "--engine", "carrier-pigeon"])
    assert bad.exit_code == 2 and "carrier-pigeon" in bad.output
