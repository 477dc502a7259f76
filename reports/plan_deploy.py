"""Launch arguments for the recommended fleet: vLLM, SGLang and TensorRT-LLM.

One block per pool, with the numbers the plan assumed next to the flags they set:

* tensor / pipeline parallel size: the pool's TP and PP;
* ``--max-num-batched-tokens`` (SGLang ``--chunked-prefill-size``, TRT-LLM
  ``--max_num_tokens``): the token budget the queueing model used;
* ``--gpu-memory-utilization`` (SGLang ``--mem-fraction-static``, TRT-LLM
  ``--kv_cache_free_gpu_memory_fraction``): the memory model's fraction of HBM
  (``perfmodel.memory.DEFAULT_GPU_MEMORY_UTILIZATION``);
* ``--max-num-seqs`` (SGLang ``--max-running-requests``, TRT-LLM ``--max_batch_size``):
  the requests the KV cache holds at once, ``⌈M / E[s + o]⌉`` with ``M`` the pool's KV
  capacity in tokens — the cap that does not bind before the KV memory does;
* PD roles: vLLM ``--kv-transfer-config`` (NixlConnector), SGLang
  ``--disaggregation-mode prefill|decode``, TensorRT-LLM disaggregated serving
  (``trtllm-serve disaggregated`` with a context and a generation server).

The engine (``--engine``) is recorded; launch lines are written for all three so that
the operator can use the one the plan was modelled with.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from perfmodel.memory import DEFAULT_GPU_MEMORY_UTILIZATION
from solvers.fleet.results import PlanResult, Pool

_HF_PREFIX = "huggingface.co/"


def hf_repo(model_sources: tuple[str, ...], model_id: str) -> str:
    """The Hugging Face repo named in the model's sources, else its id."""
    for s in model_sources:
        if s.startswith(_HF_PREFIX):
            parts = s[len(_HF_PREFIX) :].split()[0].split("/")
            if len(parts) >= 2:
                return "/".join(parts[:2])
    return model_id


def max_seqs(pool: Pool, mean_tokens: float) -> int:
    """Requests the pool's KV cache holds at once: ``⌈M / E[s + o]⌉`` (at least 1)."""
    return max(1, math.ceil(pool.candidate.kv_capacity_tokens / mean_tokens))


def pool_commands(pool: Pool, repo: str, mean_tokens: float) -> dict[str, str]:
    c = pool.candidate
    seqs = max_seqs(pool, mean_tokens)
    mem = DEFAULT_GPU_MEMORY_UTILIZATION
    dt = {"bf16": "bfloat16", "fp16": "float16"}.get(c.dtype, c.dtype)
    budget = c.max_batched_tokens or None
    vllm = [f"vllm serve {repo}", f"--tensor-parallel-size {c.tp}"]
    if c.pp > 1:
        vllm.append(f"--pipeline-parallel-size {c.pp}")
    vllm += [f"--dtype {dt}", f"--gpu-memory-utilization {mem:g}", f"--max-num-seqs {seqs}"]
    sgl = [f"python -m sglang.launch_server --model-path {repo}", f"--tp {c.tp}"]
    if c.pp > 1:
        sgl.append(f"--pp-size {c.pp}")
    sgl += [f"--dtype {dt}", f"--mem-fraction-static {mem:g}", f"--max-running-requests {seqs}"]
    trt = [f"trtllm-serve {repo}", f"--tp_size {c.tp}", f"--pp_size {c.pp}"]
    trt += [f"--kv_cache_free_gpu_memory_fraction {mem:g}", f"--max_batch_size {seqs}"]
    if budget:
        vllm += ["--enable-chunked-prefill", f"--max-num-batched-tokens {budget}"]
        sgl.append(f"--chunked-prefill-size {budget}")
        trt.append(f"--max_num_tokens {budget}")
    if c.role in ("prefill", "decode"):
        role = "kv_producer" if c.role == "prefill" else "kv_consumer"
        cfg = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"})
        vllm.append(f"--kv-transfer-config '{cfg}'  # {role}")
        sgl.append(f"--disaggregation-mode {c.role}")
        trt.append(
            "# disaggregated: list this pool as the "
            + ("context_servers" if c.role == "prefill" else "generation_servers")
            + " of `trtllm-serve disaggregated -c disagg.yaml`"
        )
    join = " \\\n    "
    return {"vllm": join.join(vllm), "sglang": join.join(sgl), "tensorrt-llm": join.join(trt)}


def deploy_config(result: PlanResult, *, model_sources: tuple[str, ...]) -> str:
    """The launch script text: a commented header of assumptions, then one block per pool."""
    a = result.assumptions
    repo = hf_repo(model_sources, a["model"])
    mean_tokens = a["mean_input_tokens"] + a["mean_output_tokens"]
    rec = result.recommendation
    e = rec.economics
    slo = a["slo"]
    lines = [
        f"# perfmodel plan: {a['model']} at {a['rate_per_s']:g} req/s (headroom "
        f"{a['headroom']:g}), workload {a['workload']}",
        f"# SLO p{slo['percentile'] * 100:g} TTFT <= {slo['ttft_ms']:g} ms, TPOT <= "
        f"{slo['tpot_ms']:g} ms, goal {slo['goal']:.0%}; engine: {a['engine']}",
        f"# fleet: {rec.summary}",
        f"# cost {'n/a' if e.cost_per_hour_usd is None else f'${e.cost_per_hour_usd:,.2f}/h'}"
        + (
            ""
            if e.cost_per_million_output_tokens_usd is None
            else f", ${e.cost_per_million_output_tokens_usd:.3f}/M output tokens"
        ),
        f"# mean request: {a['mean_input_tokens']:.0f} in / {a['mean_output_tokens']:.0f} out "
        "tokens; run the command of your engine on each instance of a pool (not a script)",
        "",
    ]
    for i, p in enumerate(rec.pools, 1):
        c = p.candidate
        lines += [
            f"# ---- pool {i}: {p.instances} instance(s) x {c.devices} {c.device.id} "
            f"({c.role}, TP{c.tp}{f' PP{c.pp}' if c.pp > 1 else ''}, {c.dtype})",
            f"# assumed: {p.per_instance_rate_per_s:.3g} req/s per instance, goodput "
            f"{c.goodput_per_instance_per_s:.3g} req/s, service rate "
            f"{c.capacity_per_instance_per_s:.3g} req/s (utilization {p.utilization:.0%}), "
            f"KV {c.kv_capacity_tokens:,} tokens, bound by {c.limiter}",
        ]
        for engine, cmd in pool_commands(p, repo, mean_tokens).items():
            lines += [f"# {engine}:", "  " + cmd.replace("\n", "\n  ")]
        lines.append("")
    return "\n".join(lines)


def deploy_dict(result: PlanResult, *, model_sources: tuple[str, ...]) -> list[dict[str, Any]]:
    a = result.assumptions
    repo = hf_repo(model_sources, a["model"])
    mean_tokens = a["mean_input_tokens"] + a["mean_output_tokens"]
    return [
        {"pool": i, **pool_commands(p, repo, mean_tokens)}
        for i, p in enumerate(result.recommendation.pools, 1)
    ]


@dataclass(frozen=True)
class PlanReport:
    """``perfmodel plan``'s answer: the fleet plan, its deploy commands, the time it took."""

    result: PlanResult
    model_sources: tuple[str, ...]
    elapsed_s: float

    def to_dict(self) -> dict[str, Any]:
        d = self.result.to_dict()
        d["deploy"] = deploy_dict(self.result, model_sources=self.model_sources)
        d["elapsed_s"] = self.elapsed_s
        return d
