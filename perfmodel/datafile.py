"""Reading data files (TOML or JSON) with errors that name the file: part of the base.

Imports nothing of the project but ``perfmodel.errors``, so ``hardware/`` may use it.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

from perfmodel.errors import SpecError


def read_data_file(path: str | Path, *, what: str) -> dict[str, Any]:
    """The top-level table of a ``.toml`` or ``.json`` file.

    Raises SpecError ``cannot read <what> <path>: ...`` or ``<path>: malformed TOML: ...``.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise SpecError(f"cannot read {what} {p}: {e.strerror}") from None
    is_json = p.suffix.lower() == ".json"
    try:
        data = json.loads(text) if is_json else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as e:
        raise SpecError(f"{p}: malformed {'JSON' if is_json else 'TOML'}: {e}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{p}: expected a {'JSON object' if is_json else 'table'} at the top level")
    return data
