"""The simulator's step table stays exact with an engine model (perfmodel/step/table.py)."""

from __future__ import annotations

import numpy as np
import pytest

from hardware.device import load_device
from hardware.engine import load_engine
from perfmodel.model import load_model
from perfmodel.plan import ParallelPlan
from perfmodel.step.batch import Batch
from perfmodel.step.instance import Instance
from perfmodel.step.table import build_step_table


@pytest.mark.parametrize("engine", ["trtllm", "vllm"])
def test_engine_host_time_and_kv_rereads_are_tabulated(engine: str) -> None:
    """vLLM V0's decode attention re-reads K/V (gqa_kv_sharing 0.815: 1 + 3·0.185 = 1.55
    reads for Llama-3.1-8B's 4 query heads per KV head) and both engines charge host time
    per request: the table carries both (rows and a decode-KV coefficient) and matches
    ``iteration_s`` to rounding, so the simulator keeps its fast path."""
    e = load_engine(engine)
    inst = Instance(load_model("llama-3.1-8b"), load_device("h100-sxm"), ParallelPlan(), engine=e)
    t = build_step_table(inst, 4096)
    assert t.exact and t.max_rel_error < 1e-12
    z, one = np.asarray(0.0), np.asarray(1.0)
    prefill_kv = float(inst.step(Batch(z, z, z, one, z, z)).op("attention").memory_s)
    decode_kv = float(inst.step(Batch(z, z, z, z, z, one)).op("attention").memory_s)
    assert decode_kv / prefill_kv == pytest.approx(e.decode_kv_reads(32, 8), rel=1e-9)
    assert t.attn_decode_kv_extra_s == pytest.approx(decode_kv - prefill_kv)
    # 64 decodes at 1,000 tokens of context: one table lookup equals the full step time
    b = Batch(z, z, z, z, np.asarray(64.0), np.asarray(64_000.0))
    got = t.time_s(64, 64, 0.0, 64_064.0, 64_000.0, decode_seqs=64)
    assert got == pytest.approx(float(inst.iteration_s(b)), rel=1e-12)
