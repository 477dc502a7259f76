"""`perfmodel pd phase --grid N`: N geometric points per axis over the lists' ranges."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from cli.validate import geometric_axis

runner = CliRunner()


def test_a_geometric_axis_spans_the_range() -> None:
    """Ends kept, ratio constant; whole distinct numbers on a token axis; 3 figures on
    the SLO multipliers."""
    assert geometric_axis("inputs", [128, 512, 8192], 7) == [128, 256, 512, 1024, 2048, 4096, 8192]
    assert geometric_axis("outputs", [2, 4], 5) == [2, 3, 4]  # 2, 2.38, 2.83, 3.36, 4
    assert geometric_axis("slo_scales", [4, 0.25], 3) == [0.25, 1.0, 4.0]


def test_pd_phase_grid_sets_both_panels(tmp_path: Path) -> None:
    out = tmp_path / "p.html"
    r = runner.invoke(
        app, ["pd", "phase", "--inputs", "128,512", "--outputs", "32,128", "--slo-scales",
              "1,4", "--grid", "3", "--workers", "1", "--out", str(out), "--json"],
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    lens, slo = d["lengths"], d["slo"]
    assert lens["xs"] == [128, 256, 512] and lens["ys"] == [32, 64, 128]
    assert len(lens["cells"]) == 9 and len(slo["cells"]) == 9
    assert slo["xs"] == pytest.approx([0.5, 1.0, 2.0])  # TTFT 500 ms × 1, 2, 4


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--grid", "1"], "error: --grid must be >= 2, got 1"),
        (["--grid", "65"], "error: --grid 65 is over the work limit 64 (points per axis"),
        (["--grid", "4", "--outputs", "64"], "error: --grid needs a range: --outputs has one"),
    ],
)
def test_a_bad_grid_is_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    out = tmp_path / "p.html"
    r = runner.invoke(app, ["pd", "phase", *args, "--out", str(out)])
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1, r.output
    assert r.output.startswith(message)
    assert not out.exists()
