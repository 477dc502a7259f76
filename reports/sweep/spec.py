"""A sweep specification: the grid of static-batch configurations a ``perfmodel sweep`` runs.

A TOML file with one table ``[grid]``; each key is one parameter of ``perfmodel
estimate``, given as a value (fixed) or a list (an axis of the grid)::

    chunk = 2000                      # configurations per chunk (the unit of work)
    [grid]
    model = ["llama-3.1-8b", "llama-3.1-70b"]
    hardware = "h100-sxm"
    tp = [1, 2, 4, 8]
    batch = [1, 2, 4, 8, 16, 32, 64, 128]
    input_len = [128, 512, 2048]
    output_len = [16, 128, 512]
    engine = ["none", "auto"]         # optional: as --engine (default: sweep --engine)

The grid is the Cartesian product, enumerated in the order of :data:`PARAMS` with the
last parameter varying fastest; configuration ``i`` is found from ``i`` alone (mixed
radix), so a chunk is a range of indices and nothing is materialized.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfmodel.errors import SpecError

# parameter: (type, default); order = enumeration order (the last varies fastest)
PARAMS: dict[str, tuple[type, Any]] = {
    "model": (str, None),
    "hardware": (str, None),
    "tp": (int, 1),
    "pp": (int, 1),
    "dtype": (str, "bf16"),
    "act_dtype": (str, "bf16"),
    "kv_dtype": (str, "bf16"),
    "engine": (str, "auto"),  # as --engine: auto (the device's default), none, an id or TOML
    "batch": (int, None),
    "input_len": (int, None),
    "output_len": (int, None),
}
DEFAULT_CHUNK = 2000
MAX_CONFIGS = 10**8


@dataclass(frozen=True)
class SweepSpec:
    """The axes of the grid (one tuple of values per parameter) and the chunk size."""

    axes: tuple[tuple[str, tuple[Any, ...]], ...]
    chunk: int = DEFAULT_CHUNK

    @property
    def size(self) -> int:
        return math.prod(len(v) for _, v in self.axes)

    @property
    def chunks(self) -> int:
        return -(-self.size // self.chunk)

    def chunk_range(self, c: int) -> range:
        """Configuration indices of chunk ``c``."""
        return range(c * self.chunk, min((c + 1) * self.chunk, self.size))

    def config(self, i: int) -> dict[str, Any]:
        """Configuration ``i`` (``0 ≤ i < size``) as parameter → value."""
        out: dict[str, Any] = {}
        for name, vals in reversed(self.axes):
            i, r = divmod(i, len(vals))
            out[name] = vals[r]
        return {name: out[name] for name, _ in self.axes}

    def to_dict(self) -> dict[str, Any]:
        return {
            "chunk": self.chunk,
            "size": self.size,
            "grid": {k: list(v) for k, v in self.axes},
        }


def _values(name: str, raw: Any) -> tuple[Any, ...]:
    kind, _ = PARAMS[name]
    vals = raw if isinstance(raw, list) else [raw]
    if not vals:
        raise SpecError(f"grid.{name} is an empty list; give at least one value")
    out = []
    for v in vals:
        if kind is int and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise SpecError(f"grid.{name} = {v!r}: must be a positive integer")
        if kind is str and not (isinstance(v, str) and v.strip()):
            raise SpecError(f"grid.{name} = {v!r}: must be a non-empty string")
        out.append(v)
    if len(set(out)) != len(out):
        raise SpecError(f"grid.{name} repeats a value: {out}")
    return tuple(out)


def spec_from_dict(
    data: dict[str, Any], *, source: str = "spec", engine: str | None = None
) -> SweepSpec:
    """Validate a parsed specification (see the module docstring); ``engine`` replaces
    the default of ``grid.engine`` (``sweep --engine``) where the grid does not set it."""
    unknown = sorted(set(data) - {"chunk", "grid"})
    if unknown:
        raise SpecError(f"{source}: unknown top-level key(s) {unknown}; expected chunk, [grid]")
    grid = data.get("grid")
    if not isinstance(grid, dict):
        raise SpecError(f"{source}: needs a [grid] table (see `perfmodel sweep --help`)")
    bad = sorted(set(grid) - set(PARAMS))
    if bad:
        raise SpecError(f"{source}: unknown grid parameter(s) {bad}; known: {', '.join(PARAMS)}")
    axes = []
    for name, (_, default) in PARAMS.items():
        if name == "engine" and engine is not None:
            default = engine
        if name in grid:
            axes.append((name, _values(name, grid[name])))
        elif default is None:
            raise SpecError(f"{source}: grid.{name} is required")
        else:
            axes.append((name, (default,)))
    chunk = data.get("chunk", DEFAULT_CHUNK)
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise SpecError(f"{source}: chunk = {chunk!r} must be a positive integer")
    spec = SweepSpec(tuple(axes), chunk)
    if spec.size > MAX_CONFIGS:
        raise SpecError(f"{source}: {spec.size:,} configurations; at most {MAX_CONFIGS:,}")
    return spec


def load_spec(path: Path, *, engine: str | None = None) -> SweepSpec:
    """Read and validate a sweep TOML file (``engine``: as :func:`spec_from_dict`)."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise SpecError(f"cannot read {path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise SpecError(f"{path}: malformed TOML: {e}") from None
    return spec_from_dict(data, source=str(path), engine=engine)
