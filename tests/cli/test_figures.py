"""Every figure command: the figure object is right (axis ranges, traces, non-constant or
labelled panels), and the page renders in a real headless browser without console errors.

The browser part needs Debian's ``chromium`` (installed by ``.ci/run``); without it those
tests skip with the reason. Screenshots are left next to the HTML in the test's tmp dir.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from cli.main import app
from hardware.device import load_device
from hardware.roofline import Roofline
from perfmodel.units import MS_PER_S
from tests.figures import browser, figure_of, render

runner = CliRunner()


def _run(*args: str) -> None:
    r = runner.invoke(app, list(args))
    assert r.exit_code == 0, r.output


def _gemm_csv(path: Path) -> Path:
    """The H100 roofline on an m sweep at n = k = 4096 with 1 % noise (m = 1 ... 16384)."""
    rl = Roofline(load_device("h100-sxm"))
    rng = np.random.default_rng(0)
    lines = ["m,n,k,latency_ms"]
    for n in (1024, 4096):
        for m in (1, 4, 16, 64, 256, 1024, 4096, 16384):
            t = float(rl.gemm_time_s(m, n, 4096)) * rng.lognormal(0.0, 0.01)
            lines.append(f"{m},{n},4096,{t * MS_PER_S:.6g}")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One HTML page per figure command, small enough to build in seconds."""
    d = tmp_path_factory.mktemp("figs")
    data = _gemm_csv(d / "gemm.csv")
    _run("profile", "fit", "--data", str(data), "--features", "gemm", "--time-col",
         "latency_ms", "--hardware", "h100-sxm", "--pieces", "2",
         "--out", str(d / "p.toml"))  # fmt: skip
    out = {k: d / f"{k}.html" for k in ("profile", "dispatch", "cache", "stability", "pd")}
    _run("profile", "plot", "--profile", str(d / "p.toml"), "--data", str(data), "--where",
         "n=4096", "--hardware", "h100-sxm", "--out", str(out["profile"]))  # fmt: skip
    _run("dispatch", "phase", "--model", "mixtral-8x7b", "--tokens-per-gpu", "16,256",
         "--skews", "0,1", "--samples", "1", "--out", str(out["dispatch"]))  # fmt: skip
    _run("cache", "plan", "--model", "mixtral-8x7b", "--offload-experts", "--kv-levels", "3",
         "--expert-levels", "3", "--out", str(out["cache"]))  # fmt: skip
    _run("phase", "stability", "--rates", "4", "--sim-rows", "1", "--sim-requests", "300",
         "--output-tokens", "64,256", "--kv-grid-tokens", "50000,200000",
         "--out", str(out["stability"]))  # fmt: skip
    # `pd phase` takes minutes per grid on 2 cores; its figure is built from a hand-made
    # diagram with the same structure (the sweep itself is tested in tests/unit/test_pd_plan)
    from reports.pd_figure import phase_figure_html

    out["pd"].write_text(phase_figure_html([_pd_diagram()]), encoding="utf-8")
    return out


def _pd_diagram():  # type: ignore[no-untyped-def]
    from reports.pd_plot import PDCell, PDPhaseDiagram

    xs, ys = (128.0, 512.0, 2048.0), (32.0, 128.0, 512.0)
    cells = []
    for i, x in enumerate(xs):
        for j, y in enumerate(ys):
            pd_wins = j <= i  # disaggregation wins up to a higher y in the later columns
            gain = 1.3 if pd_wins else 0.8
            cells.append(
                PDCell(x=x, y=y, regime="disaggregated" if pd_wins else "colocated",
                       disagg_per_gpu=gain, colocated_per_gpu=1.0, gain=gain,
                       gpu_ratio=0.5, instance_ratio=1.0, prefill="TP2", decode="TP4", note="")
            )  # fmt: skip
    return PDPhaseDiagram(
        model="llama-3.1-70b", device="h100-sxm", kind="lengths", x_label="input tokens",
        y_label="output tokens", xs=xs, ys=ys, context="hand-made cells", cells=tuple(cells),
    )  # fmt: skip


def test_profile_plot_x_axis_spans_the_data(pages: dict[str, Path]) -> None:
    """The data run m = 1 ... 16384: on the log axis [0, 4.21] in log10 units. Labels
    placed in data units (the old bug) stretched the axis to 10^144 and beyond."""
    f = figure_of(pages["profile"].read_text())
    ax = f["layout"]["xaxis"]
    assert ax["type"] == "log"
    lo, hi = ax["range"]
    assert -0.3 < lo < 0.0 and math.log10(16384) < hi < math.log10(16384) + 0.3
    for a in f["layout"].get("annotations", []):
        if a.get("xref") == "x":
            assert lo <= a["x"] <= hi, a
    names = [t["name"] for t in f["data"]]
    assert names[0] == "measured" and "profile (max)" in names
    assert len(f["data"][0]["x"]) == 8  # the n = 4096 slice


def test_dispatch_phase_figure(pages: dict[str, Path]) -> None:
    f = figure_of(pages["dispatch"].read_text())
    (hm,) = [t for t in f["data"] if t["type"] == "heatmap"]
    z = np.array(hm["z"], dtype=float)
    assert z.shape == (2, 2)
    title = f["layout"]["annotations"][0]["text"]
    assert np.ptp(z) > 0 or "constant" in title  # a flat panel says so
    assert hm["colorbar"]["x"] > 1.0  # beside the plot, not over it
    assert "<br>" in f["layout"]["title"]["text"]  # the long title is wrapped


def test_pd_phase_boundary_runs_along_cell_edges() -> None:
    from reports.pd_figure import phase_figure

    fig = phase_figure([_pd_diagram()]).to_plotly_json()
    line = next(t for t in fig["data"] if t["type"] == "scatter")
    ys = [y for y in line["y"] if y is not None]
    # PD wins up to y index i in column i: the line sits on the top edges i + 0.5
    assert ys == [0.5, 0.5, 1.5, 1.5, 2.5, 2.5]
    heat = [t for t in fig["data"] if t["type"] == "heatmap"]
    assert len(heat) == 2
    dom1 = fig["layout"]["xaxis"]["domain"][1]
    dom2 = fig["layout"]["xaxis2"]["domain"][0]
    cb = heat[0]["colorbar"]["x"]
    assert dom1 < cb < dom2 - 0.05  # the first colorbar sits in the gap, clear of panel 2
    titles = [a["text"] for a in fig["layout"]["annotations"]]
    assert "constant: 0.50 in every cell" in titles[1]  # every cell has P:D 0.5


def test_cache_curve_title_and_empty_panel(pages: dict[str, Path]) -> None:
    f = figure_of(pages["cache"].read_text())
    t = f["layout"]["title"]["text"]
    assert "mixtral-8x7b" in t and "h100-sxm" in t and "1 req/s" in t
    sub = f["layout"]["annotations"][0]["text"]
    z = np.array([[np.nan if v is None else v for v in r] for r in f["data"][0]["z"]], dtype=float)
    if np.isfinite(z).any():
        assert np.ptp(z[np.isfinite(z)]) > 0 or "constant" in sub
    else:
        assert "empty" in sub
    assert f["layout"]["showlegend"] is True


def test_cache_panel_notes() -> None:
    from reports.cache_plot import _grid_note

    class P:
        objective_kind = "goodput"

    assert "empty" in _grid_note(np.full((2, 2), np.nan), P(), 1.0)  # type: ignore[arg-type]
    note = _grid_note(np.full((2, 2), 2.0), P(), 2.0)  # type: ignore[arg-type]
    assert "constant: 2 in every stable split" in note and "capped at the offered rate" in note
    assert _grid_note(np.array([[1.0, 2.0]]), P(), 2.0) == ""  # type: ignore[arg-type]


def test_stability_figure_labels_not_hidden(pages: dict[str, Path]) -> None:
    f = figure_of(pages["stability"].read_text())
    heat = [t for t in f["data"] if t["type"] == "heatmap"]
    assert len(heat) == 2
    for t in f["data"]:
        if t["type"] == "scatter" and t.get("mode") == "markers":
            assert t["marker"]["symbol"].endswith("-open")  # labels show through
        elif t["type"] == "scatter":
            assert t["mode"] == "lines"
    colors = {c for _, c in heat[0]["colorscale"]}
    assert len(colors) == 3 and "#a1d99b" not in colors  # no light green next to green


@pytest.mark.slow
@pytest.mark.skipif(browser() is None, reason="no chromium: apt-get install chromium")
@pytest.mark.parametrize("name", ["profile", "dispatch", "cache", "stability", "pd"])
def test_renders_in_headless_chromium(pages: dict[str, Path], name: str) -> None:
    r = render(pages[name], pages[name].with_suffix(".png"))
    assert r is not None
    assert r.console_errors == []
    assert r.png_bytes > 20_000  # a blank page is ~5 kB
    rep = r.report
    assert rep["titles_inside"] and rep["colorbar_overlaps"] == 0
    assert rep["traces"] >= 1
    drawn = [p for p in rep["panels"] if p["marks"]]
    assert drawn, rep
    for p in drawn:  # the data fill their plot area, not a sliver of it
        assert p["xspan"] > 0.8 and p["yspan"] > 0.5, rep


def test_pd_phase_wide_grid_shows_the_gain_only() -> None:
    """A 20 x 20 grid has no room for the regime and the ratio in a cell: the gain map
    shows the gain (the regime is the colour), the hover text keeps everything."""
    from reports.pd_figure import TERSE_COLUMNS, phase_figure
    from reports.pd_plot import PDCell, PDPhaseDiagram

    xs = tuple(float(v) for v in range(1, TERSE_COLUMNS + 2))
    cells = tuple(
        PDCell(x=x, y=1.0, regime="disaggregated", disagg_per_gpu=1.25, colocated_per_gpu=1.0,
               gain=1.25, gpu_ratio=0.5, instance_ratio=1.0, prefill="TP1", decode="TP1",
               note="")
        for x in xs
    )  # fmt: skip
    d = PDPhaseDiagram("m", "dev", "lengths", "in", "out", xs, (1.0,), "ctx", cells)
    fig = phase_figure([d]).to_plotly_json()
    gain = next(t for t in fig["data"] if t["type"] == "heatmap")
    assert gain["text"][0] == ["1.25"] * len(xs)
    assert gain["customdata"][0][0] == "PD 1.25x<br>P:D 0.50"
    narrow = replace(d, xs=xs[:TERSE_COLUMNS], cells=cells[:TERSE_COLUMNS])
    gain = next(
        t for t in phase_figure([narrow]).to_plotly_json()["data"] if t["type"] == "heatmap"
    )
    assert gain["text"][0][0] == "PD 1.25x<br>P:D 0.50"
