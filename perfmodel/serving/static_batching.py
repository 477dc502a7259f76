"""Static (request-level) batching: the baseline continuous batching is compared with.

Before iteration-level scheduling (Orca, OSDI 2022) an engine formed a batch of ``b``
requests, ran it to completion and only then admitted the next batch
(FasterTransformer, Hugging Face ``generate``). Modeled here at saturation:

* every request in the batch reserves KV for ``L_res`` tokens (default the workload's
  largest ``s + o``, as those engines allocate for the maximum length), so
  ``b = min(b_cap, ⌊M / L_res⌋)`` with ``M`` the KV capacity in tokens
  (:func:`perfmodel.memory.memory_fit`);
* prompts are padded to the longest in the batch, ``S_b = E[max of b inputs]``, and the
  batch decodes until its longest output is done, ``O_b = E[max of b outputs]``
  (finished rows keep computing padding): batch time
  ``T = t_prefill(b, S_b) + Σ_{j=0}^{O_b−1} t_decode(b, S_b + j)`` with ``t`` the instance's
  iteration time (:meth:`perfmodel.step.instance.Instance.iteration_s`);
* throughput ``b / T`` requests/s and ``b·E[o] / T`` useful output tokens/s.

``E[max of b draws] = Σ_x x·(F(x)^b − F(x⁻)^b)`` over the marginal's atoms. Queueing
before the batch forms is left out (the comparison is at saturation, where both
policies are judged by their largest sustainable rate).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from perfmodel.errors import InfeasibleError, SpecError
from perfmodel.memory import DEFAULT_GPU_MEMORY_UTILIZATION
from perfmodel.step.batch import Batch
from perfmodel.step.instance import Instance
from perfmodel.workload.lengths import LengthDistribution


def expected_max(values: NDArray[np.int64], weights: NDArray[np.float64], n: int) -> float:
    """``E[max of n i.i.d. draws]`` of a discrete distribution (values, weights)."""
    if n < 1:
        raise SpecError(f"number of draws must be >= 1, got {n}")
    v = np.asarray(values, dtype=np.float64)
    order = np.argsort(v, kind="stable")
    v, w = v[order], np.asarray(weights, dtype=np.float64)[order]
    uniq, inv = np.unique(v, return_inverse=True)
    pw = np.bincount(inv, weights=w)
    cdf = np.minimum(np.cumsum(pw), 1.0)
    prev = np.concatenate([[0.0], cdf[:-1]])
    return float(np.dot(uniq, cdf**n - prev**n))


@dataclass(frozen=True)
class StaticBatching:
    batch: int
    reserved_tokens: int
    padded_input_tokens: float
    padded_output_tokens: float
    prefill_s: float
    decode_s: float
    batch_s: float
    rate_per_s: float
    output_tokens_per_s: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def static_batching(
    inst: Instance,
    lengths: LengthDistribution,
    *,
    max_batch: int | None = None,
    reserved_tokens: int | None = None,
    kv_capacity_tokens: int | None = None,
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
) -> StaticBatching:
    """Saturated throughput of request-level batching (module docstring)."""
    l_res = lengths.max_total_tokens if reserved_tokens is None else int(reserved_tokens)
    if l_res < 1:
        raise SpecError(f"reserved tokens per request must be >= 1, got {l_res}")
    if kv_capacity_tokens is None:
        fit = inst.memory_fit(gpu_memory_utilization=gpu_memory_utilization)
        kv_capacity_tokens = fit.kv_capacity_tokens
    b = kv_capacity_tokens // l_res
    if max_batch is not None:
        if max_batch < 1:
            raise SpecError(f"max batch must be >= 1, got {max_batch}")
        b = min(b, max_batch)
    if b < 1:
        raise InfeasibleError(
            f"KV room for {kv_capacity_tokens} tokens holds no request reserved at {l_res} "
            "tokens; use more devices or a shorter reserved length"
        )
    s_b = expected_max(lengths.input_tokens, lengths.weights, b)
    o_b = expected_max(lengths.output_tokens, lengths.weights, b)
    steps = max(1, math.ceil(o_b - 1e-9))
    t_p = float(inst.iteration_s(Batch.prefill(b, s_b)))
    ctx = s_b + np.arange(steps, dtype=np.float64)
    t_d = float(np.sum(inst.iteration_s(Batch.decode(b, ctx))))
    total = t_p + t_d
    return StaticBatching(
        batch=int(b),
        reserved_tokens=l_res,
        padded_input_tokens=s_b,
        padded_output_tokens=o_b,
        prefill_s=t_p,
        decode_s=t_d,
        batch_s=total,
        rate_per_s=b / total,
        output_tokens_per_s=b * lengths.mean_output_tokens / total,
    )
