"""The project's exceptions. Messages say what is wrong and what to change."""

from __future__ import annotations


class PerfModelError(Exception):
    """Base class of every error perfmodel raises on purpose."""


class SpecError(PerfModelError, ValueError):
    """A device, model, workload or plan specification is invalid."""


class InfeasibleError(PerfModelError):
    """A request cannot be satisfied (does not fit, no configuration meets the SLO)."""


class SolverError(PerfModelError):
    """An optimization solver failed in a way that is not a modeling result."""
