"""Every command's ``--json`` is ``to_dict()`` of a library result object.

Walks the Typer app: every command with ``--json`` has a quick case in
``tests/cli/json_cases.py``; run in-process, it prints JSON exactly once, through
``cli.common.json_of``, of an object (or a list of objects) whose class lives in the
library (not in ``cli/``) and whose ``to_dict()`` is what was printed. A dict or list
built in the CLI fails here (``json_of`` refuses it) and in mypy (``echo_json`` takes a
``Result``); ``tests/contract/test_architecture.py`` checks the CLI sources for it too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from cli import common
from cli.main import app
from tests.cli.json_cases import json_cases
from tests.cli.test_options import _commands, _options

runner = CliRunner()
CASES = json_cases(Path("unused"), write=False)  # the names; each test writes its files


def _json_commands() -> set[str]:
    return {path for path, cmd in _commands().items() if "--json" in _options(cmd)}


def test_every_json_command_has_a_case() -> None:
    assert _json_commands() == set(CASES), "add the new command's case to json_cases.py"


@pytest.mark.parametrize("path", sorted(CASES))
def test_json_is_the_to_dict_of_a_library_result(
    path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[Any] = []
    real = common.json_of

    def spy(result: Any) -> Any:
        seen.append(result)
        return real(result)

    monkeypatch.setattr(common, "json_of", spy)
    r = runner.invoke(app, json_cases(tmp_path)[path])
    assert r.exit_code == 0, r.output
    assert len(seen) == 1, f"{path} printed JSON {len(seen)} times, not once through json_of"
    (result,) = seen
    many = isinstance(result, list | tuple)
    items = result if many else [result]
    for it in items:
        assert callable(getattr(it, "to_dict", None)), f"{path}: {type(it).__name__}"
        assert type(it).__module__.split(".")[0] != "cli", (
            f"{path}: its result {type(it).__name__} is defined in the CLI; results belong "
            "to the library"
        )
    want = [it.to_dict() for it in items] if many else result.to_dict()
    got = json.loads(r.stdout)
    assert got == json.loads(json.dumps(common._clean(want), default=common._default))


@pytest.mark.parametrize("built", [{"a": 1}, [{"a": 1}], ({"a": 1},), "text", 3.0])
def test_json_of_refuses_what_the_cli_built(built: Any) -> None:
    with pytest.raises(TypeError, match="to_dict"):
        common.json_of(built)
