"""Shared test fixtures: where ../shared/data lives (read in place, never copied)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"

# Commands stop after 50 s by default (cli.common.time_limit). Tests run many commands on
# a loaded machine: give them room; the tests of the limit itself set it explicitly.
os.environ.setdefault("PERFMODEL_TIME_LIMIT_S", "600")

settings.register_profile("ci", max_examples=60, deadline=None)
settings.register_profile("dev", max_examples=25, deadline=None)
settings.load_profile("ci")


def shared_file(*parts: str) -> Path:
    """A file under ../shared/data, or skip the test when the folder is absent."""
    p = SHARED_DATA.joinpath(*parts)
    if not p.exists():
        pytest.skip(f"{p} not present (../shared/data is needed for validation tests)")
    return p
