"""`--engine` on every time-computing command: named in every output, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from hardware.engine import load_engine

runner = CliRunner()


def _json(args: list[str]) -> dict:  # type: ignore[type-arg]
    r = runner.invoke(app, [*args, "--json"])
    assert r.exit_code == 0, r.output
    out: dict = json.loads(r.stdout)  # type: ignore[type-arg]
    return out


def _lodo_pct(engine: str) -> str:
    stat = load_engine(engine).provenance["leave_one_device_out"]
    return f"±{stat['median_abs_error_pct']:.0f} %"


def test_pd_plan_with_an_engine_serves_less_per_instance() -> None:
    # TensorRT-LLM on an A100: host time per iteration and bf16 GEMMs below the roofline's
    # efficiency make both phases slower, so each instance's goodput falls
    args = ["pd", "plan", "--hardware", "a100-sxm-80gb", "--rate-per-s", "4", "--no-baseline"]
    none, trt = _json([*args, "--engine", "none"]), _json([*args, "--engine", "trtllm"])
    assert none["engine"] is None and "engine-less roofline" in none["engine_accuracy"]
    assert trt["engine"] == "trtllm"
    for phase in ("prefill", "decode"):
        g0 = none[phase][0]["goodput_per_instance_per_s"]
        g1 = trt[phase][0]["goodput_per_instance_per_s"]
        assert g1 < g0, (phase, g0, g1)


def test_every_output_names_the_default_engine(tmp_path: Path) -> None:
    spec = tmp_path / "s.toml"
    spec.write_text('[grid]\nmodel = "llama-3.1-8b"\nhardware = "h100-sxm"\nbatch = 1\n'
                    "input_len = 128\noutput_len = 4\n")  # fmt: skip
    cmds = [
        ["estimate"],
        ["capacity"],
        ["pd", "plan", "--no-baseline"],
        ["cache", "plan"],
        ["sweep", str(spec), "--out", str(tmp_path / "s.csv"), "--scheduler", "serial"],
    ]
    for cmd in cmds:
        text = runner.invoke(app, [*cmd, "--force"] if cmd[0] == "sweep" else cmd)
        assert text.exit_code == 0, text.output
        assert "engine" in text.stdout.splitlines()[0] or cmd[0] == "sweep", cmd
        if cmd[0] != "sweep":
            assert "trtllm" in text.stdout and "the default on h100-sxm" in text.stdout, cmd
            assert _json(cmd)["engine"] == "trtllm", cmd
    rows = (tmp_path / "s.csv").read_text().splitlines()
    assert rows[0].split(",")[rows[0].split(",").index("engine_id")] == "engine_id"
    assert rows[1].split(",")[rows[0].split(",").index("engine_id")] == "trtllm"


def test_an_uncalibrated_pair_states_the_held_out_error() -> None:
    # vLLM was never fitted on an MI300X (cdna3): the note quotes the engine file's
    # leave-one-device-out median error, not a number made up here
    note = _json(["estimate", "--hardware", "mi300x"])["engine_accuracy"]
    assert f"uncalibrated on cdna3/bf16: expect {_lodo_pct('vllm')} median" in note
    note = _json(["estimate", "--hardware", "tpu-v5e"])["engine_accuracy"]
    assert "no engine model for google devices" in note


@pytest.mark.parametrize(
    "cmd",
    [
        ["estimate"],
        ["pd", "plan"],
        ["pd", "phase", "--out", "x.html"],
        ["cache", "plan"],
        ["phase", "stability", "--out", "x.html"],
        ["plan", "--devices", "h100-sxm"],
        ["sweep", "spec.toml", "--out", "x.csv"],
    ],
)
def test_an_unknown_engine_is_one_line_exit_2(cmd: list[str], tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text('[grid]\nmodel = "llama-3.1-8b"\nhardware = "h100-sxm"\nbatch = 1\n'
                    "input_len = 8\noutput_len = 2\n")  # fmt: skip
    cmd = [str(tmp_path / c) if c in ("x.html", "x.csv", "spec.toml") else c for c in cmd]
    r = runner.invoke(app, [*cmd, "--engine", "carrier-pigeon"])
    assert r.exit_code == 2, r.output
    assert r.output.strip().count("\n") == 0 and "unknown engine 'carrier-pigeon'" in r.output
