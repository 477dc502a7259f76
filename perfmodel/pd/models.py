"""Per-phase instance models for prefill/decode disaggregation (DistServe-style).

A disaggregated deployment runs prompts on *prefill instances* and generation on
*decode instances*; the KV cache of each prompt moves from one to the other over a
link. Every time below comes from the cost layer: prefill and decode iterations from
``perfmodel.step.step_time``, the KV transfer from ``hardware.comm.collective_time_s``
(``p2p``). Requests are routed to the instances of a pool at random with probability
proportional to each instance's goodput, so every instance sees a Poisson stream and
``n`` instances of goodput ``g`` serve ``n·g`` (DistServe Alg. 1: ``n = ⌈R/goodput⌉``).

The models live in four modules; this one re-exports their public names:

- ``perfmodel.pd_config``: :class:`PhaseConfig` (its iterations costed by its ``instance(model)``)
  (roofline ``step_time`` or a calibrated profile), the KV link and transfer time,
  :class:`PhaseGoodput`;
- ``perfmodel.pd_prefill``: the prefill instance (M/G/1 TTFT tail, prompt batching);
- ``perfmodel.pd_decode``: the decode instance (continuous batching, KV slots, TPOT);
- ``perfmodel.pd_lengths``: the built-in workloads discretized for planning.

Assumptions, stated once: no pipeline parallelism; prompts batch only below ``L_m``;
the decode admission reserves the final KV; the receiver side of the link is not contended (its
load is a capacity constraint of the planner, not a delay); step-time fluctuations
from context lengths enter through the batch only.
"""

from __future__ import annotations

from perfmodel.pd.config import (
    KV_PLACEMENTS,
    PHASES,
    KVLink,
    PhaseConfig,
    PhaseGoodput,
    kv_link,
    kv_transfer_time_s,
    receive_time_s,
)
from perfmodel.pd.decode import DecodeProfile, decode_goodput, decode_kv_capacity, decode_profile
from perfmodel.pd.prefill import (
    PrefillProfile,
    mg1_wait_tail,
    prefill_batch_tokens,
    prefill_goodput,
    prefill_profile,
)
from perfmodel.workload.pd_lengths import PLANNER_ATOMS, planner_lengths

__all__ = [
    "KV_PLACEMENTS",
    "PHASES",
    "PLANNER_ATOMS",
    "DecodeProfile",
    "KVLink",
    "PhaseConfig",
    "PhaseGoodput",
    "PrefillProfile",
    "decode_goodput",
    "decode_kv_capacity",
    "decode_profile",
    "kv_link",
    "kv_transfer_time_s",
    "mg1_wait_tail",
    "planner_lengths",
    "prefill_batch_tokens",
    "prefill_goodput",
    "prefill_profile",
    "receive_time_s",
]
