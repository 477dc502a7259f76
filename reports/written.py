"""A result a command also wrote to a file: its JSON names the file first."""

from __future__ import annotations

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
