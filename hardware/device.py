"""Device specs: one TOML file per device, loaded into a frozen ``Device`` in SI units.

File format (all numbers SI: bytes, B/s, FLOP/s, s, W; a comment gives the human reading)::

    id = "h100-sxm"
    name = "NVIDIA H100 SXM5 80GB"
    vendor = "nvidia"           # nvidia | amd | huawei | google | amd-xilinx | ...
    kind = "gpu"                # gpu | npu | tpu | fpga
    role = "train+inference"
    launch_year = 2022
    tdp_w = 700.0
    idle_w = 80.0               # optional: measured idle draw, W
    price_per_hour_usd = 3.99   # optional: on-demand $/h of one device (source in sources)
    sources = ["...", ...]
    notes = "..."
    pads_gemm_rows = true       # optional: GEMM row tiles; default false for kind "fpga"

    [compute]                   # dense peak (no 2:4 sparsity), FLOP/s or OP/s
    bf16 = 989.4e12             # keys: fp32 tf32 bf16 fp16 fp8 int8 int4 (only those that exist)

    [memory]
    capacity_bytes = 85899345920    # 80 GiB
    bandwidth_bytes_per_s = 3.35e12
    type = "HBM3"
    sram_bytes = 50e6               # L2 / on-chip buffer

    [scale_up]                  # per direction; topology switched | mesh | none
    name = "NVLink 4"
    topology = "switched"
    peers = 7                   # other devices reachable in the scale-up domain
    bw_per_direction_bytes_per_s = 450e9       # device aggregate, one direction
    peer_bw_per_direction_bytes_per_s = 450e9  # what one peer pair gets, one direction
    latency_s = 3e-6
    in_switch_reduction = true  # optional: NVLink SHARP (NVSwitch 3+); default false

    [host_link]
    name = "PCIe Gen5 x16"
    bw_per_direction_bytes_per_s = 64e9
    latency_s = 1e-5

    [scale_out]                 # optional: per-device NIC
    name = "InfiniBand NDR 400G"
    bw_per_direction_bytes_per_s = 50e9
    latency_s = 5e-6

    [package]                   # optional: multi-die packages seen as several devices
    dies = 2
    die_link_bw_per_direction_bytes_per_s = 200e9
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfmodel import datafile
from perfmodel.datafile import read_data_file
from perfmodel.dtypes import DTYPE_NAMES, get_dtype
from perfmodel.errors import SpecError

TOPOLOGIES = ("switched", "mesh", "none")
#: Most peers one scale-up domain may list (NVL72 racks have 71; pods of 1e5 are not a link).
MAX_PEERS = 100_000
KINDS = ("gpu", "npu", "tpu", "fpga")


@dataclass(frozen=True)
class Link:
    """A point-to-point or switched link, bandwidths per direction in B/s."""

    name: str
    bw_per_direction_bytes_per_s: float
    latency_s: float
    topology: str = "switched"
    peers: int = 0
    peer_bw_per_direction_bytes_per_s: float = 0.0
    #: the collective library's fixed (per-call) latencies on this system relative to the
    #: reference NVLink system (hardware.comm); 1 unless measured otherwise
    collective_base_latency_scale: float = 1.0
    #: the switch reduces in place (NVLink SHARP, NVSwitch 3+): all-reduce may use NVLS
    in_switch_reduction: bool = False

    def __post_init__(self) -> None:
        if not (
            math.isfinite(self.collective_base_latency_scale)
            and self.collective_base_latency_scale > 0
        ):
            raise SpecError(
                f"link {self.name!r}: collective_base_latency_scale must be > 0, got "
                f"{self.collective_base_latency_scale}"
            )
        if self.topology not in TOPOLOGIES:
            raise SpecError(
                f"link {self.name!r}: topology {self.topology!r} is not one of {TOPOLOGIES}"
            )
        if self.bw_per_direction_bytes_per_s < 0 or self.latency_s < 0:
            raise SpecError(f"link {self.name!r}: bandwidth and latency must be >= 0")
        if not (isinstance(self.peers, int) and 0 <= self.peers <= MAX_PEERS):
            raise SpecError(
                f"link {self.name!r}: peers must be a whole number in [0, {MAX_PEERS}], "
                f"got {self.peers!r}"
            )
        if self.peer_bw_per_direction_bytes_per_s == 0.0:
            object.__setattr__(
                self, "peer_bw_per_direction_bytes_per_s", self.bw_per_direction_bytes_per_s
            )


@dataclass(frozen=True)
class Device:
    """One accelerator as software sees it, in SI units."""

    id: str
    name: str
    vendor: str
    kind: str
    peak_flops_per_s: dict[str, float]
    hbm_bytes: float
    hbm_bw_bytes_per_s: float
    memory_type: str
    sram_bytes: float
    scale_up: Link
    host_link: Link
    scale_out: Link | None = None
    tdp_w: float | None = None
    idle_w: float | None = None  # measured idle draw (W), when published
    launch_year: int | None = None
    role: str = ""
    dies_per_package: int = 1
    die_link_bw_per_direction_bytes_per_s: float | None = None
    price_per_hour_usd: float | None = None
    sources: tuple[str, ...] = ()
    notes: str = ""
    #: GEMMs run in fixed row tiles (16-128 rows on GPUs/NPUs: small batches pay for the
    #: padding); FPGA dataflow engines stream rows and do not (``pads_gemm_rows = false``)
    pads_gemm_rows: bool = True
    path: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        where = f"device {self.id!r}"
        if self.kind not in KINDS:
            raise SpecError(f"{where}: kind {self.kind!r} is not one of {KINDS}")
        if not self.peak_flops_per_s:
            raise SpecError(f"{where}: [compute] needs at least one dtype peak")
        for k, v in self.peak_flops_per_s.items():
            if k not in DTYPE_NAMES:
                raise SpecError(f"{where}: [compute] key {k!r} is not a dtype ({DTYPE_NAMES})")
            if not (isinstance(v, int | float) and v > 0 and math.isfinite(v)):
                raise SpecError(f"{where}: [compute] {k} must be a positive number, got {v!r}")
        for name in ("hbm_bytes", "hbm_bw_bytes_per_s"):
            v = getattr(self, name)
            if not (v > 0 and math.isfinite(v)):
                raise SpecError(f"{where}: {name} must be positive, got {v!r}")
        for name in ("tdp_w", "idle_w", "price_per_hour_usd"):
            v = getattr(self, name)
            if v is not None and not (math.isfinite(v) and v >= 0):
                raise SpecError(f"{where}: {name} must be a number >= 0, got {v!r}")
        if self.idle_w is not None and self.tdp_w is not None and self.idle_w > self.tdp_w:
            raise SpecError(f"{where}: idle_w {self.idle_w} exceeds tdp_w {self.tdp_w}")
        if self.dies_per_package < 1:
            raise SpecError(f"{where}: package.dies must be >= 1")

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s for math in ``dtype``; a clear error if the device lacks it."""
        key = get_dtype(dtype).compute_key
        try:
            return self.peak_flops_per_s[key]
        except KeyError:
            have = ", ".join(sorted(self.peak_flops_per_s))
            raise SpecError(
                f"device {self.id!r} has no {key} math (it has: {have}); choose another dtype"
            ) from None

    def computes(self, dtype: str) -> bool:
        """Whether the device has native math (a listed peak) in ``dtype``."""
        return get_dtype(dtype).compute_key in self.peak_flops_per_s

    @property
    def native_dtypes(self) -> tuple[str, ...]:
        """Formats the device computes in natively (its ``[compute]`` keys)."""
        return tuple(sorted(self.peak_flops_per_s))

    def ridge_flop_per_byte(self, dtype: str) -> float:
        """Roofline ridge point: peak FLOP/s / HBM B/s."""
        return self.peak(dtype) / self.hbm_bw_bytes_per_s

    def to_dict(self) -> dict[str, object]:
        """The JSON of ``perfmodel hardware show`` (links as their fields)."""

        def link(lk: Link | None) -> object:
            return None if lk is None else dict(vars(lk))

        return {
            "id": self.id,
            "name": self.name,
            "vendor": self.vendor,
            "kind": self.kind,
            "peak_flops_per_s": self.peak_flops_per_s,
            "ridge_flop_per_byte": {k: self.ridge_flop_per_byte(k) for k in self.peak_flops_per_s},
            "hbm_bytes": self.hbm_bytes,
            "hbm_bw_bytes_per_s": self.hbm_bw_bytes_per_s,
            "memory_type": self.memory_type,
            "sram_bytes": self.sram_bytes,
            "scale_up": link(self.scale_up),
            "host_link": link(self.host_link),
            "scale_out": link(self.scale_out),
            "tdp_w": self.tdp_w,
            "dies_per_package": self.dies_per_package,
            "die_link_bw_per_direction_bytes_per_s": self.die_link_bw_per_direction_bytes_per_s,
            "sources": list(self.sources),
            "notes": self.notes,
        }


def _req(table: dict[str, Any], key: str, where: str) -> Any:
    if key not in table:
        raise SpecError(f"{where}: missing field {key!r}")
    return table[key]


def _num(table: dict[str, Any], key: str, where: str, default: float | None = None) -> float:
    if key not in table:
        if default is None:
            raise SpecError(f"{where}: missing field {key!r}")
        return default
    v = table[key]
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise SpecError(f"{where}: field {key!r} must be a number, got {v!r}")
    return float(v)


def _count(table: dict[str, Any], key: str, where: str, default: int) -> int:
    """A whole, non-negative number (``peers``, ``dies``, ``launch_year``)."""
    v = _num(table, key, where, float(default))
    if not (v.is_integer() and 0 <= v <= MAX_PEERS * 10):
        raise SpecError(f"{where}: field {key!r} must be a whole number >= 0, got {table[key]!r}")
    return int(v)


def _bool(table: dict[str, Any], key: str, where: str, default: bool) -> bool:
    v = table.get(key, default)
    if not isinstance(v, bool):
        raise SpecError(f"{where}: field {key!r} must be true or false, got {v!r}")
    return v


def _link(table: dict[str, Any] | None, where: str, *, default_topology: str) -> Link | None:
    if table is None:
        return None
    if not isinstance(table, dict):
        raise SpecError(f"{where}: must be a table")
    return Link(
        name=str(table.get("name", "")),
        bw_per_direction_bytes_per_s=_num(table, "bw_per_direction_bytes_per_s", where, 0.0),
        latency_s=_num(table, "latency_s", where, 0.0),
        topology=str(table.get("topology", default_topology)),
        peers=_count(table, "peers", where, 0),
        peer_bw_per_direction_bytes_per_s=_num(
            table, "peer_bw_per_direction_bytes_per_s", where, 0.0
        ),
        collective_base_latency_scale=_num(table, "collective_base_latency_scale", where, 1.0),
        in_switch_reduction=_bool(table, "in_switch_reduction", where, False),
    )


def device_from_dict(data: dict[str, Any], *, path: str = "") -> Device:
    """Build a Device from a parsed TOML table; errors name the file and the field."""
    where = path or f"device {data.get('id', '?')!r}"
    compute = _req(data, "compute", where)
    memory = _req(data, "memory", where)
    if not isinstance(compute, dict) or not isinstance(memory, dict):
        raise SpecError(f"{where}: [compute] and [memory] must be tables")
    package = data.get("package", {})
    if not isinstance(package, dict):
        raise SpecError(f"{where}: [package] must be a table")
    scale_up = _link(data.get("scale_up"), f"{where} [scale_up]", default_topology="none")
    host = _link(data.get("host_link"), f"{where} [host_link]", default_topology="switched")
    dev_id = _req(data, "id", where)
    if not isinstance(dev_id, str) or not dev_id.strip():
        raise SpecError(f"{where}: field 'id' must be a non-empty string, got {dev_id!r}")
    return Device(
        id=dev_id,
        name=str(data.get("name", data["id"])),
        vendor=str(data.get("vendor", "")),
        kind=str(data.get("kind", "gpu")),
        role=str(data.get("role", "")),
        peak_flops_per_s={str(k): v for k, v in compute.items()},
        hbm_bytes=_num(memory, "capacity_bytes", f"{where} [memory]"),
        hbm_bw_bytes_per_s=_num(memory, "bandwidth_bytes_per_s", f"{where} [memory]"),
        memory_type=str(memory.get("type", "")),
        sram_bytes=_num(memory, "sram_bytes", f"{where} [memory]", 0.0),
        scale_up=scale_up or Link("none", 0.0, 0.0, topology="none"),
        host_link=host or Link("none", 0.0, 0.0),
        scale_out=_link(data.get("scale_out"), f"{where} [scale_out]", default_topology="switched"),
        tdp_w=_num(data, "tdp_w", where, float("nan")) if "tdp_w" in data else None,
        idle_w=_num(data, "idle_w", where) if "idle_w" in data else None,
        launch_year=_count(data, "launch_year", where, 0) if "launch_year" in data else None,
        dies_per_package=_count(package, "dies", f"{where} [package]", 1),
        die_link_bw_per_direction_bytes_per_s=(
            _num(package, "die_link_bw_per_direction_bytes_per_s", f"{where} [package]")
            if "die_link_bw_per_direction_bytes_per_s" in package
            else None
        ),
        price_per_hour_usd=(
            _num(data, "price_per_hour_usd", where) if "price_per_hour_usd" in data else None
        ),
        sources=tuple(str(s) for s in data.get("sources", ())),
        notes=str(data.get("notes", "")),
        pads_gemm_rows=_bool(data, "pads_gemm_rows", where, data.get("kind", "gpu") != "fpga"),
        path=path,
    )


def load_device_file(path: str | Path) -> Device:
    """Load a device TOML file; malformed files raise SpecError naming the file."""
    p = Path(path)
    data = read_data_file(p, what="device file")
    return device_from_dict(data, path=str(p))


def catalog_ids() -> list[str]:
    """Ids of the built-in devices, sorted."""
    return datafile.catalog_ids("hardware.catalog")


def load_device(id_or_path: str | Path) -> Device:
    """A built-in device by id, or a user's TOML file by path."""
    s = str(id_or_path)
    if s.endswith(".toml") or "/" in s or Path(s).is_file():
        return load_device_file(s)
    return datafile.load_catalog_entry(
        "hardware.catalog", s, load_device_file, kind="hardware", other="a .toml path"
    )
