"""Device prices per hour, availability caps and minimums: catalog defaults, user overrides.

The catalog carries an on-demand ``price_per_hour_usd`` per device where a public price
exists (its source and date are in the device file's ``sources``). ``--prices FILE``
overrides it, and may add an availability cap (``max_devices``) and a minimum
(``min_devices``) per device type. Two file formats:

TOML::

    [h100-sxm]
    price_per_hour_usd = 2.49
    max_devices = 64          # optional: availability cap
    min_devices = 8           # optional: already owned / committed

    mi300x = 1.70             # short form: just the price

CSV (header required; the last two columns optional)::

    device,price_per_hour_usd,max_devices,min_devices
    h100-sxm,2.49,64,8
    mi300x,1.70,,
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hardware.device import Device
from perfmodel.datafile import read_data_file
from perfmodel.errors import SpecError


@dataclass(frozen=True)
class DevicePrice:
    """What one device of a type costs per hour, and how many may (or must) be used."""

    device: str
    price_per_hour_usd: float | None
    max_devices: int | None = None
    min_devices: int = 0
    source: str = "catalog"

    def __post_init__(self) -> None:
        p = self.price_per_hour_usd
        if p is not None and not (math.isfinite(p) and p >= 0):
            raise SpecError(f"{self.device}: price_per_hour_usd must be >= 0, got {p!r}")
        if self.max_devices is not None and self.max_devices < 0:
            raise SpecError(f"{self.device}: max_devices must be >= 0, got {self.max_devices}")
        if self.min_devices < 0:
            raise SpecError(f"{self.device}: min_devices must be >= 0, got {self.min_devices}")
        if self.max_devices is not None and self.min_devices > self.max_devices:
            raise SpecError(
                f"{self.device}: min_devices {self.min_devices} exceeds max_devices "
                f"{self.max_devices}"
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "price_per_hour_usd": self.price_per_hour_usd,
            "max_devices": self.max_devices,
            "min_devices": self.min_devices,
            "source": self.source,
        }


@dataclass(frozen=True)
class PriceBook:
    """Prices, caps and minimums by device id."""

    entries: Mapping[str, DevicePrice] = field(default_factory=dict)

    def get(self, device_id: str) -> DevicePrice:
        hit = self.entries.get(device_id)
        return hit if hit is not None else DevicePrice(device_id, None, source="none")

    def price(self, device_id: str) -> float | None:
        return self.get(device_id).price_per_hour_usd

    @property
    def priced(self) -> bool:
        """True when every device in the book has a price."""
        return all(e.price_per_hour_usd is not None for e in self.entries.values())

    def override(self, other: PriceBook) -> PriceBook:
        """This book with ``other``'s fields replacing ours where ``other`` sets them."""
        out = dict(self.entries)
        for k, e in other.entries.items():
            mine = out.get(k)
            if mine is None:
                out[k] = e
                continue
            out[k] = replace(
                mine,
                price_per_hour_usd=(
                    e.price_per_hour_usd
                    if e.price_per_hour_usd is not None
                    else mine.price_per_hour_usd
                ),
                max_devices=e.max_devices if e.max_devices is not None else mine.max_devices,
                min_devices=e.min_devices or mine.min_devices,
                source=e.source if e.price_per_hour_usd is not None else mine.source,
            )
        return PriceBook(out)

    def with_caps(self, caps: Mapping[str, int]) -> PriceBook:
        """Availability caps (``--max-devices DEVICE=N``) applied on top."""
        return self.override(
            PriceBook({k: DevicePrice(k, None, v, 0, "--max-devices") for k, v in caps.items()})
        )

    def to_dict(self) -> dict[str, Any]:
        return {k: e.to_dict() for k, e in sorted(self.entries.items())}


def catalog_prices(devices: Iterable[Device]) -> PriceBook:
    """The devices' own catalog prices (None where the catalog has none)."""
    out = {}
    for d in devices:
        src = next((s for s in d.sources if s.startswith("price_per_hour_usd")), "catalog")
        out[d.id] = DevicePrice(d.id, d.price_per_hour_usd, source=src)
    return PriceBook(out)


def _int(v: Any, where: str, key: str) -> int | None:
    if v is None or v == "":
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise SpecError(f"{where}: {key} must be a whole number, got {v!r}") from None
    if isinstance(v, bool) or not f.is_integer():
        raise SpecError(f"{where}: {key} must be a whole number, got {v!r}")
    return int(f)


def _price(v: Any, where: str) -> float | None:
    if v is None or v == "":
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise SpecError(f"{where}: price_per_hour_usd must be a number, got {v!r}") from None
    if isinstance(v, bool):
        raise SpecError(f"{where}: price_per_hour_usd must be a number, got {v!r}")
    return f


def _entry(dev: str, row: Mapping[str, Any], where: str) -> DevicePrice:
    unknown = set(row) - {"price_per_hour_usd", "max_devices", "min_devices", "device"}
    if unknown:
        raise SpecError(
            f"{where}: unknown field(s) {', '.join(sorted(unknown))}; valid: "
            "price_per_hour_usd, max_devices, min_devices"
        )
    return DevicePrice(
        dev,
        _price(row.get("price_per_hour_usd"), where),
        _int(row.get("max_devices"), where, "max_devices"),
        _int(row.get("min_devices"), where, "min_devices") or 0,
        source=f"{where}",
    )


def load_prices(path: str | Path) -> PriceBook:
    """Read a TOML or CSV price file (see the module docstring)."""
    p = Path(path)
    if p.suffix.lower() == ".csv":
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as e:
            raise SpecError(f"cannot read price file {p}: {e.strerror}") from None
        rows = list(csv.DictReader(text.splitlines()))
        if not rows or "device" not in rows[0] or "price_per_hour_usd" not in rows[0]:
            raise SpecError(f"{p}: a price CSV needs the header device,price_per_hour_usd")
        out = {}
        for i, r in enumerate(rows, start=2):
            dev = (r.get("device") or "").strip()
            if not dev:
                raise SpecError(f"{p} line {i}: empty device id")
            out[dev] = _entry(dev, {k: v for k, v in r.items() if k}, f"{p} line {i}")
        return PriceBook(out)
    data = read_data_file(p, what="price file")
    out = {}
    for dev, v in data.items():
        if isinstance(v, dict):
            out[dev] = _entry(dev, v, f"{p} [{dev}]")
        else:
            out[dev] = _entry(dev, {"price_per_hour_usd": v}, f"{p} {dev}")
    return PriceBook(out)
