"""Size rules of the layout (issue 11): no library module over 400 lines, no function
over 120 — small modules a newcomer can read, functions that do one thing."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ("perfmodel", "hardware", "solvers", "reports", "cli")
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 120


def library_files() -> list[Path]:
    return sorted(p for d in LIBRARY for p in (ROOT / d).rglob("*.py"))


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int]]:
    """``(name, lines)`` of every function or method longer than ``limit`` lines."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            n = (node.end_lineno or node.lineno) - node.lineno + 1
            if n > limit:
                out.append((node.name, n))
    return out


def test_no_library_module_over_400_lines() -> None:
    big = {}
    for p in library_files():
        n = len(p.read_text(encoding="utf-8").splitlines())
        if n > MAX_MODULE_LINES:
            big[str(p.relative_to(ROOT))] = n
    assert not big, f"split these modules (> {MAX_MODULE_LINES} lines): {big}"


def test_no_library_function_over_120_lines() -> None:
    big = {}
    for p in library_files():
        for name, n in long_functions(p.read_text(encoding="utf-8")):
            big[f"{p.relative_to(ROOT)}:{name}"] = n
    assert not big, f"split these functions (> {MAX_FUNCTION_LINES} lines): {big}"


def test_the_function_rule_catches_a_long_function() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(121))
    assert long_functions(f"def f():\n{body}\n") == [("f", 122)]
    assert long_functions("def g():\n    return 1\n") == []
