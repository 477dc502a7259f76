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
    "perfmodel.forked",
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


# The folder order of the data flow (README "Architecture"): a module may import only
# modules of a lower rank, or of its own unit (the same folder or top-level module).
RANKS: dict[str, int] = {
    "perfmodel.base": 0,  # __init__, units, dtypes, errors, datafile, forked
    "perfmodel.special": 0,  # special functions (numpy and math only)
    "hardware": 1,
    "perfmodel.modelcfg": 1,  # config parsing and layer formulas: below the ModelSpec
    "perfmodel.model": 2, "perfmodel.catalog": 2, "perfmodel.workload": 2,
    "perfmodel.plan": 3,
    "perfmodel.memory": 4,
    "perfmodel.moe": 5,
    "perfmodel.step": 6,
    "perfmodel.serving": 7,
    "perfmodel.sim": 8,
    "perfmodel.pd": 9, "perfmodel.cache": 9, "perfmodel.estimate": 9, "perfmodel.cost": 9,
    "perfmodel.validate": 10,  # predicts static batches through perfmodel.estimate
    "solvers": 10,
    "reports": 11,
    "cli": 12,
}  # fmt: skip


def unit_of(module: str) -> str:
    """The ranked unit a dotted module belongs to (its folder, or itself at top level)."""
    parts = module.split(".")
    if module == "perfmodel" or module in BASE:
        return "perfmodel.base"
    if parts[0] != "perfmodel":
        return parts[0]
    return ".".join(parts[:2])


def order_violations(module: str, imported: set[str]) -> list[str]:
    """Imports of ``module`` that point up the folder order (or into an unranked unit)."""
    me = unit_of(module)
    if me not in RANKS:
        return [f"{module} is in no ranked folder: add {me} to RANKS in {Path(__file__).name}"]
    out = []
    for m in imported:
        if m.split(".")[0] not in PACKAGES:
            continue
        u = unit_of(m)
        if u == me:
            continue
        if u not in RANKS:
            out.append(f"{module} imports {m}, which is in no ranked folder")
        elif RANKS[u] >= RANKS[me]:
            out.append(
                f"{module} imports {m}: {u} (rank {RANKS[u]}) is not below {me} (rank {RANKS[me]})"
            )
    return out


def _module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    return ".".join(rel.parts).removesuffix(".__init__") or rel.parts[0]


def test_modules_import_only_down_the_folder_order() -> None:
    bad = [v for p in _py_files() for v in order_violations(_module_name(p), _imports(p))]
    assert not bad, "\n".join(bad)


def test_folder_order_check_catches_a_violation() -> None:
    # the step layer reaching up into serving, and the base importing anything
    assert order_violations("perfmodel.step.ops", {"perfmodel.serving.latency"})
    assert order_violations("perfmodel.units", {"perfmodel.model"})
    assert order_violations("perfmodel.memory", {"perfmodel.step.ops"})
    assert order_violations("perfmodel.newthing.x", set())  # an unranked folder
    assert not order_violations("perfmodel.serving.latency", {"perfmodel.step.time"})
    assert not order_violations("perfmodel.pd.config", {"perfmodel.pd.decode"})


UNIT_LITERALS = {1e3, 1e6, 1e9, 1e12, 1e15}
POW_LITERALS = {(2, 10), (2, 20), (2, 30), (2, 40), (1024, 2), (1024, 3), (1024, 4),
                (10, 3), (10, 6), (10, 9), (10, 12)}  # fmt: skip


def unit_literals(source: str) -> list[int]:
    """Lines where a unit-prefix literal scales a value (``x * 1e3``, ``2**30``)."""
    lines = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult | ast.Div):
            for side in (n.left, n.right):
                if (
                    isinstance(side, ast.Constant)
                    and not isinstance(side.value, bool)
                    and (isinstance(side.value, float) and side.value in UNIT_LITERALS)
                ):
                    lines.append(n.lineno)
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Pow):
            base, exp = n.left, n.right
            if (
                isinstance(base, ast.Constant)
                and isinstance(exp, ast.Constant)
                and (base.value, exp.value) in POW_LITERALS
            ):
                lines.append(n.lineno)
    return lines


def test_unit_prefix_literals_only_in_units() -> None:
    bad = [
        f"{p.relative_to(REPO)}:{line}"
        for p in _py_files()
        if p.relative_to(REPO).as_posix() != "perfmodel/units.py"
        for line in unit_literals(p.read_text(encoding="utf-8"))
    ]
    assert not bad, f"unit-prefix literals outside perfmodel/units.py: {bad}"


def test_unit_literal_check_catches_a_violation() -> None:
    assert unit_literals("t_ms = t_s * 1e3\n") == [1]
    assert unit_literals("x = 1\ngib = 2**30\n") == [2]
    assert unit_literals("b = n / 1e9\n") == [1]
    assert unit_literals("tol = 1e-9 * x\nslo_ms = 1000.0\n") == []


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


def test_help_is_plain_click_without_rich() -> None:
    """``perfmodel --help`` through the real entry point renders Click's plain help:
    Typer's rich layer (rich, markdown-it, pygments) is ~0.1 s of import, 40 % of it."""
    mods = _modules_after(
        "import sys; sys.argv = ['perfmodel', '--help']; from cli.main import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass"
    )
    assert "cli.main" in mods and "typer" in mods
    assert not {"rich", "markdown_it", "pygments", "numpy"} & mods


def test_capacity_imports_no_stats_plotting_or_solver() -> None:
    mods = _modules_after_command("capacity")
    assert not {"scipy.stats", "plotly", "pulp", "highspy"} & mods


def test_capacity_cli_imports_no_scipy() -> None:
    """Start-up cost: ``perfmodel capacity`` (the README's first job) computes its special
    functions and its linear solve without scipy (``perfmodel.special``,
    ``perfmodel.serving.stationary``): scipy.special or scipy.linalg is ~0.2 s of import;
    its options are converted without pydantic (``cli.coerce``: ~0.08 s under Typer
    0.29), and it builds only the command it runs (``cli.main.COMMANDS``)."""
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "cli.main", "capacity"],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    mods = {line.split("|")[-1].strip() for line in out.stderr.splitlines() if "|" in line}
    assert "perfmodel.serving.capacity" in mods
    heavy = {"scipy", "networkx", "plotly", "pulp", "pydantic", "cli.plan_cmd", "cli.pd_cmd"}
    assert not heavy & mods


def test_pd_plan_imports_no_scipy(tmp_path: Path) -> None:
    """Start-up cost of ``pd plan`` (the aiconfigurator comparison): its normal CDFs come
    from ``perfmodel.special``, its M/G/1 root from Newton — no scipy.special, .optimize or
    .stats (~0.15 s) — and no scipy at all: the colocated baseline's chain is solved by
    censoring (``perfmodel.serving.stationary``), not by scipy.linalg."""
    trace = tmp_path / "t.csv"
    trace.write_text("input_tokens,output_tokens\n1024,128\n")
    args = ["pd", "plan", "--model", "llama-3.1-8b", "--hardware", "h100-sxm",
            "--trace", str(trace), "--rate-per-s", "2", "--max-gpus", "2", "--json"]  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "cli.main", *args],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    mods = {line.split("|")[-1].strip() for line in out.stderr.splitlines() if "|" in line}
    assert "solvers.pd.plan" in mods
    assert not {m for m in mods if m.split(".")[0] == "scipy"}


# --json comes from a library result's to_dict() (cli.common.json_of): the CLI neither
# serializes JSON itself nor hands echo_json a dict or list it built.
BUILT = (ast.Dict, ast.DictComp, ast.List, ast.ListComp, ast.Tuple, ast.Set, ast.GeneratorExp)


def hand_built_json(source: str) -> list[int]:
    """Lines of CLI code that build a command's JSON by hand."""
    bad = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
        owner = getattr(f.value, "id", "") if isinstance(f, ast.Attribute) else ""
        if owner == "json" and name in ("dump", "dumps"):
            bad.append(node.lineno)
        elif name == "echo_json":
            arg = node.args[0] if node.args else None
            built = isinstance(arg, BUILT) or (
                isinstance(arg, ast.Call) and getattr(arg.func, "attr", "") == "to_dict"
            )
            if built or len(node.args) != 1 or node.keywords:
                bad.append(node.lineno)
    return bad


def test_cli_builds_no_json_by_hand() -> None:
    bad = [
        f"{p.relative_to(REPO)}:{line}"
        for p in sorted((REPO / "cli").rglob("*.py"))
        if p.name != "common.py"
        for line in hand_built_json(p.read_text(encoding="utf-8"))
    ]
    assert not bad, f"--json must be echo_json(result) of a library result object: {bad}"


def test_hand_built_json_check_catches_a_violation() -> None:
    assert hand_built_json("echo_json({'model': m.id, **r.to_dict()})") == [1]
    assert hand_built_json("echo_json([d.to_dict() for d in ds])") == [1]
    assert hand_built_json("echo_json(r.to_dict())") == [1]
    assert hand_built_json("typer.echo(json.dumps(out))") == [1]
    assert hand_built_json("echo_json(report)\necho_json(devices)") == []
