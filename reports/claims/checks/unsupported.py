"""A claim the tool cannot check yet: the file says what is missing."""

from __future__ import annotations

from reports.claims.setup import Side
from reports.claims.verdict import Outcome


def not_checkable(params: Side) -> Outcome:
    """``params.missing``: what the tool lacks to check this claim."""
    return Outcome(value=None, not_checkable=str(params.need("missing")))
