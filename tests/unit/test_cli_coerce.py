"""Option values converted without pydantic (``cli/coerce.py``): the same values and the
same errors as Typer's own pydantic conversion."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import pytest
import typer

import cli.main  # noqa: F401 - installs the plain conversion
from cli.coerce import _UNSET, plain_value

pydantic = pytest.importorskip("pydantic")

INT_TEXTS = ["3", "-3", "+3", "0", "-0", "00012", "8192", "999999999999999999"]
FLOAT_TEXTS = ["0.5", "50", "-1.25", "1e3", "1E-3", "+.5", "1.", "7e308", "2.5e-7"]
ODD_TEXTS = [" 3 ", "3\n", "3.0", "3.5", "1_000", "1e3", "inf", "-inf", "nan", "NaN",
             "Infinity", "", "0x10", "\u0663", "1e309", "99999999999999999999999", "abc",
             "1_0.5", "3.00000000000000001", "1e-400"]  # fmt: skip


def _pydantic(annotation: Any, value: Any) -> tuple[str, Any]:
    try:
        got = pydantic.TypeAdapter(annotation).validate_python(value)
    except pydantic.ValidationError as e:
        return ("error", e.errors()[0]["type"])
    return (type(got).__name__, got)


@pytest.mark.parametrize("text", INT_TEXTS)
def test_plain_integers_are_taken_as_pydantic_reads_them(text: str) -> None:
    got = plain_value(int, text)
    assert got is not _UNSET, "a plain integer must not need pydantic"
    assert (type(got).__name__, got) == _pydantic(int, text)


@pytest.mark.parametrize("text", INT_TEXTS + FLOAT_TEXTS)
def test_plain_numbers_are_taken_as_pydantic_reads_them(text: str) -> None:
    got = plain_value(float, text)
    assert got is not _UNSET, "a plain decimal number must not need pydantic"
    assert (type(got).__name__, got) == _pydantic(float, text)


@pytest.mark.parametrize("annotation", [int, float, str, bool, list[str]])
@pytest.mark.parametrize("value", [*ODD_TEXTS, 3, 2.5, True, None, ("a", "b"), ["x"], ("a", 1)])
def test_anything_taken_is_what_pydantic_gives(annotation: Any, value: Any) -> None:
    """Every value: either left to Typer (pydantic) or converted to exactly its answer."""
    got = plain_value(annotation, value)
    if got is _UNSET:
        return
    assert (type(got).__name__, got) == _pydantic(annotation, value)


def test_odd_values_are_left_to_typer() -> None:
    for text in ODD_TEXTS:
        assert plain_value(int, text) is _UNSET or text.strip("+-").isdigit()
    assert plain_value(int, "3.0") is _UNSET  # pydantic takes it: Typer decides
    assert plain_value(float, "inf") is _UNSET
    assert plain_value(int, True) is _UNSET  # bool is not an int here


def _app() -> Any:
    app = typer.Typer()

    @app.command()
    def run(
        n: int = 1,
        x: float = 0.5,
        name: str = "a",
        where: Annotated[Path, typer.Option(exists=True)] = Path("."),
        tags: Annotated[list[str] | None, typer.Option()] = None,
        low: Annotated[int, typer.Option(min=2)] = 2,
    ) -> None:
        typer.echo(repr((n, x, name, where, tags, low)))

    return app


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], (1, 0.5, "a", Path("."), None, 2)),
        (["--n", "7", "--x", "1e3", "--name", "b", "--tags", "p", "--tags", "q"],
         (7, 1000.0, "b", Path("."), ["p", "q"], 2)),
        (["--n", " 3 ", "--x", "inf"], (3, float("inf"), "a", Path("."), None, 2)),  # Typer's
        (["--n", "3.0", "--x", "1_0.5"], (3, 10.5, "a", Path("."), None, 2)),  # Typer's
    ],
)  # fmt: skip
def test_a_command_gets_the_values_typer_gives(args: list[str], expected: tuple[Any]) -> None:
    from typer.testing import CliRunner

    r = CliRunner().invoke(_app(), args)
    assert r.exit_code == 0, r.output
    got = eval(r.output.strip(), {"PosixPath": Path, "inf": float("inf")})
    assert got == expected


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--n", "1.5"], "Invalid value for '--n'"),
        (["--x", "abc"], "Invalid value for '--x'"),
        (["--where", "/no/such/dir/here"], "does not exist"),
        (["--low", "1"], "greater than or equal to 2"),
    ],
)
def test_bad_values_get_typers_errors(args: list[str], words: str) -> None:
    from typer.testing import CliRunner

    r = CliRunner().invoke(_app(), args)
    assert r.exit_code == 2
    assert words in r.output


def test_the_cli_converts_plain_options_without_pydantic() -> None:
    """``perfmodel plan`` parses its 26 options (and refuses one) with no pydantic import:
    ~0.08 s of every command's start-up under Typer 0.29."""
    import subprocess
    import sys

    code = (
        "import sys; sys.argv = ['perfmodel', 'plan', '--rate-per-s', '12.5', "
        "'--buckets', '2', '--devices', 'h100-sxm', '--max-batched-tokens', '0']\n"
        "from cli.main import main\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert e.code == 2\n"
        "print(' '.join(sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert "--max-batched-tokens must be" in out.stderr
    assert "cli.plan_cmd" in out.stdout.split()
    assert not {m for m in out.stdout.split() if m.split(".")[0] == "pydantic"}
