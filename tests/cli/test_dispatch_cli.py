"""``perfmodel dispatch solve|place|phase`` through Typer's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from perfmodel.moe.routing import counts_csv_text, generate_batch

runner = CliRunner()


def run(*args: str) -> tuple[int, str, str]:
    r = runner.invoke(app, list(args))
    return r.exit_code, r.stdout, r.stderr


def test_solve_all_methods_json() -> None:
    code, out, _ = run(
        "dispatch",
        "solve",
        "--model",
        "qwen3-235b-a22b",
        "--tokens",
        "4096",
        "--skew",
        "1.2",
        "--gpus",
        "8",
        "--replicas",
        "2",
        "--hardware",
        "h100-sxm",
        "--json",
    )
    assert code == 0
    d = json.loads(out)  # no solver banner on stdout
    res = {r["method"]: r for r in d["results"]}
    assert set(res) == {"milp", "heuristic", "token", "activated", "static", "bound"}
    assert res["milp"]["status"] == "optimal"
    opt = res["milp"]["makespan_s"]
    assert res["bound"]["makespan_s"] <= opt * (1 + 1e-7)
    for m in ("heuristic", "token", "activated", "static"):
        assert res[m]["makespan_s"] >= opt * (1 - 1e-9)
    assert sum(res["static"]["gpu_tokens"]) == pytest.approx(4096 * 8)


def test_solve_from_counts_csv(tmp_path: Path) -> None:
    f = tmp_path / "c.csv"
    f.write_text(counts_csv_text(generate_batch(128, 8, 256, skew=1.0, layers=2, seed=1)))
    code, out, _ = run(
        "dispatch",
        "solve",
        "--model",
        "qwen3-235b-a22b",
        "--counts",
        str(f),
        "--row",
        "1",
        "--method",
        "heuristic",
        "--gpus",
        "8",
    )
    assert code == 0
    assert "c.csv row 1" in out and "heuristic" in out


@pytest.mark.parametrize(
    ("args", "msg"),
    [
        (
            ["--model", "deepseek-v3", "--counts", "WRONG"],
            "128 expert columns but the model has 256",
        ),
        (["--model", "qwen3-235b-a22b", "--tokens", "8", "--method", "best"], "--method must"),
        (["--model", "qwen3-235b-a22b", "--tokens", "8", "--replicas", "9"], "replicas per expert"),
        (["--model", "llama-3.1-8b", "--tokens", "8"], "not a mixture-of-experts"),
        (["--model", "qwen3-235b-a22b"], "give --counts CSV"),
    ],
)
def test_solve_bad_input(tmp_path: Path, args: list[str], msg: str) -> None:
    f = tmp_path / "c.csv"
    f.write_text(counts_csv_text(generate_batch(128, 8, 64, seed=1)))
    args = [str(f) if a == "WRONG" else a for a in args]
    code, out, err = run("dispatch", "solve", *args)
    assert code == 2
    assert msg in err and "Traceback" not in err + out
    assert len(err.strip().splitlines()) == 1


def test_place_json() -> None:
    code, out, _ = run(
        "dispatch",
        "place",
        "--model",
        "qwen3-30b-a3b",
        "--gpus",
        "8",
        "--slots-per-gpu",
        "17",
        "--tokens",
        "64",
        "--skew",
        "1.2",
        "--time-limit-s",
        "2",
        "--json",
    )
    assert code == 0
    d = json.loads(out)
    assert d["expected_makespan_s"] <= d["eplb_expected_makespan_s"] * (1 + 1e-9)
    assert max(d["replicas_per_gpu"]) <= 17


def test_place_memory_infeasible_names_gpu() -> None:
    code, _, err = run(
        "dispatch", "place", "--model", "qwen3-30b-a3b", "--gpus", "8", "--slots-per-gpu", "15"
    )
    assert code == 2
    assert "128 experts need 128 replica slots" in err and "GPU 0" in err


def test_phase_writes_html_and_refuses_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "phase.html"
    args = [
        "dispatch",
        "phase",
        "--model",
        "qwen3-235b-a22b",
        "--hardware",
        "h200-sxm",
        "--out",
        str(out),
        "--tokens-per-gpu",
        "16,1024",
        "--skews",
        "1.0",
        "--samples",
        "1",
    ]
    code, text, _ = run(*args)
    assert code == 0 and out.stat().st_size > 1_000_000
    assert "scale-up" in text and "layer gain" in text
    code, _, err = run(*args)
    assert code == 2 and "exists; pass --force" in err
    code, text, _ = run(*args, "--force", "--json")
    assert code == 0 and len(json.loads(text)["cells"]) == 2


def _write_profile(path: Path, *, op: str, device: str = "h100-sxm", feats=("G", "N")) -> None:
    import numpy as np

    from hardware.maxaffine import MaxAffine, Provenance
    from hardware.profile_io import profile_to_toml

    k = len(feats)
    prof = MaxAffine(
        features=tuple(feats),
        intercepts_s=np.zeros(2),
        slopes=np.array([[1e-5, 0.0], [0.0, 1e-12]])[:, :k],
        provenance=Provenance(device, op, source="fitted-test.csv"),
    )
    path.write_text(profile_to_toml(prof))


def test_solve_with_fitted_profile(tmp_path: Path) -> None:
    # A weight-bound profile t = 10 us x activated experts (β ~ 0): every method's
    # makespan is 10 us times its busiest GPU's activations, so the file is really used.
    f = tmp_path / "expert.toml"
    _write_profile(f, op="moe_expert_4096x1536x3")  # qwen3-235b-a22b's routed expert
    code, out, _ = run(
        "dispatch", "solve", "--model", "qwen3-235b-a22b", "--tokens", "64", "--profile",
        str(f), "--method", "activated", "--json",
    )  # fmt: skip
    assert code == 0
    d = json.loads(out)
    assert d["profile"]["source"] == "fitted-test.csv"
    r = d["results"][0]
    rows = max(r["gpu_rows"])
    assert r["makespan_s"] == pytest.approx(max(1e-5 * max(r["activated"]), 1e-12 * rows))


@pytest.mark.parametrize(
    ("op", "device", "feats", "msg"),
    [
        ("moe_expert_7168x2048x3", "h100-sxm", ("G", "N"), "fitted for moe_expert_7168x2048x3"),
        ("moe_expert_4096x1536x3", "a100-sxm-80gb", ("G", "N"), "measured on"),
        ("gemm", "h100-sxm", ("m", "n"), "dispatch needs an expert-block profile"),
    ],
)
def test_profile_mismatch_is_a_clear_error(
    tmp_path: Path, op: str, device: str, feats: tuple[str, ...], msg: str
) -> None:
    f = tmp_path / "p.toml"
    _write_profile(f, op=op, device=device, feats=feats)
    code, out, err = run(
        "dispatch", "solve", "--model", "qwen3-235b-a22b", "--tokens", "8", "--profile", str(f)
    )
    assert code == 2 and msg in err and "Traceback" not in err + out


def test_profile_with_a_residual_surface_is_refused(tmp_path: Path) -> None:
    """The dispatch optimizer works on the pieces; a residual surface would be ignored
    silently, so it is an error."""
    import numpy as np

    from hardware.maxaffine import MaxAffine, Provenance
    from hardware.profile_io import profile_to_toml
    from hardware.residual import build_surface

    prof = MaxAffine(
        ("G", "N"), np.zeros(2), np.array([[1e-5, 0.0], [0.0, 1e-12]]),
        provenance=Provenance("h100-sxm", "moe_expert_4096x1536x3", source="t.csv"),
    )  # fmt: skip
    X = np.c_[np.repeat([1.0, 2.0, 4.0], 4), np.tile([16.0, 64.0, 256.0, 1024.0], 3)]
    f = tmp_path / "p.toml"
    f.write_text(profile_to_toml(prof.with_residual(build_surface(X, prof(X) * 1.1, prof(X)))))
    code, out, err = run(
        "dispatch", "solve", "--model", "qwen3-235b-a22b", "--tokens", "8", "--profile", str(f)
    )
    assert code == 2 and "residual surface" in err and "Traceback" not in err + out
