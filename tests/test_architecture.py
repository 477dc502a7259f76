"""Import contract: the layering of DESIGN.md and "one place for each formula".

aiconfigurator's early history pasted the roofline formula seven times; these tests
fail if a second copy of the performance math or a forbidden import appears.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

PACKAGES = ("perfmodel", "hardware", "solvers", "reports", "cli")
BASE = {
    "perfmodel.units",
    "perfmodel.dtypes",
    "perfmodel.errors",
    "perfmodel.datafile",
    "perfmodel",
}

# Device rates may be read only where latencies are computed (the cost layer) or shown.
RATE_ATTRS = {
    "hbm_bw_bytes_per_s",
    "bw_per_direction_bytes_per_s",
    "peer_bw_per_direction_bytes_per_s",
    "peak_flops_per_s",
}
RATE_ALLOWED = {
    "hardware/device.py",
    "hardware/roofline.py",
    "hardware/comm.py",
    "cli/hardware_cmd.py",
}


def _py_files() -> list[Path]:
    return [p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py")]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def test_hardware_uses_only_the_base_of_perfmodel() -> None:
    for p in (REPO / "hardware").rglob("*.py"):
        bad = {m for m in _imports(p) if m.split(".")[0] == "perfmodel" and m not in BASE}
        assert not bad, f"{p.relative_to(REPO)} imports {bad}: hardware/ sits below perfmodel/"


def test_layers_import_only_leftwards() -> None:
    order = ["hardware", "perfmodel", "solvers", "reports", "cli"]
    for p in _py_files():
        layer = p.relative_to(REPO).parts[0]
        for m in _imports(p):
            top = m.split(".")[0]
            if top in order and order.index(top) > order.index(layer):
                assert m in BASE, (
                    f"{p.relative_to(REPO)} imports {m}: {layer}/ may not import {top}/"
                )


def test_device_rates_read_only_in_the_cost_layer() -> None:
    for p in _py_files():
        rel = p.relative_to(REPO).as_posix()
        if rel in RATE_ALLOWED:
            continue
        tree = ast.parse(p.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in RATE_ATTRS:
                raise AssertionError(
                    f"{rel}:{node.lineno} reads {node.attr}: compute times through "
                    "hardware.roofline / hardware.comm / a cost profile instead"
                )


def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "; import sys; print(' '.join(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    return set(out.stdout.split())


def test_base_imports_nothing_heavy() -> None:
    mods = _modules_after(
        "import perfmodel.units, perfmodel.dtypes, perfmodel.errors, perfmodel.datafile"
    )
    assert "numpy" not in mods


def test_cli_startup_does_not_import_plotly_or_pulp() -> None:
    mods = _modules_after("import cli.main")
    assert not {"numpy", "scipy", "plotly", "pulp", "highspy", "networkx"} & mods


def _modules_after_command(*args: str) -> set[str]:
    """Modules loaded by running ``perfmodel ARGS`` in a fresh interpreter."""
    return _modules_after(
        "from typer.testing import CliRunner; from cli.main import app; "
        f"r = CliRunner().invoke(app, {list(args)!r}); assert r.exit_code == 0, r.output"
    )


def test_help_and_catalog_listings_import_no_numerics() -> None:
    """Start-up cost: `--help`, `hardware list` and `model list` need neither numpy nor
    scipy (numpy alone is ~0.1 s of import, scipy.special ~0.2 s, scipy.stats ~1 s)."""
    for args in (("--help",), ("hardware", "list"), ("model", "list")):
        mods = _modules_after_command(*args)
        assert not {"numpy", "scipy", "plotly", "pulp"} & mods, args


def test_capacity_imports_no_stats_plotting_or_solver() -> None:
    mods = _modules_after_command("capacity")
    assert not {"scipy.stats", "plotly", "pulp", "highspy"} & mods
