"""CLI: the commands through Typer's CliRunner — values, JSON, and bad input (exit 2)."""

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()


def run(*args: str) -> tuple[int, str, str]:
    r = runner.invoke(app, list(args))
    return r.exit_code, r.stdout, r.stderr


def test_estimate_defaults_json() -> None:
    code, out, _ = run("estimate", "--json")
    assert code == 0
    d = json.loads(out)
    # the shared defaults (cli/options.py): the same model, device and TP as capacity
    assert d["model"] == "llama-3.1-8b" and d["hardware"] == "h100-sxm" and d["tp"] == 1
    assert d["memory"]["fits"] is True
    assert d["tpot_ms"] < d["ttft_ms"]
    assert d["decode_bound_s"]["memory"] > d["decode_bound_s"]["compute"]


def test_estimate_does_not_fit_is_a_result() -> None:
    code, out, _ = run("estimate", "--model", "llama-3.1-405b", "--tp", "1", "--batch", "1")
    assert code == 0
    assert "does not fit" in out and "smallest TP that fits is 16" in out


def test_hardware_and_model_commands() -> None:
    code, out, _ = run("hardware", "show", "h100-sxm", "--json")
    assert code == 0
    d = json.loads(out)
    assert d["ridge_flop_per_byte"]["bf16"] == pytest.approx(295.3, abs=0.1)
    code, out, _ = run("hardware", "list")
    assert code == 0 and "ascend-910b2" in out and "mi300x" in out
    code, out, _ = run("hardware", "show", "a100-sxm-80gb")  # the fitted NCCL terms shown
    assert code == 0 and "1.045 µs per hop, collective fixed costs x1.946 (fitted" in out
    code, out, _ = run("model", "show", "deepseek-v3", "--json")
    d = json.loads(out)
    assert d["kv_bytes_per_token"]["bf16"] == 70272 and d["attention"] == "MLA"
    code, out, _ = run("model", "list", "--json")
    assert code == 0 and len(json.loads(out)) >= 12


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("estimate", "--hardware", "h999"), "unknown hardware id 'h999'"),
        (("estimate", "--model", "gpt-5"), "unknown model id 'gpt-5'"),
        (("estimate", "--tp", "3"), "tp=3 does not divide"),
        (("estimate", "--batch", "0"), "--batch must be a positive integer"),
        (("estimate", "--input-len", "-5"), "--input-len must be a positive integer"),
        (("estimate", "--dtype", "fp7"), "unknown dtype 'fp7'"),
        (("estimate", "--hardware", "a100-sxm-80gb", "--act-dtype", "fp8"), "has no fp8 math"),
        (("hardware", "show", "nope"), "unknown hardware id"),
    ],
)
def test_bad_input_one_line_exit_2(args: tuple[str, ...], needle: str) -> None:
    code, out, err = run(*args)
    assert code == 2
    assert needle in err
    assert "Traceback" not in err + out
    assert len(err.strip().splitlines()) == 1


def test_malformed_files_exit_2(tmp_path: Path) -> None:
    bad_toml = tmp_path / "dev.toml"
    bad_toml.write_text("[compute\n")
    code, _, err = run("hardware", "show", str(bad_toml))
    assert code == 2 and "dev.toml: malformed TOML" in err
    bad_cfg = tmp_path / "config.json"
    bad_cfg.write_text('{"hidden_size": 4096}')
    code, _, err = run("model", "show", str(bad_cfg))
    assert code == 2 and "missing field" in err


def test_predict_gemm_roundtrip(tmp_path: Path) -> None:
    shapes = tmp_path / "shapes.csv"
    shapes.write_text("m,n,k,dtype\n4096,4096,4096,bf16\n1,8192,8192,\n")
    out = tmp_path / "preds.csv"
    code, _, _ = run(
        "predict", "gemm", "--hardware", "h100-sxm", "--input", str(shapes), "--output", str(out)
    )
    assert code == 0
    lines = out.read_text().splitlines()
    assert lines[0] == "m,n,k,dtype,latency_ms"
    assert float(lines[1].split(",")[-1]) == pytest.approx(
        (2 * 4096**3 / (0.8 * 989.4e12) + 5e-6) * 1e3, rel=1e-4
    )
    # refuses to overwrite without --force, leaves the file intact
    code, _, err = run(
        "predict", "gemm", "--hardware", "h100-sxm", "--input", str(shapes), "--output", str(out)
    )
    assert code == 2 and "--force" in err
    assert out.read_text().splitlines() == lines


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("m,n\n1,2\n", "no column(s) k"),
        ("m,n,k\n1,2,x\n", ":2: k = 'x' is not an integer"),
        ("m,n,k\n1,2,3\n0,2,3\n", ":3: m = 0 must be >= 1"),
        ("m,n,k,dtype\n1,2,3,fp9\n", ":2: unknown dtype 'fp9'"),
        ("m,n,k\n", "no data rows"),
    ],
)
def test_predict_gemm_bad_csv(tmp_path: Path, content: str, needle: str) -> None:
    p = tmp_path / "s.csv"
    p.write_text(content)
    code, _, err = run("predict", "gemm", "--hardware", "h100-sxm", "--input", str(p))
    assert code == 2 and needle in err


def test_predict_gemm_with_the_builtin_fitted_profile_tracks_measurements(tmp_path: Path) -> None:
    """`--profile h100-sxm:gemm_bf16` on 90 measured H100 bf16 shapes (every 400th row of
    ../shared/data/silicon/h100_sxm__gemm.csv, which the built-in profile was fitted to:
    an in-sample check of the wiring): median error 4.1 % (the profile's fitted 4.4 % +
    margin) against the default roofline's 6.8 %."""
    import csv as _csv

    from tests.conftest import shared_file

    with open(shared_file("silicon", "h100_sxm__gemm.csv")) as f:
        rows = [r for r in _csv.DictReader(f) if r["gemm_dtype"] == "bfloat16"][::400]
    shapes = tmp_path / "shapes.csv"
    shapes.write_text("m,n,k\n" + "".join(f"{r['m']},{r['n']},{r['k']}\n" for r in rows))
    meas = np.array([float(r["latency_ms"]) for r in rows])
    preds = {}
    for name, extra in (("profile", ["--profile", "h100-sxm:gemm_bf16"]), ("roofline", [])):
        code, out, err = run(
            "predict", "gemm", "--hardware", "h100-sxm", "--input", str(shapes), "--json", *extra
        )
        assert code == 0, err
        preds[name] = np.array([d["latency_ms"] for d in json.loads(out)])
    err = {k: float(np.median(np.abs(v / meas - 1))) for k, v in preds.items()}
    assert err["profile"] < 0.07
    assert err["profile"] < err["roofline"]


@pytest.mark.parametrize(
    ("content", "profile", "needle"),
    [
        ("m,n,k,dtype\n1,2,3,fp8\n", "h100-sxm:gemm_bf16", "fitted to bf16 GEMMs"),
        ("m,n,k\n1,2,3\n", "a100-sxm-80gb:gemm_bf16", "measured on 'a100-sxm-80gb'"),
        ("m,n,k\n1,2,3\n", "h100-sxm:moe_layer_bf16", "not the GEMM features"),
    ],
)
def test_predict_gemm_profile_errors(
    tmp_path: Path, content: str, profile: str, needle: str
) -> None:
    p = tmp_path / "s.csv"
    p.write_text(content)
    code, _, err = run(
        "predict", "gemm", "--hardware", "h100-sxm", "--input", str(p), "--profile", profile
    )
    assert code == 2 and needle in err
