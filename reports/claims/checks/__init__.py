"""The checks a claim can name (``[check] name = ...``), imported lazily.

Each check is ``run(params: Side) -> Outcome`` where ``params`` is the claim's
``[check.params]`` layered over its ``[setup]`` (a parameter may override a setup key);
a two-sided check reads the sub-tables ``a`` and ``b``, each layered over the rest.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from perfmodel.errors import SpecError
from reports.claims.setup import Side
from reports.claims.verdict import Outcome

#: check name -> (module, function, one-line description)
CHECKS: dict[str, tuple[str, str, str]] = {
    "serving_ratio": (
        "serving",
        "serving_ratio",
        "throughput/goodput/latency ratio of two policies",
    ),
    "kv_paging": ("serving", "kv_paging", "decode throughput, paged vs reserved KV (vLLM)"),
    "memory": ("memory", "memory", "fits / max batch / max context / concurrent sequences"),
    "memory_ratio": ("memory", "memory_ratio", "peak memory of two configurations"),
    "crossover": ("moe", "crossover", "MoE expert-block crossover n* with its interval"),
    "expert_cache": ("moe", "expert_cache", "expert-cache hit rate at a cache size"),
    "offload_speedup": ("moe", "offload_speedup", "decode speedup of an expert-offloading policy"),
    "dispatch_regime": ("moe", "dispatch_regime", "where an EP MoE layer's time goes"),
    "chunked_traffic": ("bounds", "chunked_traffic", "HBM bytes of chunked vs whole prefill"),
    "bytes_removed": ("bounds", "bytes_removed", "roofline/Amdahl bound from bytes removed"),
    "intensity": ("bounds", "intensity", "decode arithmetic intensity vs the ridge point"),
    "overlap": ("bounds", "overlap", "speedup bound from overlapping compute/memory/comm ops"),
    "transfer": ("bounds", "transfer", "minimum time of a transfer over a link"),
    "prefix_reuse": ("bounds", "prefix_reuse", "TTFT speedup from reusing a cached prefix"),
    "speculative": ("speculative", "speculative", "speculative-decoding speedup vs acceptance"),
    "stability": ("stability", "stability", "stable rate / cluster size vs a stated figure"),
    "pd_gain": ("pd", "pd_gain", "PD disaggregation vs colocated goodput per GPU"),
    "pd_ratio": ("pd", "pd_ratio", "how the P:D ratio moves with the request mix"),
    "complexity": ("complexity", "complexity", "NP-hardness / polynomial limits by solving"),
    "not_checkable": ("unsupported", "not_checkable", "states what the tool lacks"),
}

Check = Callable[[Side], Outcome]


def get_check(name: str) -> Check:
    if name not in CHECKS:
        raise SpecError(f"unknown check {name!r}; valid: {', '.join(sorted(CHECKS))}")
    mod, fn, _ = CHECKS[name]
    module = importlib.import_module(f"reports.claims.checks.{mod}")
    f: Check = getattr(module, fn)
    return f
