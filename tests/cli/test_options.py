"""The shared options: one name, one unit suffix and one default in every command."""

from __future__ import annotations

from typing import Any

import typer.main

from cli import options as o
from cli.main import app

SHARED: dict[str, Any] = {
    "--model": o.DEFAULT_MODEL,
    "--hardware": o.DEFAULT_HARDWARE,
    "--tp": 1,
    "--pp": 1,
    "--workload": o.DEFAULT_WORKLOAD,
    "--trace": None,
    "--arrival-cv": 1.0,
    "--ttft-slo-ms": o.DEFAULT_TTFT_SLO_MS,
    "--tpot-slo-ms": o.DEFAULT_TPOT_SLO_MS,
    "--slo-percentile": o.DEFAULT_SLO_PERCENTILE,
    "--goal": o.DEFAULT_GOAL,
    "--kv-capacity-tokens": None,
    "--max-batched-tokens": o.DEFAULT_MAX_BATCHED_TOKENS,
    "--chunk-size": None,
    "--seed": 0,
    "--force": False,
    "--json": False,
    "--engine": o.DEFAULT_ENGINE,
}
# Names that mean a shared option under another name (or without its unit suffix).
ALIASES = {
    "--percentile",
    "--slo-pct",
    "--ttft-slo",
    "--tpot-slo",
    "--rate",
    "--device",
    "--kv-capacity",
}
MOE_COMMANDS = {"dispatch solve", "dispatch place", "dispatch phase", "profile crossover"}
# A stored profile names its device and model: there --hardware/--model default to the file's.
PROFILE_COMMANDS = {"profile show", "profile plot"}
# Commands that compute no engine iteration time, memory fit or batch limit, with the reason;
# every other command must take --engine (a new command that computes a time and forgets
# the option fails test_every_time_computing_command_takes_engine).
NO_ENGINE_COMMANDS = {
    "hardware list": "catalog listing",
    "hardware show": "device datasheet and ridge points",
    "model list": "catalog listing",
    "model show": "parameter and byte counts",
    "predict gemm": "kernel latencies from a fitted cost profile, not an engine iteration",
    "profile fit": "fits a kernel cost profile to measurements",
    "profile show": "prints a stored profile",
    "profile plot": "plots a stored profile against its measurements",
    "profile crossover": "kernel-level regime crossover of an expert block",
    "dispatch solve": "one MoE layer's expert-block makespan from --profile (kernel level)",
    "dispatch place": "expert placement on the --profile makespan (kernel level)",
    "dispatch phase": "dispatch gain over the --profile makespan (kernel level)",
    "claims list": "catalog listing",
    "claims check": "a claim fixes its paper's own setup (engine included)",
    "claims report": "a claim fixes its paper's own setup (engine included)",
}
# --engine whose default is not the shared one, with the reason.
ENGINE_DEFAULTS = {"validate": "default: each measurement row's own engine column"}


def _commands() -> dict[str, Any]:
    out: dict[str, Any] = {}

    def walk(c: Any, path: list[str]) -> None:
        if hasattr(c, "commands"):
            for name, sub in c.commands.items():
                walk(sub, [*path, name])
        else:
            out[" ".join(path)] = c

    walk(typer.main.get_command(app), [])
    return out


def _options(cmd: Any) -> dict[str, Any]:
    return {p.opts[0]: p for p in cmd.params if getattr(p, "opts", None) and p.opts[0][:2] == "--"}


def test_shared_options_have_one_default_everywhere() -> None:
    bad = []
    for path, cmd in _commands().items():
        for name, p in _options(cmd).items():
            if name not in SHARED or p.required:
                continue
            if path in PROFILE_COMMANDS and name in ("--hardware", "--model") and p.default is None:
                continue
            if name == "--engine" and path in ENGINE_DEFAULTS:
                continue
            want = SHARED[name]
            if name == "--model" and path in MOE_COMMANDS:
                want = o.DEFAULT_MOE_MODEL  # or None where --counts gives the experts
                if p.default is None:
                    continue
            if p.default != want:
                bad.append(f"{path} {name}: default {p.default!r}, shared default {want!r}")
    assert not bad, "\n".join(bad)


def test_no_command_spells_a_shared_option_another_way() -> None:
    bad = [f"{path} {name}" for path, cmd in _commands().items()
           for name in _options(cmd) if name in ALIASES]  # fmt: skip
    assert not bad, f"use the shared option names instead: {bad}"


def test_walk_sees_every_command() -> None:
    # the walk itself must find the commands (a broken walk would pass the tests above)
    cmds = _commands()
    assert {"capacity", "simulate", "estimate", "pd plan", "cache plan", "dispatch solve"} <= set(
        cmds
    )
    assert "--ttft-slo-ms" in _options(cmds["capacity"])


def test_every_time_computing_command_takes_engine() -> None:
    cmds = _commands()
    missing = [
        p for p, c in cmds.items() if p not in NO_ENGINE_COMMANDS and "--engine" not in _options(c)
    ]
    assert not missing, (
        f"commands that compute a time need --engine (cli.options.EngineOpt): {missing}"
    )
    stale = sorted(set(NO_ENGINE_COMMANDS) - set(cmds))
    assert not stale, f"NO_ENGINE_COMMANDS names commands that no longer exist: {stale}"
    assert {"pd plan", "pd phase", "cache plan", "phase stability", "plan", "sweep"} <= {
        p for p, c in cmds.items() if "--engine" in _options(c)
    }


def test_engine_option_has_one_help_everywhere() -> None:
    texts = {
        path: opt.help
        for path, c in _commands().items()
        if (opt := _options(c).get("--engine")) is not None
        and path not in ENGINE_DEFAULTS
        and not opt.required
    }
    assert len(texts) >= 9 and len(set(texts.values())) == 1, texts
