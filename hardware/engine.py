"""Serving engines as data: what real software achieves on a device (issue 12).

An :class:`Engine` is read from ``hardware/engines/*.toml`` (one file per engine family
and version range, every default with its source) or from a user's TOML file. It holds

* host overhead per iteration: ``iteration_overhead_s + per_request_overhead_s · n``
  for ``n`` sequences in the batch (scheduler, sampling, detokenization, launch), the
  fixed part per device family (``[host.by_family]``: host CPU and vendor stack), and a
  fixed cost per collective call (``collective_overhead_s``: launch and synchronization
  of each tensor-parallel all-reduce beyond the link model of ``hardware.comm``);
* batch caps: ``max_num_seqs`` (vLLM) / ``max_batch_size`` (TensorRT-LLM) and
  ``max_num_batched_tokens`` / ``max_num_tokens``;
* the KV memory budget: ``kv_memory_fraction`` of the device's memory (``basis =
  "total"``, vLLM ``gpu_memory_utilization``) or of what is free after the weights and
  activations (``basis = "free"``, TensorRT-LLM ``free_gpu_memory_fraction``), the block
  size, and how much KV a request reserves at admission (``"full"``: prompt + all output
  tokens, TensorRT-LLM's guaranteed-no-evict scheduler; ``"incremental"``: blocks as the
  request grows, with preemption when the cache runs out, vLLM);
* chunked prefill on or off with its chunk, the preemption mode, and whether a prefix
  cache keeps a preempted request's blocks until they are reused (``prefix_caching``,
  vLLM V1's default: it recomputes only what was evicted, :mod:`perfmodel.serving.preemption`);
* ``offline_caps``: how an offline (all-queued) benchmark sizes those caps: ``"fixed"``
  (the engine's defaults) or ``"trtllm-bench"`` (``trtllm-bench build`` picks
  ``max_batch_size`` and ``max_num_tokens`` per ISL/OSL from a memory estimate:
  :func:`perfmodel.serving.offline.trtllm_bench_caps`);
* ``kv_dequant_efficiency`` ∈ (0, 1]: the factor on decode attention's KV read rate
  when the cache is in a format the device has no math for (FP8 KV on an A100: the
  kernel dequantizes in software);
* ``gqa_kv_sharing`` ∈ [0, 1]: how well a decode attention kernel shares one K/V read
  among the query heads of a group. With ``g`` query heads per KV head a decode step
  reads its KV ``1 + (g − 1)·(1 − s)`` times (``s = 1``: once per KV head, as
  FlashAttention/FlashInfer; ``s = 0``: once per query head, as older TensorRT-LLM
  masked multi-head attention kernels did);
* kernel efficiencies per (device family, math dtype): GEMM compute, memory streaming
  and attention compute, as fractions of the device's dense peak and HBM bandwidth;
  ``moe_efficiency`` ∈ (0, 1] scales both for the routed experts' grouped GEMM (token
  permutation into expert order and back, one GEMM per expert with few rows each, the
  tiles of unevenly loaded experts: a grouped GEMM reaches less than a dense one).
  The family of a device comes from ``hardware/engines/families.toml``.

Nothing here computes a time: ``perfmodel.step.time`` and ``perfmodel.memory`` read these numbers.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perfmodel.datafile import read_data_file, read_toml_header
from perfmodel.dtypes import DTYPE_NAMES, get_dtype
from perfmodel.errors import SpecError

if TYPE_CHECKING:
    from hardware.device import Device

ENGINE_DIR = Path(__file__).with_name("engines")
FAMILIES_FILE = ENGINE_DIR / "families.toml"
DEFAULT_ENGINE = "vllm"  # load_engine(None): a measurement row that names no engine
AUTO_ENGINE = "auto"  # the device's default engine (default_engine_id)
NO_ENGINE = "none"  # the engine-less roofline
KV_BASES = ("total", "free")
RESERVATIONS = ("full", "incremental")
PREEMPTIONS = ("recompute", "swap")
OFFLINE_CAPS = ("fixed", "trtllm-bench")


@dataclass(frozen=True)
class KernelEfficiency:
    """Fractions of peak one engine's kernels reach on one device family and dtype."""

    gemm_compute: float
    memory: float
    attention_compute: float

    def __post_init__(self) -> None:
        for name in ("gemm_compute", "memory", "attention_compute"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and 0 < v <= 1):
                raise SpecError(f"kernel efficiency {name} must be in (0, 1], got {v!r}")

    def to_dict(self) -> dict[str, float]:
        return {
            "gemm_compute": self.gemm_compute,
            "memory": self.memory,
            "attention_compute": self.attention_compute,
        }


@dataclass(frozen=True)
class Engine:
    """One serving engine (family + version range) and its defaults."""

    id: str
    name: str
    family: str
    versions: tuple[str, str]  # [from, to): version strings, "" = open
    iteration_overhead_s: float
    per_request_overhead_s: float
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_memory_fraction: float
    kv_memory_basis: str
    kv_block_tokens: int
    kv_reservation: str
    chunked_prefill: bool
    preemption: str
    gqa_kv_sharing: float
    efficiency: dict[tuple[str, str], KernelEfficiency]
    default_efficiency: KernelEfficiency
    iteration_overhead_by_family: dict[str, float] = field(default_factory=dict)
    collective_overhead_s: float = 0.0  # per collective call, beyond the link model
    kv_dequant_efficiency: float = 1.0  # KV read rate factor when dequantized in software
    prefix_caching: bool = False  # a preempted request's cached blocks survive until evicted
    offline_caps: str = "fixed"  # how an offline benchmark sizes the batch caps
    moe_efficiency: float = 1.0  # routed-expert grouped GEMM vs a dense GEMM
    calibrated: tuple[str, ...] = ()  # "family/dtype" pairs fitted on measurements
    provenance: dict[str, Any] = field(default_factory=dict, compare=False)
    sources: tuple[str, ...] = ()
    notes: str = ""
    path: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        where = f"engine {self.id!r}"
        for name in ("iteration_overhead_s", "per_request_overhead_s", "collective_overhead_s"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise SpecError(f"{where}: {name} must be >= 0, got {v!r}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "kv_block_tokens"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= 1):
                raise SpecError(f"{where}: {name} must be a positive integer, got {v!r}")
        if not 0 < self.kv_memory_fraction <= 1:
            raise SpecError(f"{where}: kv_memory_fraction must be in (0, 1]")
        if not 0 < self.kv_dequant_efficiency <= 1:
            raise SpecError(f"{where}: kv_dequant_efficiency must be in (0, 1]")
        if not 0 < self.moe_efficiency <= 1:
            raise SpecError(f"{where}: moe_efficiency must be in (0, 1]")
        if not 0 <= self.gqa_kv_sharing <= 1:
            raise SpecError(f"{where}: gqa_kv_sharing must be in [0, 1]")
        for name, allowed in (
            ("kv_memory_basis", KV_BASES),
            ("kv_reservation", RESERVATIONS),
            ("preemption", PREEMPTIONS),
            ("offline_caps", OFFLINE_CAPS),
        ):
            if getattr(self, name) not in allowed:
                raise SpecError(f"{where}: {name} must be one of {allowed}")

    def kernel_efficiency(self, device_id: str, dtype: str) -> KernelEfficiency:
        """Efficiencies on ``device_id`` for math in ``dtype`` (the default if not listed)."""
        fam = device_family(device_id)
        key = get_dtype(dtype).kernel_key
        return self.efficiency.get((fam, key), self.default_efficiency)

    def is_calibrated(self, device_id: str, dtype: str) -> bool:
        return f"{device_family(device_id)}/{get_dtype(dtype).kernel_key}" in self.calibrated

    def accuracy_note(self, device_id: str, dtype: str) -> str:
        """What error to expect on ``device_id`` in ``dtype``, from the stored validation.

        Calibrated pairs quote the leave-one-model-out error, others the
        leave-one-device-out error (a device the fit did not see); an engine without a
        calibration says so.
        """
        fam = device_family(device_id)
        cal = self.is_calibrated(device_id, dtype)
        stat = self.provenance.get("leave_one_model_out" if cal else "leave_one_device_out")
        if not stat or not stat.get("rows"):
            return f"{self.id} is not calibrated: expect the engine-less error band or worse"
        where = "calibrated" if cal else f"uncalibrated on {fam}/{get_dtype(dtype).name}"
        kind = "leave-one-model-out" if cal else "leave-one-device-out"
        return (
            f"{self.id} {where}: expect ±{stat['median_abs_error_pct']:.0f} % median, "
            f"±{stat['p90_abs_error_pct']:.0f} % p90 ({kind} on published measurements)"
        )

    def decode_kv_reads(self, query_heads: float, kv_heads: float) -> float:
        """Times a decode step reads each cached K/V element: ``1 + (g − 1)(1 − s)``."""
        g = max(query_heads / max(kv_heads, 1.0), 1.0)
        return 1.0 + (g - 1.0) * (1.0 - self.gqa_kv_sharing)

    def host_overhead_s(self, device_id: str, sequences: Any) -> Any:
        """Host time of one iteration with ``sequences`` in the batch on ``device_id``.

        The fixed part may depend on the device family (its host CPU and software stack:
        ``[host.by_family]``); the per-request part does not.
        """
        fixed = self.iteration_overhead_by_family.get(
            device_family(device_id), self.iteration_overhead_s
        )
        return fixed + self.per_request_overhead_s * sequences

    def with_params(self, **params: float) -> Engine:
        """A copy with scalar fields replaced (used by calibration)."""
        return replace(self, **params)  # type: ignore[arg-type]

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "family": self.family,
            "versions": list(self.versions),
            "iteration_overhead_s": self.iteration_overhead_s,
            "per_request_overhead_s": self.per_request_overhead_s,
            "iteration_overhead_by_family": self.iteration_overhead_by_family,
            "collective_overhead_s": self.collective_overhead_s,
            "kv_dequant_efficiency": self.kv_dequant_efficiency,
            "moe_efficiency": self.moe_efficiency,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "kv_memory_fraction": self.kv_memory_fraction,
            "kv_memory_basis": self.kv_memory_basis,
            "kv_block_tokens": self.kv_block_tokens,
            "kv_reservation": self.kv_reservation,
            "prefix_caching": self.prefix_caching,
            "chunked_prefill": self.chunked_prefill,
            "preemption": self.preemption,
            "offline_caps": self.offline_caps,
            "gqa_kv_sharing": self.gqa_kv_sharing,
            "efficiency": {f"{f}/{d}": e.to_dict() for (f, d), e in self.efficiency.items()},
            "default_efficiency": self.default_efficiency.to_dict(),
            "calibrated": list(self.calibrated),
            "provenance": self.provenance,
            "sources": list(self.sources),
        }


@functools.cache
def _families_file() -> dict[str, Any]:
    return read_data_file(FAMILIES_FILE, what="device families")


def device_family(device_id: str) -> str:
    """Architecture family of a catalog device (``families.toml``); ``other`` if absent."""
    fams = _families_file()["families"]
    return next((fam for fam, ids in fams.items() if device_id in ids), "other")


def default_engine_id(device: Device) -> str:
    """The engine ``--engine auto`` models on ``device`` (``families.toml``
    ``[default_engine]``): the one calibrated on its family, else its vendor's, else
    :data:`NO_ENGINE` (the engine-less roofline)."""
    table = _families_file().get("default_engine", {})
    by_family = table.get("family", {}).get(device_family(device.id))
    return str(by_family or table.get("vendor", {}).get(device.vendor) or NO_ENGINE)


def engine_for(spec: str | Path | Engine | None, device: Device) -> Engine | None:
    """The engine ``spec`` names for ``device``: ``None`` or ``"none"`` is no engine (the
    engine-less roofline), ``"auto"`` the device's default (:func:`default_engine_id`),
    else an id, ``id@version`` or TOML path (:func:`load_engine`)."""
    if spec is None or isinstance(spec, Engine):
        return spec
    name = str(spec).strip()
    if name.lower() == AUTO_ENGINE:
        name = default_engine_id(device)
    if name.lower() == NO_ENGINE:
        return None
    return _catalog_engine(name) if not _is_path(name) else load_engine(name)


def engine_label(spec: str | Path | Engine | None, devices: Sequence[Device]) -> str:
    """``spec`` as resolved on each device: ``"auto: trtllm on h100-sxm, vllm on mi300x"``."""
    names = {d.id: (e.id if (e := engine_for(spec, d)) else NO_ENGINE) for d in devices}
    if set(names.values()) == {NO_ENGINE}:
        return "none (the engine-less roofline)"
    per = ", ".join(f"{e} on {d}" for d, e in names.items())
    return f"{spec}: {per}" if str(spec).strip().lower() == AUTO_ENGINE else per


def _is_path(spec: str) -> bool:
    p = Path(spec)
    return p.suffix.lower() == ".toml" or p.is_file()


@functools.cache
def _catalog_engine(spec: str) -> Engine:
    return load_engine(spec)


def _eff(t: dict[str, Any], where: str) -> KernelEfficiency:
    try:
        return KernelEfficiency(
            float(t["gemm_compute"]), float(t["memory"]), float(t["attention_compute"])
        )
    except KeyError as e:
        raise SpecError(f"{where}: efficiency table lacks {e.args[0]!r}") from None
    except SpecError as e:
        raise SpecError(f"{where}: {e}") from None


def engine_from_dict(data: dict[str, Any], *, path: str = "") -> Engine:
    """Build an :class:`Engine` from a parsed TOML table (see ``hardware/engines/``)."""
    where = path or f"engine {data.get('id', '?')!r}"
    try:
        effs: dict[tuple[str, str], KernelEfficiency] = {}
        for key, t in data.get("efficiency", {}).items():
            fam, _, dt = key.partition("/")
            if dt not in DTYPE_NAMES:
                raise SpecError(f"{where}: efficiency key {key!r} is not 'family/dtype'")
            cls = (fam, get_dtype(dt).kernel_key)
            if cls in effs:
                raise SpecError(
                    f"{where}: efficiency {key!r} repeats {fam}/{cls[1]} (bf16 and fp16 share "
                    f"one kernel class: list it once, as {fam}/{cls[1]})"
                )
            effs[cls] = _eff(t, f"{where} [efficiency.{key!r}]")
        b = data["batching"]
        kv = data["kv_cache"]
        if not isinstance(kv.get("prefix_caching", False), bool):
            raise SpecError(f"{where}: kv_cache.prefix_caching must be true or false")
        host = data["host"]
        return Engine(
            id=str(data["id"]),
            name=str(data.get("name", data["id"])),
            family=str(data["family"]),
            versions=(
                str(data.get("versions", ["", ""])[0]),
                str(data.get("versions", ["", ""])[1]),
            ),
            iteration_overhead_s=float(host["iteration_overhead_s"]),
            per_request_overhead_s=float(host["per_request_overhead_s"]),
            iteration_overhead_by_family={
                k: float(v) for k, v in host.get("by_family", {}).items()
            },
            collective_overhead_s=float(host.get("collective_overhead_s", 0.0)),
            max_num_seqs=int(b["max_num_seqs"]),
            max_num_batched_tokens=int(b["max_num_batched_tokens"]),
            chunked_prefill=bool(b["chunked_prefill"]),
            preemption=str(b.get("preemption", "recompute")),
            offline_caps=str(b.get("offline_caps", "fixed")),
            kv_memory_fraction=float(kv["memory_fraction"]),
            kv_memory_basis=str(kv["basis"]),
            kv_block_tokens=int(kv["block_tokens"]),
            kv_reservation=str(kv["reservation"]),
            prefix_caching=bool(kv.get("prefix_caching", False)),
            gqa_kv_sharing=float(data["attention"]["gqa_kv_sharing"]),
            kv_dequant_efficiency=float(data["attention"].get("kv_dequant_efficiency", 1.0)),
            moe_efficiency=float(data.get("moe", {}).get("efficiency", 1.0)),
            efficiency=effs,
            default_efficiency=_eff(data["default_efficiency"], f"{where} [default_efficiency]"),
            calibrated=tuple(data.get("calibrated", ())),
            provenance=dict(data.get("provenance", {})),
            sources=tuple(data.get("sources", ())),
            notes=str(data.get("notes", "")),
            path=path,
        )
    except KeyError as e:
        raise SpecError(f"{where}: missing key {e.args[0]!r}") from None
    except (TypeError, ValueError) as e:
        raise SpecError(f"{where}: {e}") from None


def _vkey(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v))


def _in_range(version: str, lo: str, hi: str) -> bool:
    k = _vkey(version)
    return (not lo or k >= _vkey(lo)) and (not hi or k < _vkey(hi))


def engine_files() -> list[Path]:
    return sorted(p for p in ENGINE_DIR.glob("*.toml") if p.name != FAMILIES_FILE.name)


def engine_ids() -> list[str]:
    return sorted({read_toml_header(p, what="engine")["family"] for p in engine_files()})


def load_engine(spec: str | Path | None = None) -> Engine:
    """An engine by id (``vllm``), id and version (``trtllm@0.5``) or TOML path.

    ``None`` is the default engine (:data:`DEFAULT_ENGINE`). Without a version the file
    marked ``default = true`` of that family is used.
    """
    spec = DEFAULT_ENGINE if spec is None else spec
    if _is_path(str(spec)):
        return engine_from_dict(read_data_file(Path(spec), what="engine"), path=str(spec))
    fam, _, version = str(spec).strip().lower().partition("@")
    cands = [(f, read_toml_header(f, what="engine")) for f in engine_files()]
    cands = [(f, d) for f, d in cands if d.get("family") == fam]
    if not cands:
        raise SpecError(
            f"unknown engine {fam!r}; known: {', '.join(engine_ids())} (or a TOML path)"
        )
    if version:
        hit = [(f, d) for f, d in cands if _in_range(version, *d.get("versions", ["", ""]))]
        if not hit:
            ranges = ", ".join(f"[{d['versions'][0]}, {d['versions'][1]})" for _, d in cands)
            raise SpecError(f"no {fam} engine file covers version {version}; ranges: {ranges}")
    else:
        hit = [(f, d) for f, d in cands if d.get("default")] or cands
    f = hit[0][0]
    return engine_from_dict(read_data_file(f, what="engine"), path=str(f))
