"""Turn a claim's ``[setup]`` and check parameters into the project's objects.

Every check reads its side(s) through these helpers, so the keys mean the same in
every claim file: ``model``, ``device`` (catalog id or a file path, relative paths from
the claim file's folder), ``tp``, ``pp``, ``weight_dtype``, ``act_dtype``,
``kv_dtype``, ``workload`` (``chat``/``code``, or ``input_tokens`` + ``output_tokens``
for fixed lengths), ``max_batched_tokens``, ``ttft_slo_ms``, ``tpot_slo_ms``,
``slo_percentile``, ``slo_goal``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hardware.device import Device, load_device
from perfmodel.errors import SpecError
from perfmodel.model import ModelSpec, load_model
from perfmodel.plan import ParallelPlan
from perfmodel.step.instance import Instance
from perfmodel.units import from_ms
from perfmodel.workload.lengths import (
    LengthDistribution,
    TruncLogNormal,
    fixed_lengths,
    lognormal_lengths,
)
from perfmodel.workload.presets import Workload, preset
from perfmodel.workload.slo import SLO

LENGTH_KEYS = ("input_tokens", "output_tokens", "input_lognormal", "output_lognormal", "workload")
_CACHE: dict[tuple[Any, ...], Any] = {}


def _cached(key: tuple[Any, ...], make: Any) -> Any:
    """Specs are immutable, and length grids slow to build: build each once per process."""
    if key not in _CACHE:
        _CACHE[key] = make()
    return _CACHE[key]


class Side:
    """A claim's setup merged with one side's overrides (``params[side]``)."""

    def __init__(self, base_dir: Path, values: Mapping[str, Any], what: str = "setup") -> None:
        self.base_dir = base_dir
        self.values = dict(values)
        self.what = what

    def merged(self, over: Mapping[str, Any] | None, what: str) -> Side:
        return Side(self.base_dir, {**self.values, **(over or {})}, what)

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def need(self, key: str) -> Any:
        if key not in self.values:
            raise SpecError(f"{self.what}: this check needs {key!r}")
        return self.values[key]

    def num(self, key: str, default: float | None = None) -> float:
        v = self.values.get(key, default)
        if v is None:
            raise SpecError(f"{self.what}: this check needs the number {key!r}")
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise SpecError(f"{self.what}: {key!r} must be a number, got {v!r}")
        return float(v)

    def int(self, key: str, default: int | None = None) -> int:
        """A positive integer (a non-integer, e.g. from an assumption grid, is rounded)."""
        v = round(self.num(key, default))
        if v < 1:
            raise SpecError(f"{self.what}: {key!r} must be a positive integer, got {v:g}")
        return int(v)

    def _path_or_id(self, v: str) -> str:
        p = self.base_dir / v
        return str(p) if ("/" in v or v.endswith((".json", ".toml"))) and p.exists() else v

    def model(self) -> ModelSpec:
        m = self._path_or_id(str(self.need("model")))
        return _cached(("model", m), lambda: load_model(m))

    def device(self, key: str = "device") -> Device:
        d = self._path_or_id(str(self.need(key)))
        return _cached(("device", d), lambda: load_device(d))

    def instance(self) -> Instance:
        """The instance (model × device × plan) every check costs its iterations on."""
        return Instance(self.model(), self.device(), self.plan())

    def lengths_key(self) -> tuple[Any, ...]:
        return tuple(repr(self.values.get(k)) for k in LENGTH_KEYS)

    def plan(self) -> ParallelPlan:
        return ParallelPlan(
            self.int("tp", 1),
            str(self.get("weight_dtype", "bf16")),
            str(self.get("act_dtype", "bf16")),
            str(self.get("kv_dtype", "bf16")),
            pp=self.int("pp", 1),
        )

    def _lognormal(self, key: str) -> TruncLogNormal:
        v = self.need(key)
        if not (isinstance(v, list) and len(v) == 4):
            raise SpecError(f"{self.what}: {key!r} is [mu, sigma, lo, hi] of a log-normal")
        return TruncLogNormal(float(v[0]), float(v[1]), int(v[2]), int(v[3]))

    def lengths(self) -> LengthDistribution:
        return _cached(("lengths", *self.lengths_key()), self._lengths)

    def _lengths(self) -> LengthDistribution:
        if "input_tokens" in self.values or "output_tokens" in self.values:
            return fixed_lengths(self.int("input_tokens"), self.int("output_tokens"))
        if "input_lognormal" in self.values:
            return lognormal_lengths(
                self._lognormal("input_lognormal"), self._lognormal("output_lognormal")
            )
        return self.workload().lengths

    def workload(self) -> Workload:
        cv = self.num("arrival_cv", 1.0)
        if "input_tokens" in self.values or "input_lognormal" in self.values:
            return Workload("custom", self.lengths(), cv)
        name = str(self.get("workload", "chat"))
        return _cached(("preset", name, cv), lambda: preset(name, arrival_cv=cv))

    def with_values(self, over: Mapping[str, Any]) -> Side:
        """A copy with ``over`` set; a key ``"a.x"`` sets ``x`` in the sub-table ``a``."""
        vals = {k: (dict(v) if isinstance(v, dict) else v) for k, v in self.values.items()}
        for k, v in over.items():
            if "." in k:
                head, tail = k.split(".", 1)
                vals.setdefault(head, {})[tail] = v
            else:
                vals[k] = v
        return Side(self.base_dir, vals, self.what)

    def side(self, name: str) -> Side:
        """Sub-table ``name`` (e.g. ``a``/``b``) layered over these values."""
        sub = self.values.get(name)
        if not isinstance(sub, dict):
            raise SpecError(f"{self.what}: this check needs a table [{name}] for one side")
        base = {k: v for k, v in self.values.items() if not isinstance(v, dict)}
        return Side(self.base_dir, {**base, **sub}, f"{self.what} [{name}]")

    def slo(self) -> SLO:
        return SLO(
            ttft_s=from_ms(self.num("ttft_slo_ms")),
            tpot_s=from_ms(self.num("tpot_slo_ms")),
            percentile=self.num("slo_percentile", 0.90),
            goal=self.num("slo_goal", 0.90),
        )

    def describe(self) -> dict[str, Any]:
        return {k: v for k, v in self.values.items() if not isinstance(v, dict)}
