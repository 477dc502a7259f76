"""`perfmodel profile ...` through Typer's CliRunner: outputs, JSON and clear errors."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from typer.testing import CliRunner

from cli.main import app
from hardware.device import load_device
from hardware.roofline import Roofline

runner = CliRunner()


@pytest.fixture()
def gemm_csv(tmp_path):
    """A small synthetic GEMM table: the H100 roofline (eff 0.8/0.8, 5 us) plus 1 % noise."""
    rl = Roofline(load_device("h100-sxm"))
    rng = np.random.default_rng(0)
    lines = ["gemm_dtype,m,n,k,latency_ms"]
    for n in (256, 1024, 4096):
        for k in (512, 2048, 8192):
            for m in (1, 8, 64, 256, 1024, 4096):
                t = float(rl.gemm_time_s(m, n, k)) * rng.lognormal(0.0, 0.01)
                lines.append(f"bfloat16,{m},{n},{k},{t * 1e3:.6g}")
    p = tmp_path / "gemm.csv"
    p.write_text("\n".join(lines) + "\n")
    return p


def _fit(gemm_csv, out, *extra: str):
    return runner.invoke(app, [
        "profile", "fit", "--data", str(gemm_csv), "--features", "gemm",
        "--time-col", "latency_ms", "--hardware", "h100-sxm", "--group-cols", "n,k",
        "--op", "gemm_bf16", "--out", str(out), *extra,
    ])  # fmt: skip


def test_fit_show_roundtrip(gemm_csv, tmp_path) -> None:
    out = tmp_path / "h100.toml"
    r = _fit(gemm_csv, out, "--pieces", "2", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)  # the progress bar goes to stderr, not into the JSON
    assert r.stderr == ""  # no progress label off a terminal
    assert d["pieces"] == 2 and d["rows"] == 54
    assert d["train_mdape_pct"] < 2.0  # the data are a 2-piece max-affine with 1 % noise
    s = runner.invoke(app, ["profile", "show", str(out), "--json"])
    assert s.exit_code == 0
    shown = json.loads(s.stdout)
    assert shown["provenance"]["device"] == "h100-sxm"
    assert shown["provenance"]["source"] == "gemm.csv" and shown["provenance"]["rows"] == 54
    # refuses to overwrite
    again = _fit(gemm_csv, out, "--pieces", "2")
    assert again.exit_code == 2 and "--force" in again.output


def test_profile_for_another_device_is_an_error(gemm_csv, tmp_path) -> None:
    out = tmp_path / "h100.toml"
    assert _fit(gemm_csv, out, "--pieces", "2").exit_code == 0
    r = runner.invoke(app, ["profile", "show", str(out), "--hardware", "a100-sxm-80gb"])
    assert r.exit_code == 2
    assert "measured on 'h100-sxm', not 'a100-sxm-80gb'" in r.output
    assert "Traceback" not in r.output


@pytest.mark.parametrize(
    ("edit", "args", "message"),
    [
        (None, ["--features", "m,q"], "no column 'q'"),
        (None, ["--time-col", "latency_us"], "no time column 'latency_us'"),
        ("bfloat16,8,8,8,fast", [], "latency_ms = 'fast' is not a number"),
        ("bfloat16,8,8,8,-0.01", [], "latency_ms = '-0.01' must be > 0"),
        (None, ["--pieces", "30"], "too few"),
    ],
)
def test_bad_input_exit_2(gemm_csv, tmp_path, edit, args, message) -> None:
    if edit:
        gemm_csv.write_text(gemm_csv.read_text() + edit + "\n")
    base = [
        "profile", "fit", "--data", str(gemm_csv), "--features", "gemm",
        "--time-col", "latency_ms", "--hardware", "h100-sxm", "--out", str(tmp_path / "o.toml"),
    ]  # fmt: skip
    for i, a in enumerate(args[::2]):  # later options override earlier ones
        base += [a, args[2 * i + 1]]
    r = runner.invoke(app, base)
    assert r.exit_code == 2, r.output
    assert message in r.output and "Traceback" not in r.output


def test_crossover_derived_json() -> None:
    r = runner.invoke(
        app,
        ["profile", "crossover", "--hardware", "h100-sxm", "--model", "qwen3-235b-a22b", "--json"],
    )
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["expert_shape"] == {"hidden": 4096, "inter": 1536, "mats": 3}
    assert d["derived_n_star"] == pytest.approx(989.4e12 / 3.35e12, rel=1e-4)  # ridge * 2 B / 2
    bad = runner.invoke(
        app, ["profile", "crossover", "--hardware", "h100-sxm", "--model", "llama-3.1-8b"]
    )
    assert bad.exit_code == 2 and "not a mixture-of-experts" in bad.output


def test_plot_writes_offline_html(gemm_csv, tmp_path) -> None:
    prof = tmp_path / "p.toml"
    assert _fit(gemm_csv, prof, "--pieces", "2").exit_code == 0
    out = tmp_path / "fit.html"
    args = [
        "profile", "plot", "--profile", str(prof), "--data", str(gemm_csv),
        "--where", "n=4096", "--where", "k=2048", "--out", str(out), "--json",
    ]  # fmt: skip
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["points"] == 6
    assert r.stderr == ""  # no progress label off a terminal
    html = out.read_text()
    assert "<html>" in html and len(html) > 1_000_000  # plotly.js embedded: works offline
    assert '<script src="http' not in html and "measured" in html
    assert runner.invoke(app, args).exit_code == 2  # no overwrite without --force
    assert not any("residual" in n for n in _trace_names(html))
    # a profile with a residual surface also draws its corrected prediction
    assert _fit(gemm_csv, prof, "--pieces", "2", "--residual", "--force").exit_code == 0
    assert runner.invoke(app, [*args, "--force"]).exit_code == 0
    assert "profile × measured residual" in _trace_names(out.read_text())


def _trace_names(html: str) -> list[str]:
    """Trace names of the figure, JSON-decoded (plotly may escape non-ASCII as \\uXXXX)."""
    return [json.loads(f'"{m}"') for m in re.findall(r'"name":"((?:[^"\\]|\\.)*)"', html)]


def test_crossover_out_needs_data(tmp_path) -> None:
    r = runner.invoke(app, [
        "profile", "crossover", "--hardware", "h100-sxm", "--model", "qwen3-235b-a22b",
        "--out", str(tmp_path / "x.toml"),
    ])  # fmt: skip
    assert r.exit_code == 2 and "give --data" in r.output and "Traceback" not in r.output


@pytest.fixture()
def moe_csv(tmp_path):
    """A small fused-MoE table on a known profile: t = 20 us + weight_elems / 1e12 per s."""
    from perfmodel.moe.expert import moe_layer_features

    rows = []
    for tok in (1, 4, 16, 64, 256, 1024):
        for hidden, inter in ((1024, 512), (2048, 768)):
            for dist in ("balanced", "power_law_1.2"):
                rows.append((tok, hidden, inter, dist))
    tok, hid, inter = (np.array([r[i] for r in rows], float) for i in range(3))
    dist = np.array([r[3] for r in rows])
    one = np.ones(len(rows))
    X = moe_layer_features(tok, hid, inter, 2 * one, 8 * one, one, one, dist, mats=3 * one)
    t_ms = (20e-6 + X[:, 0] / 1e12) * 1e3
    lines = ["moe_dtype,num_tokens,hidden_size,inter_size,topk,num_experts,moe_tp_size,"
             "moe_ep_size,distribution,kernel_source,latency_ms"]  # fmt: skip
    for (a, h, i, d), t in zip(rows, t_ms, strict=True):
        lines.append(f"bfloat16,{a},{h},{i},2,8,1,1,{d},moe_torch_flow,{t:.9g}")
    p = tmp_path / "moe.csv"
    p.write_text("\n".join(lines) + "\n")
    return p


def test_fit_moe_preset_recovers_the_weight_streaming_slope(moe_csv, tmp_path) -> None:
    out = tmp_path / "moe.toml"
    r = runner.invoke(app, [
        "profile", "fit", "--data", str(moe_csv), "--features", "moe", "--time-col",
        "latency_ms", "--hardware", "h100-sxm", "--pieces", "1", "--op", "moe_layer_bf16",
        "--out", str(out), "--json",
    ])  # fmt: skip
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["profile"]["features"] == ["weight_elems", "flop", "flop_padded", "act_elems"]
    assert d["train_mdape_pct"] < 0.5  # exact data: the fit reproduces it
    assert d["profile"]["intercepts_s"][0] == pytest.approx(20e-6, rel=0.02)
    assert d["profile"]["slopes"][0][0] == pytest.approx(1e-12, rel=0.02)


def test_fit_with_residual_surface_writes_and_shows_it(gemm_csv, tmp_path) -> None:
    """The surface is written, loaded and shown; on data the 2-piece form already fits
    (the roofline plus 1 % noise) it cannot help, and the command says so."""
    out = tmp_path / "res.toml"
    r = _fit(gemm_csv, out, "--residual", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["profile"]["residual"]["rows"] == 54
    assert d["residual_heldout_mdape_pct"] >= d["heldout_mdape_pct"]
    from hardware.profile_io import load_profile_file

    prof = load_profile_file(out)
    assert prof.residual is not None
    far = np.array([[1e20, 1e12, 1e12, 40.0, 1e12]])  # far outside the measured shapes
    assert prof(far)[0] == prof.pure()(far)[0]
    text = _fit(gemm_csv, out, "--residual", "--force")
    assert text.exit_code == 0 and "does not lower the held-out error" in text.stdout
    s = runner.invoke(app, ["profile", "show", str(out)])
    assert s.exit_code == 0 and "residual surface: 54 measured rows" in s.stdout
