"""Convert the published engine benchmarks to the long validation format.

The long format (one measurement per row; see :mod:`perfmodel.validate.data`)::

    device,model,engine,precision,kv_precision,tp,pp,isl,osl,batch_size,metric,value,
    request_rate_per_s,concurrency,source

Three source tables are understood, each by its own column set:

* TensorRT-LLM "perf overview" (offline max throughput per doc version, and the v0.14
  online QPS sweep). Units differ by doc version: the ``unit`` column says *total* or
  *per GPU*, and both map to their own metric. ``request_rate = INF`` rows are offline
  runs (all requests queued). FP8 rows have an FP8 KV cache in every version: the docs
  state it from v0.17 on, and ``trtllm-bench build --quantization FP8``, which made the
  tables, forces ``kv_cache_quant_algo = FP8`` (``tensorrt_llm/bench/build/build.py``);
  the v0.13 FP8 rows agree (Llama-3.1-8B 20000/2000 on one H100, a KV-bound row:
  1,278 tok/s in v0.13, 1,351 in v0.17; a 16-bit cache would halve the batch).
* TensorRT-LLM ``performance.md`` v0.5/v0.6.1 static batching. v0.5 "out tok/s" is read as
  the total of the TP group (the only physically possible reading for TP > 1 rows); v0.6.1
  headers say per GPU.
* Argonne LLM-Inference-Bench: ``Throughput`` is total (input + output) tokens/s with
  ISL = OSL; one "MI250 GPU" is a package of two GCDs (``mi250`` is one GCD, so TP doubles);
  TTFT rows of figures 21/22 are batch 16, ISL 1024. Repeated configurations are
  de-duplicated.

Names that map to a catalog id of the same architecture (``Llama 3.3 70B`` and Llama-3-70B
→ ``llama-3.1-70b``; Llama-3-8B → ``llama-3.1-8b``; the v0.5 "LLaMA 7B/70B" →
``llama-2-7b``/``llama-2-70b``) say so in :data:`MODEL_IDS`; names without a catalog entry
keep their published name, and validation lists those rows as unrepresentable.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from perfmodel.errors import SpecError
from perfmodel.units import MS_PER_S
from perfmodel.validate.data import REQUIRED

COLUMNS = (*REQUIRED, "request_rate_per_s", "concurrency", "source")

PERF_OVERVIEW = "trtllm_perf_overview_a100_h100.csv"
STATIC_BATCH = "trtllm_static_batch_a100_h100.csv"
ARGONNE = "argonne_llama_a100_h100_mi250.csv"

# published model name (lower case) -> catalog id; same architecture where renamed
MODEL_IDS = {
    "llama 4 scout": "llama-4-scout",
    "llama 3.3 70b": "llama-3.1-70b",  # Llama 3.3 70B is the Llama 3.1 70B architecture
    "llama v3.3 70b": "llama-3.1-70b",
    "qwen3-235b-a22b": "qwen3-235b-a22b",
    "qwen3 235b a22b": "qwen3-235b-a22b",
    "llama 3.1 405b": "llama-3.1-405b",
    "llama 3.1 8b": "llama-3.1-8b",
    "llama v3.1 8b": "llama-3.1-8b",
    "llama v3.1 70b": "llama-3.1-70b",
    "llama 3.1 70b": "llama-3.1-70b",
    "llama v3 8b": "llama-3.1-8b",  # Llama 3 8B: same shapes as 3.1 (RoPE scaling differs)
    "llama v3 70b": "llama-3.1-70b",
    "llama v2 7b": "llama-2-7b",
    "llama v2 70b": "llama-2-70b",
    "mixtral 8x7b": "mixtral-8x7b",
    "mixtral 8x22b": "mixtral-8x22b",
    "gptj 6b": "gpt-j-6b",
    "gpt-j 6b": "gpt-j-6b",
    "mistral 7b": "mistral-7b",
    "falcon 180b": "falcon-180b",
    "llama 7b": "llama-2-7b",  # v0.5 "LLaMA 7B": LLaMA-1/2 7B have the same shapes
    "llama 70b": "llama-2-70b",  # v0.5 "LLaMA 70B": only Llama 2 has a 70B (GQA)
    "meta-llama/llama-2-7b-hf": "llama-2-7b",
    "meta-llama/llama-2-70b-hf": "llama-2-70b",
    "meta-llama/meta-llama-3-8b": "llama-3.1-8b",
    "meta-llama/meta-llama-3-70b": "llama-3.1-70b",
}

_PRECISION = {"fp8": "fp8", "fp16": "fp16", "bf16": "bf16", "int8": "int8", "fp32": "fp32"}


@dataclass(frozen=True)
class Converted:
    """Rows in the long format and what was left out (with the reason)."""

    rows: tuple[dict[str, str], ...]
    skipped: tuple[tuple[str, str], ...]  # (source, reason)
    duplicates: int
    conflicting_duplicates: int


def model_id(name: str) -> str:
    """The catalog id for a published model name, else the name itself."""
    return MODEL_IDS.get(name.strip().lower(), name.strip())


def device_id(hardware: str) -> tuple[str, int]:
    """(catalog id, devices per published unit) for a published hardware name."""
    h = hardware.lower()
    if "h100" in h:
        return "h100-sxm", 1
    if "a100" in h:
        return "a100-sxm-80gb", 1
    if "mi250" in h:
        return "mi250", 2  # one MI250 package = two GCDs, each one device
    raise SpecError(f"no catalog device for published hardware {hardware!r}")


def _num(v: str) -> str:
    v = v.strip().replace(",", "")
    if not v:
        return ""
    f = float(v)
    return str(int(f)) if f == int(f) else repr(f)


def _version(v: str) -> str:
    m = re.search(r"(\d+\.\d+)", v)
    return m.group(1) if m else ""


def _row(**kw: str) -> dict[str, str]:
    return {c: str(kw.get(c, "")) for c in COLUMNS}


def _perf_overview(path: Path) -> Iterator[dict[str, str] | tuple[str, str]]:
    for i, r in enumerate(csv.DictReader(path.open(encoding="utf-8"))):
        src = f"{path.name}#{i}"
        if r["ep"] or r["dp"]:
            yield src, "attention-DP / expert-parallel layout (DEPn) is not a TP plan"
            continue
        ver = _version(r["framework_version"])
        prec = _PRECISION[r["precision"].lower()]
        # FP8 KV cache stated from v0.17 on; earlier FP8 rows too: `trtllm-bench build
        # --quantization FP8` forces the KV cache to FP8 (tensorrt_llm/bench/build/build.py)
        kv = prec
        rate = r["request_rate"].strip()
        offline = rate in ("", "INF")
        metric = {
            "output_throughput_total": "output_tps_total",
            "output_throughput_per_gpu": "output_tps_per_gpu",
            "request_throughput": "max_rate_per_s" if offline else "request_tps",
            "mean_ttft": "ttft_ms",
            "mean_itl": "tpot_ms",
            "total_token_throughput": "total_tps_total",
        }[r["metric"]]
        if metric in ("request_tps", "max_rate_per_s", "total_tps_total"):
            # below saturation a throughput equals the offered rate; at INF it repeats
            # the output throughput of the same run
            yield src, "request/total throughput repeats the offered rate or the output row"
            continue
        if offline and metric in ("ttft_ms", "tpot_ms"):
            yield src, "mean latency of a finite all-queued run has no steady state"
            continue
        yield _row(
            device=device_id(r["hardware"])[0],
            model=model_id(r["model"]),
            engine=f"trtllm@{ver}" if ver else "trtllm",
            precision=prec,
            kv_precision=kv,
            tp=r["tp"],
            pp=r["pp"],
            isl=r["isl"],
            osl=r["osl"],
            batch_size="",
            metric=metric,
            value=_num(r["value"]),
            request_rate_per_s="" if offline else _num(rate),
            source=src,
        )


def _static_batch(path: Path) -> Iterator[dict[str, str] | tuple[str, str]]:
    for i, r in enumerate(csv.DictReader(path.open(encoding="utf-8"))):
        src = f"{path.name}#{i}"
        ver = _version(r["framework_version"])
        prec = _PRECISION[r["precision"].lower()]
        if r["metric"] == "first_token_latency":
            metric, osl = "ttft_ms", "1"
        elif "per gpu" in r["unit"].lower():
            metric, osl = "output_tps_per_gpu", r["osl"]
        else:  # v0.5: read as the group total (see the module docstring)
            metric, osl = "output_tps_total", r["osl"]
        yield _row(
            device=device_id(r["hardware"])[0],
            model=model_id(r["model"]),
            engine=f"trtllm@{ver}",
            precision=prec,
            kv_precision=prec if prec != "fp8" else "fp8",
            tp=r["tp"],
            pp=r["pp"],
            isl=r["isl"],
            osl=osl,
            batch_size=r["batch_size"],
            metric=metric,
            value=_num(r["value"]),
            source=src,
        )


def _argonne_plan(r: dict[str, str], per_unit: int) -> tuple[int, int]:
    n = int(r["Num of Hardware"]) * per_unit
    kind = r["Parallelism Type"].lower()
    if "hyb" in kind:
        return n // 2, 2
    if kind in ("pp", "pipeline parallelism"):
        return 1, n
    return n, 1


def _argonne(path: Path) -> Iterator[dict[str, str] | tuple[str, str]]:
    for i, r in enumerate(csv.DictReader(path.open(encoding="utf-8"))):
        src = f"{path.name}#{i}"
        dev, per_unit = device_id(r["Hardware"])
        tp, pp = _argonne_plan(r, per_unit)
        engine = "vllm" if r["Framework"].lower() == "vllm" else "trtllm"
        weight, kv = "fp16", "fp16"
        if r["kv_cache_dtype"]:
            m = re.match(r"Weight = (\w+), KV Cache = (\w+)", r["kv_cache_dtype"])
            if not m:
                yield src, f"unparsed precision {r['kv_cache_dtype']!r}"
                continue
            weight, kv = m.group(1), m.group(2)
        common = dict(
            device=dev,
            model=model_id(r["Model"]),
            engine=engine,
            precision=weight,
            kv_precision=kv,
            tp=str(tp),
            pp=str(pp),
            batch_size=r["Batch Size"],
            source=src,
        )
        if r["TTFT Latency"] or (r["Input Length"] and r["Output Length"] == "1"):
            ttft_s = float(r["TTFT Latency"] or r["Latency"])
            yield _row(
                isl=r["Input Length"],
                osl="1",
                metric="ttft_ms",
                value=_num(str(ttft_s * MS_PER_S)),
                **common,
            )
            continue
        tput = r["Throughput"] or r["throughput"]
        length = r["Input Output Length"]
        if not (tput and length):
            yield src, "no throughput or length"
            continue
        yield _row(isl=length, osl=length, metric="total_tps_total", value=_num(tput), **common)


def convert_published(folder: str | Path) -> Converted:
    """Every row of the three published tables in ``folder``, in the long format.

    Repeated measurements of one configuration and metric become one row whose value is
    their median (``source`` lists every origin); repeats that differ by more than 5 %
    from their median are counted in ``conflicting_duplicates``.
    """
    folder = Path(folder)
    readers = ((PERF_OVERVIEW, _perf_overview), (STATIC_BATCH, _static_batch), (ARGONNE, _argonne))
    groups: dict[tuple[str, ...], list[dict[str, str]]] = {}
    skipped: list[tuple[str, str]] = []
    for name, reader in readers:
        path = folder / name
        if not path.is_file():
            raise SpecError(f"{path}: not found (expected the published tables in {folder})")
        for item in reader(path):
            if isinstance(item, tuple):
                skipped.append(item)
                continue
            key = tuple(item[c] for c in COLUMNS if c not in ("value", "source"))
            groups.setdefault(key, []).append(item)
    rows = []
    dup = conflict = 0
    for items in groups.values():
        vals = sorted(float(i["value"]) for i in items)
        n = len(vals)
        med = vals[n // 2] if n % 2 else 0.5 * (vals[n // 2 - 1] + vals[n // 2])
        dup += n - 1
        conflict += n > 1 and any(abs(v - med) > 0.05 * med for v in vals)
        rows.append(
            {**items[0], "value": _num(repr(med)), "source": " ".join(i["source"] for i in items)}
        )
    return Converted(tuple(rows), tuple(skipped), dup, conflict)


def write_long_csv(rows: Iterable[dict[str, str]], path: str | Path) -> None:
    """Write rows in the long format (header :data:`COLUMNS`)."""
    with Path(path).open("w", encoding="utf-8", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(COLUMNS))
        w.writeheader()
        for r in rows:
            w.writerow(r)
