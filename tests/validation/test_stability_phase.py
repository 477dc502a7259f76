"""Stability phase diagram: analytic boundary, regimes, simulator agreement, figure, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from cli.main import app
from hardware.device import load_device
from perfmodel.model import load_model
from perfmodel.plan import ParallelPlan
from perfmodel.serving import service as q
from perfmodel.step.instance import Instance
from perfmodel.workload.lengths import fixed_lengths, lognormal_lengths
from perfmodel.workload.presets import PRESETS, Workload, preset
from perfmodel.workload.slo import SLO
from reports.stability_plot import stability_figure, stability_html
from reports.stability_result import StabilityPhase
from reports.stability_sweep import (
    DEFAULT_SIM_LOADS,
    DEFAULT_SIM_REQUESTS,
    scale_output_lengths,
    stability_phase,
)

M8 = load_model("llama-3.1-8b")
H100 = load_device("h100-sxm")
PLAN = ParallelPlan()
# the chat preset's laws on a coarser 24 × 24 grid of atoms: same shape, faster moments
SMALL = Workload("chat-24", lognormal_lengths(*PRESETS["chat"], name="chat-24", n=24))
OUTS = (60.0, 211.0, 600.0)
KVS = (30_000, 120_000)


@pytest.fixture(scope="module")
def phase() -> StabilityPhase:
    return stability_phase(
        M8,
        H100,
        PLAN,
        SMALL,
        slo=SLO(0.5, 0.05),
        mean_output_tokens=OUTS,
        kv_capacities_tokens=KVS,
        rates=10,
        sim_rows=2,
        sim_loads=DEFAULT_SIM_LOADS,
        sim_requests=DEFAULT_SIM_REQUESTS,
        seed=1,
    )


def test_scaled_outputs_hit_the_mean() -> None:
    s = scale_output_lengths(fixed_lengths(100, 50), 200)
    assert s.output_tokens.tolist() == [200] and s.input_tokens.tolist() == [100]
    chat = preset("chat").lengths
    assert scale_output_lengths(chat, 500).mean_output_tokens == pytest.approx(500, rel=0.01)


def test_boundary_is_the_service_rate(phase: StabilityPhase) -> None:
    """The figure's boundary at each output length is ``service_rate`` of that workload."""
    out, kv = phase.panel("output"), phase.panel("kv")
    m0 = q.service_rate(Instance(M8, H100, PLAN), SMALL).kv_capacity_tokens
    want = []
    for y in OUTS:
        ls = scale_output_lengths(SMALL.lengths, y)
        sr = q.service_rate(Instance(M8, H100, PLAN), Workload(ls.name, ls), kv_capacity_tokens=m0)
        want.append(sr.rate_per_s)
    assert [r.service_rate_per_s for r in out.rows] == pytest.approx(want, rel=1e-12)
    want_kv = [
        q.service_rate(Instance(M8, H100, PLAN), SMALL, kv_capacity_tokens=k).rate_per_s
        for k in KVS
    ]
    assert [r.service_rate_per_s for r in kv.rows] == pytest.approx(want_kv, rel=1e-12)
    fig = stability_figure(phase)
    lines = [t for t in fig.data if t.name and t.name.startswith("μ")]
    assert len(lines) == 2
    assert list(lines[0].x) == pytest.approx(want) and list(lines[0].y) == pytest.approx(OUTS)
    assert list(lines[1].x) == pytest.approx(want_kv)
    # longer outputs and smaller caches both lower the boundary
    assert want[0] > want[1] > want[2] and want_kv[0] < want_kv[1]


def test_cells_split_at_the_boundary(phase: StabilityPhase) -> None:
    for p in phase.panels:
        for i, row in enumerate(p.rows):
            mu = row.service_rate_per_s
            cells = [p.cell(i, j) for j in range(len(p.rates_per_s))]
            assert {c.regime == "unstable" for c in cells} == {True, False}  # both sides
            for c in cells:
                assert (c.regime == "unstable") == (c.rate_per_s >= mu)
                assert c.margin == pytest.approx(1 - c.rate_per_s / mu)
                assert c.binding == row.binding
                if c.regime == "slo-feasible":
                    assert row.slo_feasible and c.rate_per_s <= row.goodput_per_s
                elif c.regime == "stable":
                    assert not row.slo_feasible or c.rate_per_s > row.goodput_per_s
            assert row.goodput_per_s <= mu


def test_simulated_points_agree_on_both_sides_near_the_boundary(phase: StabilityPhase) -> None:
    pts = [pt for p in phase.panels for pt in p.points]
    assert len(pts) == 16
    near = [pt for pt in pts if abs(pt.utilization - 1) <= 0.1 + 1e-9]
    assert {pt.utilization < 1 for pt in near} == {True, False}  # both sides, within ±10 %
    assert len(near) == 8
    bad = [(pt.y, pt.utilization, pt.queue_growth_per_s) for pt in pts if not pt.agrees]
    assert not bad, bad
    # the 30,000-token cache is strongly memory-bound: the corrected μ still holds there
    small = [pt for pt in phase.panel("kv").points if pt.y == 30_000]
    assert phase.panel("kv").rows[0].binding == "memory" and len(small) == 4
    assert [pt.simulated_stable for pt in small] == [True, True, False, False]


def test_vectorised_cells_match_the_stability_formula(phase: StabilityPhase) -> None:
    """Each cell's regime and margin are ``q.stability``'s at its rate (old per-cell loop)."""
    for p in phase.panels:
        for i, row in enumerate(p.rows):
            for j, lam in enumerate(p.rates_per_s):
                c = p.cell(i, j)
                sr_mu = row.service_rate_per_s
                assert c.margin == 1.0 - lam / sr_mu and c.utilization == lam / sr_mu
                stable = lam < sr_mu and row.largest_request_fits
                want = (
                    "unstable"
                    if not stable
                    else "slo-feasible"
                    if row.slo_feasible and lam <= row.goodput_per_s
                    else "stable"
                )
                assert c.regime == want


def test_html_is_self_contained(phase: StabilityPhase) -> None:
    html = stability_html(phase)
    assert "<html>" in html[:100] and "plotly" in html.lower()
    assert '<script src="http' not in html and len(html) > 1_000_000  # plotly.js inlined
    d = phase.to_dict()
    cell = d["panels"][0]["cells"][0]
    assert {"regime", "margin", "utilization", "binding", "rate_per_s", "y"} <= set(cell)
    json.dumps(d)  # serializable as is


runner = CliRunner()


def _cli(*args: str) -> tuple[int, str]:
    r = runner.invoke(app, ["phase", "stability", *args])
    return r.exit_code, r.output


def test_cli_writes_html_and_json(tmp_path: Path) -> None:
    out = tmp_path / "p.html"
    args = ["--out", str(out), "--rates", "4", "--sim-requests", "0"]
    args += ["--output-tokens", "100", "--kv-grid-tokens", "50000", "--json"]
    code, text = _cli(*args)
    assert code == 0, text
    d = json.loads(text[text.index("{") :])
    assert "<html>" in out.read_text()[:100]
    kv = d["panels"][1]
    assert [r["kv_capacity_tokens"] for r in kv["rows"]] == [50_000]
    assert len(kv["cells"]) == 4 and all(c["regime"] in REGIMES for c in kv["cells"])
    mu = kv["rows"][0]["service_rate_per_s"]
    assert all((c["regime"] == "unstable") == (c["rate_per_s"] >= mu) for c in kv["cells"])
    code, text = _cli(*args)  # exists, no --force
    assert code == 2 and "--force" in text


REGIMES = ("slo-feasible", "stable", "unstable")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--output-tokens", "100,x"], "--output-tokens: 'x' is not a number"),
        (["--kv-grid-tokens", "-5"], "--kv-grid-tokens: '-5' must be >= 1"),
        (["--rates", "1"], "--rates must be >= 2"),
        (["--ttft-slo-ms", "0"], "--ttft-slo-ms must be > 0"),
        (["--sim-requests", "-1"], "--sim-requests must be a non-negative integer"),
        (["--workload", "nope"], "unknown workload"),
    ],
)
def test_cli_bad_input_exits_2(tmp_path: Path, extra: list[str], message: str) -> None:
    code, text = _cli("--out", str(tmp_path / "x.html"), *extra)
    assert code == 2 and message in text
    assert not (tmp_path / "x.html").exists()


def test_cli_missing_directory_exits_2(tmp_path: Path) -> None:
    code, text = _cli("--out", str(tmp_path / "no" / "x.html"))
    assert code == 2 and "does not exist" in text


def test_rate_grid_brackets_every_row(phase: StabilityPhase) -> None:
    for p in phase.panels:
        mus = np.array([r.service_rate_per_s for r in p.rows])
        assert p.rates_per_s[0] < mus.min() and p.rates_per_s[-1] > mus.max()


@pytest.mark.slow  # a LocalCluster's start and its workers' imports: seconds
def test_the_jobs_give_the_same_phase_serial_forked_and_on_dask(phase: StabilityPhase) -> None:
    """The rows' searches and the simulated points are independent jobs with their seeds
    fixed by their place: the fixture's sweep (forked workers, the default) equals the
    serial one and a 2-process LocalCluster's, points and all."""
    pytest.importorskip("dask.distributed")
    kw = {
        "slo": SLO(0.5, 0.05), "mean_output_tokens": OUTS, "kv_capacities_tokens": KVS,
        "rates": 10, "sim_rows": 2, "sim_loads": DEFAULT_SIM_LOADS,
        "sim_requests": DEFAULT_SIM_REQUESTS, "seed": 1,
    }  # fmt: skip
    serial = stability_phase(M8, H100, PLAN, SMALL, workers=1, **kw)  # type: ignore[arg-type]
    dask = stability_phase(M8, H100, PLAN, SMALL, scheduler="local", workers=2, **kw)  # type: ignore[arg-type]
    assert phase == serial == dask
    assert len(phase.panel("output").points) == 2 * len(DEFAULT_SIM_LOADS)


def test_the_simulated_points_are_seeded_in_panel_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """The k-th simulated point over both panels (the output panel's first, each panel's
    rows in order, each row's loads in order) gets ``SeedSequence([seed, k])``, k = 1, 2,
    … — the numbering of the sequential sweep, whatever runs the jobs."""
    import numpy as np

    import reports.stability_sweep as ss

    sent: list = []

    def capture(jobs, **_kw):  # type: ignore[no-untyped-def]
        sent.extend(jobs)
        return [job() for job in jobs]

    monkeypatch.setattr(ss, "map_jobs", capture)
    loads = (0.9, 1.1)
    stability_phase(
        M8, H100, PLAN, SMALL, slo=SLO(0.5, 0.05), mean_output_tokens=OUTS,
        kv_capacities_tokens=KVS, rates=4, sim_rows=2, sim_loads=loads, sim_requests=200,
        seed=7,
    )  # fmt: skip
    sims = [j for j in sent if j.func is ss._sim_point]
    assert len(sims) == 2 * 2 * len(loads)  # two panels, two rows each
    want = [int(np.random.SeedSequence([7, k]).generate_state(1)[0]) for k in range(1, 9)]
    assert [j.args[-1] for j in sims] == want
    assert [j.args[4] for j in sims] == list(loads) * 4  # each row's loads in order
    rows = [j for j in sent if j.func is ss._row]
    assert [j.args[1] for j in rows] == [*OUTS, *map(float, KVS)]
