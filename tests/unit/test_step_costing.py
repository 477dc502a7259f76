"""perfmodel.step.costing: the grouped timing of a step's compute ops is the per-op timing,
bit for bit, and the costing kept per instance is never another instance's."""

from __future__ import annotations

import numpy as np
import pytest

from hardware.device import load_device
from hardware.engine import load_engine
from perfmodel.model import load_model
from perfmodel.plan import ParallelPlan
from perfmodel.step.batch import Batch
from perfmodel.step.costing import costing_of, time_op, time_ops
from perfmodel.step.ops import Op, layer_ops
from perfmodel.step.time import step_time

#: a mixed batch over a few shapes: prefill chunks beside decodes, one row idle
BATCH = Batch(
    prefill_tokens=np.array([0.0, 512.0, 3000.0]),
    prefill_seqs=np.array([0.0, 1.0, 2.0]),
    prefill_pairs=np.array([0.0, 131328.0, 2.3e6]),
    prefill_kv_read=np.array([0.0, 512.0, 3000.0]),
    decode_seqs=np.array([1.0, 40.0, 7.0]),
    decode_context=np.array([900.0, 61000.0, 9000.0]),
)

INT8 = ParallelPlan(weight_dtype="int8", act_dtype="int8", kv_dtype="int8")  # the FPGA's math
CASES = [  # (model, device, plan, engine): dense, GQA + TP, MoE + EP, MLA, FP8 KV, FPGA
    ("llama-3.1-8b", "h100-sxm", ParallelPlan(), None),
    ("llama-3.1-70b", "h100-sxm", ParallelPlan(tp=4), "vllm"),
    ("mixtral-8x7b", "a100-sxm-80gb", ParallelPlan(tp=2, ep=2), "trtllm"),
    ("deepseek-v3", "h200-sxm", ParallelPlan(tp=8, weight_dtype="fp8"), "sglang"),
    ("llama-3.1-70b", "a100-sxm-80gb", ParallelPlan(tp=4, kv_dtype="fp8"), "vllm"),
    ("llama-3.1-8b", "alveo-v80", INT8, None),
]


@pytest.mark.parametrize(("mid", "dev", "plan", "eng"), CASES)
def test_grouped_timing_is_the_per_op_timing(
    mid: str, dev: str, plan: ParallelPlan, eng: str | None
) -> None:
    model, device = load_model(mid), load_device(dev)
    engine = load_engine(eng) if eng else None
    c = costing_of(model, device, plan, None, engine)
    ops = layer_ops(model, plan, BATCH, decode_kv_reads=c.decode_kv_reads)
    grouped = time_ops(ops, c, device, plan)
    assert [t.name for t in grouped] == [o.name for o in ops]
    for t, op in zip(grouped, ops, strict=True):
        one = time_op(op, c.profile(op), device, plan, c.comm_extra_s)
        assert t.count == one.count
        for f in ("flops", "bytes", "compute_s", "memory_s", "comm_s", "total_s"):
            a, b = np.broadcast_arrays(getattr(t, f), getattr(one, f))
            assert np.array_equal(a, b), (op.name, f)  # the same floats, not just close


def test_fpga_times_unpadded_rows() -> None:
    """A device without GEMM row tiles is costed on the unpadded FLOPs (grouped too)."""
    model, device = load_model("llama-3.1-8b"), load_device("alveo-v80")
    assert not device.pads_gemm_rows
    c = costing_of(model, device, INT8, None, None)
    ops = layer_ops(model, INT8, Batch.decode(1, 100))
    t = {o.name: o for o in time_ops(ops, c, device, INT8)}
    qkv = next(o for o in ops if o.name == "qkv_proj")
    assert qkv.unpadded_flops is not None
    assert float(t["qkv_proj"].flops) == float(qkv.count * qkv.unpadded_flops)
    assert float(qkv.flops) == 16 * float(qkv.unpadded_flops)  # 1 row padded to 16


def test_a_kept_costing_is_never_another_instances() -> None:
    """Costings are kept by the identity of their inputs: asking with another engine (or
    device) after the first gives that engine's step, not the kept one."""
    model, device = load_model("llama-3.1-70b"), load_device("h100-sxm")
    plan, b = ParallelPlan(tp=4), Batch.decode(32, 32 * 2000)
    first = step_time(model, device, b, plan=plan, engine=load_engine("vllm"))
    other = step_time(model, device, b, plan=plan, engine=load_engine("trtllm"))
    again = step_time(model, device, b, plan=plan, engine=load_engine("vllm"))
    assert float(first.total_s) != float(other.total_s)
    assert float(again.total_s) == float(first.total_s)
    a100 = step_time(model, load_device("a100-sxm-80gb"), b, plan=plan)
    assert float(a100.total_s) > float(step_time(model, device, b, plan=plan).total_s)


def test_pipeline_stages_time_as_each_alone() -> None:
    """pp > 1 times each stage's ops grouped; the stage totals are the per-op sums."""
    model, device = load_model("llama-3.1-70b"), load_device("h100-sxm")
    plan = ParallelPlan(tp=2, pp=2)
    st = step_time(model, device, BATCH, plan=plan, engine=load_engine("vllm"))
    from perfmodel.step.time import stage_ops

    c = costing_of(model, device, plan, None, load_engine("vllm"))
    for s, stage_s in enumerate(st.stage_s):
        ops = stage_ops(model, plan, BATCH, s, decode_kv_reads=c.decode_kv_reads)
        total = np.zeros(3)
        for op in ops:
            total = total + time_op(op, c.profile(op), device, plan, c.comm_extra_s).total_s
        assert np.array_equal(stage_s, total)


def test_the_kept_costings_stay_bounded() -> None:
    """Past :data:`_COSTINGS_KEPT` instances the memo starts again: bounded, same steps."""
    from perfmodel.step import costing

    model, device, b = load_model("llama-3.1-8b"), load_device("h100-sxm"), Batch.decode(8, 8000)
    ref = float(step_time(model, device, b, plan=ParallelPlan()).total_s)
    for _ in range(costing._COSTINGS_KEPT + 5):  # equal plans, distinct objects
        assert float(step_time(model, device, b, plan=ParallelPlan()).total_s) == ref
        assert len(costing._COSTINGS) <= costing._COSTINGS_KEPT


def test_an_instance_keeps_its_iteration_times_by_batch_contents() -> None:
    """``Instance.iteration_s`` is kept by the batch's bytes: the same batch again gives
    the same times bit for bit (a copy: changing it changes nothing kept), a batch
    differing in one value or in dtype is computed afresh, and the memo stays bounded."""
    from dataclasses import replace

    from perfmodel.step import instance as inst_mod
    from perfmodel.step.instance import Instance

    inst = Instance(load_model("llama-3.1-8b"), load_device("h100-sxm"))

    def mixed(prompt: list[float]) -> Batch:
        p, d = np.array(prompt), np.array([1.0, 8.0, 64.0])
        return Batch(p, np.ones(3), p * (p + 1) / 2, p, d, d * 700.0)

    b = mixed([0.0, 512.0, 2048.0])
    first = inst.iteration_s(b)
    assert np.array_equal(first, inst._iteration_s(b))
    first[:] = -1.0  # the caller's copy
    again = inst.iteration_s(b)
    assert np.array_equal(again, inst._iteration_s(b)) and again.min() > 0
    other = mixed([0.0, 512.0, 2049.0])
    assert inst.iteration_s(other)[2] != again[2]
    assert len(inst._iterations) == 2
    assert replace(inst, engine_spec="x")._iterations == {}  # a new instance: its own memo
    for k in range(inst_mod.ITERATIONS_KEPT + 5):
        inst.iteration_s(Batch.decode(np.array([1.0 + k]), np.array([100.0])))
    assert len(inst._iterations) <= inst_mod.ITERATIONS_KEPT


def test_one_gemm_op_costs_the_hand_derived_roofline_time() -> None:
    """Llama-3.1-8B's qkv_proj in one decode step on an H100 (engine-less, TP1), by hand:
    1 row padded to a 16-row tile, FLOPs 2·16·4096·6144, bytes 2·(4096·6144 + 4096 +
    6144); memory-bound at 80 % of 3.35 TB/s, plus 5 µs of launch; 32 layers."""
    model, device = load_model("llama-3.1-8b"), load_device("h100-sxm")
    assert device.peak("bf16") == pytest.approx(989.4e12) and device.hbm_bw_bytes_per_s == 3.35e12
    plan = ParallelPlan()
    c = costing_of(model, device, plan, None, None)
    op = next(o for o in layer_ops(model, plan, Batch.decode(1, 100)) if o.name == "qkv_proj")
    flops, bytes_ = 2.0 * 16 * 4096 * 6144, 2.0 * (4096 * 6144 + 4096 + 6144)
    per_layer = max(flops / (0.8 * 989.4e12), bytes_ / (0.8 * 3.35e12)) + 5e-6
    t = time_op(op, c.profile(op), device, plan)
    assert t.count == 32
    assert float(t.flops) == pytest.approx(32 * flops)
    assert float(t.total_s) == pytest.approx(32 * per_layer, rel=1e-12)
    (grouped,) = time_ops([op], c, device, plan)
    assert float(grouped.total_s) == float(t.total_s)


def test_collectives_moving_the_same_bytes_are_timed_once_with_their_own_counts() -> None:
    """``time_ops`` times a collective once per kind and bytes: a second all-reduce of the
    same bytes (another count of layers) takes the first one's seconds per execution times
    its own count; other bytes or another kind are timed for themselves. Each equals
    ``time_op`` of the op alone, bit for bit."""
    model, device, plan = load_model("llama-3.1-70b"), load_device("h100-sxm"), ParallelPlan(tp=4)
    c = costing_of(model, device, plan, None, None)
    z = np.zeros(3)
    b = np.array([0.0, 1e6, 3e7])
    ops = [
        Op("ar_a", "comm", z, b, 80, collective="all_reduce"),
        Op("ar_b", "comm", z, b.copy(), 3, collective="all_reduce"),
        Op("ar_c", "comm", z, 2 * b, 80, collective="all_reduce"),
        Op("ag", "comm", z, b, 1, collective="all_gather"),
    ]
    got = time_ops(ops, c, device, plan)
    for t, op in zip(got, ops, strict=True):
        one = time_op(op, c.profile(op), device, plan, c.comm_extra_s)
        assert (t.name, t.count) == (op.name, op.count)
        assert np.array_equal(t.total_s, one.total_s) and np.array_equal(t.comm_s, one.comm_s)
    per_exec = got[0].total_s / 80
    assert np.allclose(got[1].total_s, 3 * per_exec, rtol=1e-15)
    assert got[2].total_s[2] > got[0].total_s[2]  # twice the bytes: timed, not reused
    assert got[3].total_s[1] != got[0].total_s[1] / 80  # another collective
