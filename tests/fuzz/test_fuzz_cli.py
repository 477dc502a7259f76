"""Corpus fuzzing of every command and every reader (issue: never a traceback, a hang, a
wrong exit code or a multi-line error).

Cases, each run in-process through the CLI with a per-case time limit
(:func:`tests.fuzz.corpus.refused`):

- readers: every bad file of the corpus through each command that reads that kind of file
  (config.json, device TOML, profile TOML, shapes CSV, measurements CSV, counts CSV,
  trace CSV);
- options: every numeric option of every command with values no option may accept
  (``nan``, ``inf``, ``-inf``, text, an empty string, a 30-digit integer) and every list
  option with bad lists;
- outputs: every ``--out``/``--output`` as a directory, in a missing directory, under
  /proc, or an existing file without ``--force``.

The default run takes a fixed sample of each group; ``-m slow`` runs all of them.
"""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from pathlib import Path

import pytest
import typer

from cli.main import app
from cli.validate import CHOICES, LISTS, RULES
from tests.fuzz.corpus import (
    GOOD_CONFIG,
    GOOD_DEVICE,
    csv_cases,
    json_cases,
    refused,
    toml_cases,
    write_cases,
)

# the corpus files, written at collection (cases are parametrized by file), removed at exit
ROOT = Path(tempfile.mkdtemp(prefix="perfmodel-fuzz-"))
atexit.register(shutil.rmtree, ROOT, ignore_errors=True)


def _commands() -> dict[str, typer.core.TyperCommand]:
    out = {}

    def walk(c, path):  # type: ignore[no-untyped-def]
        if hasattr(c, "commands"):
            for n, sc in c.commands.items():
                walk(sc, [*path, n])
        else:
            out[" ".join(path)] = c

    walk(typer.main.get_command(app), [])
    return out


COMMANDS = _commands()


@pytest.fixture(scope="session")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("good")
    shapes = d / "shapes.csv"
    shapes.write_text("m,n,k\n1024,1024,1024\n")
    gemm = d / "gemm.csv"
    gemm.write_text(
        "m,n,k,latency_ms\n"
        + "".join(
            f"{m},{n},1024,{0.001 * m * n / 65536 + 0.005:.6g}\n"
            for m in (1, 16, 256, 4096)
            for n in (1024, 4096)
        )
    )
    cfg = d / "config.json"
    cfg.write_text(json.dumps(GOOD_CONFIG))
    return {"shapes": shapes, "gemm": gemm, "config": cfg, "dir": d}


def _reader_cases() -> list[tuple[str, str, list[str], Path]]:
    """(reader, case, args with FILE, file) for every corpus file and reader."""
    base = ROOT
    groups = {
        "config.json": (json_cases(GOOD_CONFIG), ".json",
                        [["model", "show", "FILE"], ["estimate", "--model", "FILE"]]),
        "device TOML": (toml_cases(GOOD_DEVICE), ".toml", [["hardware", "show", "FILE"],
                        ["estimate", "--hardware", "FILE", "--model", "llama-3.1-8b",
                         "--tp", "1"]]),
        "profile TOML": (toml_cases(GOOD_DEVICE), ".toml", [["profile", "show", "FILE"]]),
        "shapes CSV": (csv_cases("m,n,k,dtype", "1024,1024,1024,bf16"), ".csv",
                       [["predict", "gemm", "--hardware", "h100-sxm", "--input", "FILE"]]),
        "measurements CSV": (csv_cases("m,n,k,latency_ms", "16,1024,1024,0.01"), ".csv",
                             [["profile", "fit", "--data", "FILE", "--features", "gemm",
                               "--time-col", "latency_ms", "--hardware", "h100-sxm",
                               "--out", "OUT"]]),
        "counts CSV": (csv_cases("step,layer,e0,e1,e2,e3,e4,e5,e6,e7",
                                 "0,0,10,20,30,40,50,60,70,80"), ".csv",
                       [["dispatch", "solve", "--model", "mixtral-8x7b", "--counts", "FILE",
                         "--method", "heuristic"]]),
        "trace CSV": (csv_cases("input_tokens,output_tokens,arrival_s", "100,20,0.5"), ".csv",
                      [["capacity", "--trace", "FILE"]]),
    }  # fmt: skip
    out = []
    for reader, (cases, suffix, commands) in groups.items():
        sub = base / reader.replace(" ", "_").replace(".", "_")
        for p in write_cases(sub, cases, suffix):
            for args in commands:
                out.append((reader, p.name, args, p))
    return out


READER_CASES = _reader_cases()

BAD_NUMBERS = ["nan", "inf", "-inf", "abc", "", "1" + "0" * 30]
BAD_LISTS = ["1,nan", "-1", ",", "1,,x", "1e999", ",".join(["1"] * 100)]


def _option_cases() -> list[tuple[str, str, str]]:
    out = []
    for name, c in COMMANDS.items():
        for p in c.params:
            if not p.opts or not p.opts[0].startswith("--"):
                continue
            ann = getattr(getattr(p, "type_descriptor", None), "annotation", None)
            opt = max(p.opts, key=len)
            key = p.name or ""
            if ann in (int, float) or key in RULES:
                out += [(name, opt, v) for v in BAD_NUMBERS]
            elif key in LISTS:
                out += [(name, opt, v) for v in BAD_LISTS]
            elif key in CHOICES:
                out.append((name, opt, "carrier-pigeon"))
    return out


OPTION_CASES = _option_cases()

# the smallest valid invocation of each command (the bad option is appended: last wins)
BASE: dict[str, list[str]] = {
    "simulate": ["simulate", "--requests", "100"],
    "hardware show": ["hardware", "show", "h100-sxm"],
    "model show": ["model", "show", "llama-3.1-8b"],
    "predict gemm": ["predict", "gemm", "--hardware", "h100-sxm", "--input", "SHAPES"],
    "dispatch solve": ["dispatch", "solve", "--model", "mixtral-8x7b", "--method", "heuristic"],
    "dispatch place": ["dispatch", "place", "--model", "mixtral-8x7b"],
    "dispatch phase": ["dispatch", "phase", "--model", "mixtral-8x7b", "--out", "OUT"],
    "profile fit": ["profile", "fit", "--data", "GEMM", "--features", "gemm", "--time-col",
                    "latency_ms", "--hardware", "h100-sxm", "--out", "OUT"],
    "profile show": ["profile", "show", "h100-sxm:gemm_bf16"],
    "profile crossover": ["profile", "crossover", "--hardware", "h100-sxm", "--model",
                          "mixtral-8x7b"],
    "profile plot": ["profile", "plot", "--data", "GEMM", "--hardware", "h100-sxm",
                     "--profile", "h100-sxm:gemm_bf16", "--x-col", "m", "--out", "OUT"],
    "cache plan": ["cache", "plan", "--model", "mixtral-8x7b", "--offload-experts"],
    "cache plan --out": ["cache", "plan", "--model", "mixtral-8x7b", "--offload-experts",
                         "--out", "OUT"],
    "pd plan": ["pd", "plan", "--workload", "chat"],
    "pd phase": ["pd", "phase", "--workload", "chat", "--out", "OUT"],
    "phase stability": ["phase", "stability", "--out", "OUT"],
}  # fmt: skip
OUT_COMMANDS = {k: v for k, v in BASE.items() if "OUT" in v}
OUT_COMMANDS["predict gemm --output"] = [*BASE["predict gemm"], "--output", "OUT"]


def _fill(args: list[str], files: dict[str, Path], out: Path) -> list[str]:
    sub = {"SHAPES": str(files["shapes"]), "GEMM": str(files["gemm"]), "OUT": str(out)}
    return [sub.get(a, a) for a in args]


def _sample(cases: list, k: int) -> list:  # type: ignore[type-arg]
    step = max(1, len(cases) // k)
    return cases[::step]


def _ids(cases: list) -> list[str]:  # type: ignore[type-arg]
    return [" ".join(str(x) for x in c[:3])[:80] for c in cases]


def _reader_case(files: dict[str, Path], tmp_path: Path, args: list[str], p: Path) -> None:
    out = tmp_path / "o.out"
    refused(_fill([str(p) if a == "FILE" else a for a in args], files, out), out=out)


def _option_case(files: dict[str, Path], tmp_path: Path, cmd: str, opt: str, v: str) -> None:
    out = tmp_path / "o.html"
    base = BASE.get(cmd, cmd.split())
    refused(_fill([*base, opt, v], files, out), out=out)


@pytest.mark.parametrize("case", _sample(READER_CASES, 60), ids=_ids(_sample(READER_CASES, 60)))
def test_bad_file_refused(files, tmp_path, case) -> None:  # type: ignore[no-untyped-def]
    _reader, _name, args, p = case
    _reader_case(files, tmp_path, args, p)


@pytest.mark.parametrize("case", _sample(OPTION_CASES, 80), ids=_ids(_sample(OPTION_CASES, 80)))
def test_bad_option_refused(files, tmp_path, case) -> None:  # type: ignore[no-untyped-def]
    _option_case(files, tmp_path, *case)


@pytest.mark.slow
@pytest.mark.parametrize("case", READER_CASES, ids=_ids(READER_CASES))
def test_bad_file_refused_all(files, tmp_path, case) -> None:  # type: ignore[no-untyped-def]
    _reader, _name, args, p = case
    _reader_case(files, tmp_path, args, p)


@pytest.mark.slow
@pytest.mark.parametrize("case", OPTION_CASES, ids=_ids(OPTION_CASES))
def test_bad_option_refused_all(files, tmp_path, case) -> None:  # type: ignore[no-untyped-def]
    _option_case(files, tmp_path, *case)


@pytest.mark.parametrize("cmd", sorted(OUT_COMMANDS))
@pytest.mark.parametrize("where", ["dir", "missing-parent", "proc", "exists"])
def test_bad_out_refused_before_work(files, tmp_path, cmd, where) -> None:  # type: ignore[no-untyped-def]
    out = {
        "dir": tmp_path,
        "missing-parent": tmp_path / "no" / "such" / "o.html",
        "proc": Path("/proc/perfmodel-fuzz.html"),
        "exists": tmp_path / "old.html",
    }[where]
    if where == "exists":
        out.write_text("keep me")
    line = refused(_fill(OUT_COMMANDS[cmd], files, out))
    if where == "exists":
        assert out.read_text() == "keep me" and "--force" in line


def test_every_numeric_option_has_a_rule() -> None:
    """An int/float option without a rule takes NaN or 10^30 straight into the model."""
    missing = sorted(
        {
            f"{name} {max(p.opts, key=len)}"
            for name, c in COMMANDS.items()
            for p in c.params
            if getattr(getattr(p, "type_descriptor", None), "annotation", None) in (int, float)
            and p.name not in RULES
        }
    )
    assert missing == []


def test_case_count() -> None:
    """The size of the suite (reported in the issue note): at least 1,000 cases in all."""
    n = len(READER_CASES) + len(OPTION_CASES) + 4 * len(OUT_COMMANDS)
    assert n >= 1000, n
