"""A result a command also wrote to a file: its JSON names the file first."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


class HasDict(Protocol):
    def to_dict(self) -> Any: ...


@dataclass(frozen=True)
class Written:
    """``result`` written to ``out``: ``{"out": path, **result.to_dict()}``."""

    out: Path
    result: HasDict

    def to_dict(self) -> dict[str, Any]:
        return {"out": str(self.out), **self.result.to_dict()}


@dataclass(frozen=True)
class Engined:
    """``result`` with the engine(s) it was modelled with and the error to expect
    (``hardware.engine_note.engines_for``): ``{**result.to_dict(), **engine}``."""

    result: HasDict
    engine: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {**self.result.to_dict(), **self.engine}
