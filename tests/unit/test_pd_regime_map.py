"""A phase diagram too wide for a table of cells is printed as a map of regime symbols
(``PDPhaseDiagram.regime_map``) with one boundary line per column (``summary``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cli.main import app
from reports.pd_plot import REGIME_SYMBOLS, PDCell, PDPhaseDiagram, PDPhaseSweeps

runner = CliRunner()


def _cell(x: float, y: float, regime: str, dis: float, colo: float) -> PDCell:
    gain = dis / colo if dis > 0 and colo > 0 else None
    return PDCell(x, y, regime, dis, colo, gain, 1.0 if gain else None, 1.0, "", "", "")


def _diagram(xs: tuple[float, ...], ys: tuple[float, ...], regime: Any) -> PDPhaseDiagram:
    """An SLO diagram (axes in seconds, shown in ms) with ``regime(i, j)`` of cell (x_i, y_j)
    and gains 1.2 where disaggregation wins, 0.8 where colocation does."""
    cells = []
    for i, x in enumerate(xs):
        for j, y in enumerate(ys):
            r = regime(i, j)
            dis = {"disaggregated": 1.2, "colocated": 0.8, "disaggregated-only": 1.0}.get(r, 0.0)
            colo = 0.0 if r in ("disaggregated-only", "infeasible") else 1.0
            cells.append(_cell(x, y, r, dis, colo))
    return PDPhaseDiagram(
        "m", "d", "slo", "TTFT target (ms)", "TPOT target (ms)", xs, ys, "ctx", tuple(cells)
    )


def test_regime_map_hand_values() -> None:
    # column 0 TTFT 100 ms: nothing meets the SLO at TPOT 10 ms, colocated-only above;
    # column 1: disaggregated-only, then disaggregation wins, then colocated wins
    table = {
        (0, 0): "infeasible", (0, 1): "colocated-only", (0, 2): "colocated-only",
        (1, 0): "disaggregated-only", (1, 1): "disaggregated", (1, 2): "colocated",
    }  # fmt: skip
    d = _diagram((0.1, 0.25), (0.01, 0.02, 0.04), lambda i, j: table[i, j])
    assert d.regime_map() == [
        "TPOT target (ms)  TTFT target (ms) 100 … 250 (2)",
        "              10  .d",
        "              20  oD",
        "              40  oc",
        "D disaggregated  c colocated  d disaggregated-only  o colocated-only  . infeasible",
    ]
    assert set(REGIME_SYMBOLS) == {"disaggregated", "colocated", "disaggregated-only",
                                   "colocated-only", "infeasible"}  # fmt: skip
    assert d.summary(gains=False).splitlines() == [
        "TTFT target (ms) 100: colocated wins at every TPOT target (ms) "
        "(no cell where both meet the SLO)",
        "TTFT target (ms) 250: disaggregation wins up to TPOT target (ms) 20 "
        "(gains 0.80x to 1.20x)",
    ]
    # with gains: every cell of the column, as before
    assert d.summary().splitlines()[1] == (
        "TTFT target (ms) 250: disaggregation wins up to TPOT target (ms) 20 (gain by TPOT "
        "target (ms): 10: disaggregated-only, 20: 1.20x, 40: 0.80x)"
    )


@pytest.mark.parametrize("n_cols", [6, 7])
def test_pd_phase_prints_a_map_past_six_columns(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, n_cols: int
) -> None:
    """Up to six columns a table of cells; more, the map (a 20-column table of 20-character
    cells was 475 characters wide). The sweep is a hand-made one: the CLI's rendering only."""
    xs = tuple(0.1 * (k + 1) for k in range(n_cols))
    ys = (0.01, 0.02)
    slo = _diagram(xs, ys, lambda i, j: "disaggregated" if j <= i % 2 else "colocated")
    lens = _diagram((0.1,), (0.01,), lambda i, j: "colocated")
    import reports.pd_phase_run as run

    monkeypatch.setattr(run, "phase_sweeps", lambda *a, **k: PDPhaseSweeps(lens, slo))
    r = runner.invoke(app, ["pd", "phase", "--out", str(tmp_path / "p.html")])
    assert r.exit_code == 0, r.output
    rows = "DDDDDDD"[:n_cols], "cDcDcDc"[:n_cols]
    has_map = all(f"  {row}\n" in r.output for row in rows)
    assert has_map == (n_cols > 6)
    assert ("disag 1.20x P:D 1.00" in r.output) == (n_cols <= 6)
    assert max(len(line) for line in r.output.splitlines()) < 200
