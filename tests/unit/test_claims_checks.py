"""Each claim check on a hand-worked case (reports/claims/checks)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hardware.comm import COLLECTIVE_OVERHEAD_S, COMM_EFFICIENCY
from hardware.device import load_device
from hardware.roofline import Roofline
from perfmodel.cache.footprint import expert_bytes
from perfmodel.cache.paging import link_transfer_s
from perfmodel.memory import memory_fit
from perfmodel.model import load_model
from perfmodel.plan import ParallelPlan
from perfmodel.serving.service import service_rate
from perfmodel.step.batch import Batch
from perfmodel.step.instance import Instance
from perfmodel.step.time import step_time
from perfmodel.units import GiB
from perfmodel.workload.presets import preset
from reports.claims.checks import CHECKS, get_check
from reports.claims.setup import Side

M8 = load_model("llama-3.1-8b")
A100 = load_device("a100-sxm-80gb")


def run(name: str, **values: Any) -> Any:
    return get_check(name)(Side(Path.cwd(), values, "test"))


def test_every_registered_check_imports() -> None:
    for name in CHECKS:
        assert callable(get_check(name))


def test_memory_concurrent_sequences_explicit_numbers() -> None:
    # 0.9 · 80 GiB − 10e9 params · 2 B = budget; 1,000 B/token × 1,000 tokens per sequence
    o = run(
        "memory",
        device="h100-sxm",
        weight_params=10e9,
        weight_bits=16,
        kv_bytes_per_token=1000,
        kind="concurrent_sequences",
        context_len=1000,
    )
    budget = 0.9 * 80 * GiB - 20e9
    assert o.value == math.floor(budget / 1e6)
    # half the layers windowed at 100 tokens: 0.5·1000·1000 + 0.5·1000·100 bytes each
    w = run(
        "memory",
        device="h100-sxm",
        weight_params=10e9,
        weight_bits=16,
        kv_bytes_per_token=1000,
        kind="max_batch",
        context_len=1000,
        full_fraction=0.5,
        window_fraction=0.5,
        window_tokens=100,
    )
    assert w.value == math.floor(budget / 550_000)
    c = run(
        "memory",
        device="h100-sxm",
        weight_params=10e9,
        weight_bits=16,
        kv_bytes_per_token=1000,
        kind="max_context",
        batch=2,
    )
    assert c.value == pytest.approx(budget / 2000, rel=1e-9)


def test_memory_catalog_model_matches_memory_fit() -> None:
    fit = memory_fit(M8, A100, ParallelPlan())
    o = run(
        "memory", model="llama-3.1-8b", device="a100-sxm-80gb", kind="max_batch", context_len=4096
    )
    # 131,072 B/token (32 layers × 8 KV heads × 128 × 2 × 2 B): ⌊budget / (4096 · that)⌋
    assert fit.kv_bytes_per_token == 131_072
    assert o.value == math.floor(fit.kv_budget_bytes / (4096 * 131_072))
    assert o.value == fit.max_batch(4096)


def test_memory_ratio_peak_by_hand() -> None:
    o = run(
        "memory_ratio",
        model="llama-3.1-8b",
        device="a100-sxm-80gb",
        batch=4,
        context_len=1000,
        a={"kv_dtype": "int4"},
        b={"kv_dtype": "bf16"},
    )
    fit = memory_fit(M8, A100, ParallelPlan())
    fixed = fit.weight_bytes + fit.reserve_bytes
    kv16 = 4 * 1000 * 131_072
    assert o.value == pytest.approx((fixed + kv16) / (fixed + kv16 / 4))


def test_kv_paging_footprints_by_hand() -> None:
    # s = o = 100: c̄ = (100·100 + 100·99/2)/100 = 149.5; paged footprint 149.5 + 7.5 = 157
    o = run(
        "kv_paging",
        model="llama-3.1-8b",
        device="a100-sxm-80gb",
        input_tokens=100,
        output_tokens=100,
        max_len_tokens=1000,
        max_num_seqs=10**6,
    )
    steps = dict(o.steps)
    M = memory_fit(M8, A100, ParallelPlan()).kv_capacity_tokens
    assert steps["reserved for max length: footprint / batch / tok/s"].startswith(
        f"1,000 / {M // 1000:,.1f}"
    )
    assert steps["paged (16-token blocks): footprint / batch / tok/s"].startswith(
        f"157 / {M / 157:,.1f}"
    )


def test_saturated_decode_ratio_by_hand() -> None:
    o = run(
        "serving_ratio",
        model="llama-3.1-8b",
        device="a100-sxm-80gb",
        input_tokens=100,
        output_tokens=100,
        metric="decode_throughput",
        max_num_seqs=10**6,
        max_len_tokens=1000,
        a={"policy": "saturated_decode", "allocation": "paged"},
        b={"policy": "saturated_decode", "allocation": "reserved_max"},
    )
    M = memory_fit(M8, A100, ParallelPlan()).kv_capacity_tokens

    def tput(b: float) -> float:
        return b / float(step_time(M8, A100, Batch.decode(b, 149.5)).total_s)

    assert o.value == pytest.approx(tput(M / 157) / tput(M // 1000), rel=1e-9)


def test_serving_ratio_continuous_over_static() -> None:
    from perfmodel.serving.static_batching import static_batching

    o = run(
        "serving_ratio",
        model="llama-3.1-8b",
        device="a100-sxm-80gb",
        workload="chat",
        metric="throughput",
        a={"policy": "continuous"},
        b={"policy": "static", "max_batch": 64},
    )
    mu = service_rate(Instance(M8, A100), preset("chat")).rate_per_s
    st = static_batching(Instance(M8, A100), preset("chat").lengths, max_batch=64)
    assert o.value == pytest.approx(mu / st.rate_per_s)


def test_crossover_derived_is_the_ridge_over_efficiencies() -> None:
    # b/β = (w bytes/(e_m·BW)) / (2w FLOP/(e_c·peak)) with 2-byte weights: e_c·peak/(e_m·BW)
    o = run("crossover", model="qwen3-30b-a3b", device="h100-sxm", source="derived")
    r = Roofline(load_device("h100-sxm"))
    assert o.value == pytest.approx(r.flop_rate("bf16") / r.byte_rate)


def test_expert_cache_uniform_lru_is_c_over_e() -> None:
    # Mixtral: 8 experts, top-2; a 4-expert LRU under uniform routing hits 4/8 of the time
    o = run("expert_cache", model="mixtral-8x7b", cache_multiple=2.0, tokens=1)
    assert o.value == pytest.approx(0.5, abs=1e-6)


def test_offload_speedup_precision_only_by_hand() -> None:
    mx = load_model("mixtral-8x7b")
    dev = load_device("a100-40gb")
    o = run(
        "offload_speedup",
        model="mixtral-8x7b",
        device="a100-40gb",
        batch=1,
        context_len=512,
        a={"cache_experts": 0, "low_dtype": "int4", "low_fraction": 1.0},
        b={"cache_experts": 0},
    )
    t = float(step_time(mx, dev, Batch.decode(1, 512)).total_s)
    misses = mx.n_moe_layers * 2  # nothing cached: D(1) = top-k = 2 per layer
    hi = link_transfer_s(expert_bytes(mx, "bf16"), dev.host_link)
    lo = link_transfer_s(expert_bytes(mx, "int4"), dev.host_link)
    assert o.value == pytest.approx((t + misses * hi) / (t + misses * lo))


def test_chunked_traffic_identities() -> None:
    common: dict[str, Any] = {"model": "llama-3.1-8b", "device": "a100-sxm-80gb", "input_len": 1024}
    assert run("chunked_traffic", **common, chunk=1024).value == pytest.approx(0.0, abs=1e-12)
    assert run("chunked_traffic", **common, chunk=1024, decode_batch=8).value == pytest.approx(
        0.0, abs=1e-12
    )
    two = run("chunked_traffic", **common, chunk=512).value
    parts = Batch.prefill(1, np.array([512, 512]), np.array([0, 512]))
    chunked = float(np.sum(step_time(M8, A100, parts).bytes))
    whole = float(step_time(M8, A100, Batch.prefill(1, 1024)).bytes)
    assert two == pytest.approx(chunked / whole - 1)
    assert two > 0.5  # a dense model re-reads all of its weights per chunk


def test_bytes_removed_memory_bound_op_by_hand() -> None:
    o = run(
        "bytes_removed",
        model="llama-3.1-8b",
        device="a100-sxm-80gb",
        phase="decode",
        batch=1,
        context_len=65536,
        ops=["attention"],
        bytes_fraction=0.5,
    )
    st = step_time(M8, A100, Batch.decode(1, 65536))
    att = st.op("attention")
    assert att.bound == "memory"
    new = float(st.total_s) - 0.5 * float(att.memory_s)
    assert o.value == pytest.approx(float(st.total_s) / new)
    assert o.bound == "upper"


def test_overlap_bound_by_hand() -> None:
    o = run("overlap", model="llama-3.1-8b", device="a100-sxm-80gb", batch=64, context_len=1024)
    st = step_time(M8, A100, Batch.decode(64, 1024))
    parts = [float(v) for v in st.by_bound().values()]
    assert o.value == pytest.approx(sum(parts) / max(parts))
    assert sum(parts) == pytest.approx(float(st.total_s))


def test_intensity_batch_is_kv_capacity_over_context() -> None:
    o = run("intensity", model="llama-3.1-8b", device="a100-sxm-80gb", context_len=4096)
    b = memory_fit(M8, A100, ParallelPlan()).kv_capacity_tokens // 4096
    st = step_time(M8, A100, Batch.decode(b, 4096))
    assert o.value == pytest.approx(float(st.by_bound()["memory"]) / float(st.total_s))


def test_transfer_by_hand() -> None:
    # 8 Gb/s = 1e9 B/s; p2p time = overhead + bytes/(efficiency · bw) + latency
    o = run("transfer", bytes=1e9, bw_gbit_per_s=8, latency_s=1e-3)
    assert o.value == pytest.approx(COLLECTIVE_OVERHEAD_S + 1.0 / COMM_EFFICIENCY + 1e-3)
    m = run(
        "transfer", bytes=1e9, bw_gbit_per_s=8, latency_s=1e-3, messages=1, baseline_messages=1000
    )
    one = COLLECTIVE_OVERHEAD_S + 1.0 / COMM_EFFICIENCY + 1e-3
    many = 1000 * (COLLECTIVE_OVERHEAD_S + 1e-3 / COMM_EFFICIENCY + 1e-3)
    assert m.value == pytest.approx(1 - one / many)


def test_prefix_reuse_by_hand() -> None:
    assert run(
        "prefix_reuse", model="llama-3.1-8b", device="a100-sxm-80gb", input_len=2000, hit_rate=0.0
    ).value == pytest.approx(1.0)
    o = run(
        "prefix_reuse", model="llama-3.1-8b", device="a100-sxm-80gb", input_len=2000, hit_rate=0.75
    )
    full = float(step_time(M8, A100, Batch.prefill(1, 2000)).total_s)
    part = float(step_time(M8, A100, Batch.prefill(1, 500, 1500)).total_s)
    assert o.value == pytest.approx(full / part)


def test_speculative_check_has_alpha_as_open_assumption() -> None:
    o = run(
        "speculative", model="llama-3.1-8b", device="a100-sxm-80gb", gamma=4, draft_cost_ratio=0.0
    )
    assert o.value is None and o.assumptions[0].name == "alpha" and o.assumptions[0].default is None
    w = run(
        "speculative",
        model="llama-3.1-8b",
        device="a100-sxm-80gb",
        gamma=4,
        draft_cost_ratio=0.0,
        alpha=1.0,
        context_len=1024,
    )
    t = float(step_time(M8, A100, Batch.decode(1, 1024)).total_s)
    tv = float(step_time(M8, A100, Batch.prefill(1, 5, 1024)).total_s)
    assert w.value == pytest.approx(5 * t / tv)


def test_stability_rate_and_cluster_size() -> None:
    mu = service_rate(Instance(M8, A100), preset("chat")).rate_per_s
    assert run(
        "stability",
        kind="stable_rate",
        model="llama-3.1-8b",
        device="a100-sxm-80gb",
        workload="chat",
    ).value == pytest.approx(mu)
    n = run(
        "stability",
        kind="cluster_size",
        model="llama-3.1-8b",
        device="a100-sxm-80gb",
        workload="chat",
        rate_per_s=10 * mu,
    ).value
    assert n == math.ceil(10 * mu / (0.8 * mu))  # 13 instances at 80 % utilization


def test_complexity_partition_instances_hold() -> None:
    assert run("complexity", kind="np_hard_reduction", instances=3).value == 1.0
    assert run("complexity", kind="polynomial_limits", instances=2).value == 1.0


def test_pd_ratio_of_a_mix_with_itself_is_one() -> None:
    mix = {"input_tokens": 1024, "output_tokens": 128}
    o = run(
        "pd_ratio",
        model="llama-3.1-8b",
        device="h100-sxm",
        ttft_slo_ms=1000,
        tpot_slo_ms=50,
        tps=[1],
        a=mix,
        b=mix,
    )
    assert o.value == pytest.approx(1.0)


def test_not_checkable_says_what_is_missing() -> None:
    o = run("not_checkable", missing="no linear attention")
    assert o.not_checkable == "no linear attention"


def _ps_decode_rate(inst: Instance, slots: float, steps: int, context: float) -> float:
    """The largest rate whose decode residents ``N`` keep ``E[N] < c``, with ``N`` the
    processor-sharing law ``π(N)/π(N−1) = λ·E[o−1]·t(N)/N`` (every resident advances one
    step per iteration of ``t(N)``), over batches up to ``4c + 8``."""
    from scipy.optimize import brentq

    k = np.arange(1.0, int(4 * slots + 8) + 1)
    t = inst.iteration_s(Batch.decode(k, context))

    def mean_n(lam: float) -> float:
        logp = np.concatenate([[0.0], np.cumsum(np.log(lam * steps * t) - np.log(k))])
        p = np.exp(logp - logp.max())
        return float(np.arange(k.size + 1) @ (p / p.sum()))

    return float(brentq(lambda lam: mean_n(lam) - slots, 1.0, float(slots / (steps * t[0]))))


def test_pd_gain_by_hand_at_loose_slo() -> None:
    """Fixed 1024/128 requests, Llama-3.1-8B, H100 TP1, SLOs so loose that every goodput is
    its stability limit: prefill ``1/t(1024-token prompt)`` (1024 > L_m, so one prompt per
    batch); decode the largest rate whose processor-sharing law of residents keeps
    ``E[N]`` below the ``c`` KV slots (127 decode steps per request, mean context
    1024 + 63); PD per GPU ``1/(1/g_p + 1/g_d)``; colocated: its service rate μ. Each from
    the step-time and memory primitives, not from the planner."""
    from perfmodel.pd.config import PhaseConfig
    from perfmodel.pd.prefill import prefill_batch_tokens
    from perfmodel.workload.lengths import LengthDistribution
    from perfmodel.workload.presets import Workload

    h100 = load_device("h100-sxm")
    inst = Instance(M8, h100, ParallelPlan(tp=1))
    assert prefill_batch_tokens(M8, PhaseConfig("prefill", h100, ParallelPlan(tp=1))) < 1024
    g_p = 1.0 / float(inst.iteration_s(Batch.prefill(1, 1024)))
    # decode KV: 90 % of HBM − weights − the activation reserve of ~2 slots' tokens
    m0 = memory_fit(M8, h100, ParallelPlan(tp=1), max_batched_tokens=256).kv_capacity_tokens
    reserve = int(min(max(256, 2 * m0 / 1152), 8192))
    slots = memory_fit(M8, h100, ParallelPlan(tp=1), max_batched_tokens=reserve).kv_capacity_tokens
    slots /= 1152
    g_d = _ps_decode_rate(inst, slots, 127, 1024 + 63)
    pd_per_gpu = 1.0 / (1.0 / g_p + 1.0 / g_d)
    lengths = LengthDistribution("fixed", np.array([1024]), np.array([128]), np.array([1.0]))
    mu = service_rate(inst, Workload("fixed", lengths), max_batched_tokens=2048).rate_per_s
    o = run(
        "pd_gain",
        model="llama-3.1-8b",
        device="h100-sxm",
        input_tokens=1024,
        output_tokens=128,
        ttft_slo_ms=1e6,
        tpot_slo_ms=1e6,
        tps=[1],
    )
    steps = dict(o.steps)
    assert float(steps["prefill config, goodput per instance (req/s)"].split(", ")[1]) == (
        pytest.approx(g_p, rel=2e-3)
    )
    # the profile interpolates t(N) on a 513-point grid; the law here uses every integer N
    assert float(steps["decode config, goodput per instance (req/s)"].split(", ")[1]) == (
        pytest.approx(g_d, rel=5e-3)
    )
    assert float(steps["PD goodput per GPU at scale (req/s)"]) == pytest.approx(pd_per_gpu, 5e-3)
    # the colocated bisection stops within its 2 % tolerance below μ
    assert o.value == pytest.approx(pd_per_gpu / mu, rel=0.03)


def test_decode_capacity_is_the_stability_limit_of_the_batch_law() -> None:
    """The decode capacity is the largest rate whose processor-sharing law of residents is
    stable (by hand: ``_ps_decode_rate``), below the Little's-law bound over every batch up
    to the slots — which a step-time jump (tile padding) below the slots makes larger than
    ``c/(E[o−1]·t(c))``; at a loose SLO the goodput is that capacity."""
    from perfmodel.pd.config import PhaseConfig, kv_link
    from perfmodel.pd.decode import decode_goodput, decode_profile
    from perfmodel.workload.lengths import LengthDistribution
    from perfmodel.workload.slo import SLO

    h100 = load_device("h100-sxm")
    lengths = LengthDistribution("fixed", np.array([1024]), np.array([128]), np.array([1.0]))
    pc, dc = (PhaseConfig(ph, h100, ParallelPlan(tp=1)) for ph in ("prefill", "decode"))
    prof = decode_profile(M8, dc, lengths, link=kv_link(pc, dc))
    at_slots = prof.slots / (127 * prof.step_at(prof.slots))
    n = prof.batch_grid[(prof.batch_grid > 0) & (prof.batch_grid <= prof.slots)]
    bound = float((n / (127 * np.interp(n, prof.batch_grid, prof.step_s))).max())
    assert bound > at_slots * 1.01
    inst = Instance(M8, h100, ParallelPlan(tp=1))
    cap = prof.capacity_rate_per_s
    assert cap == pytest.approx(_ps_decode_rate(inst, prof.slots, 127, 1024 + 63), rel=5e-3)
    assert cap < bound
    g = decode_goodput(prof, SLO(ttft_s=1e3, tpot_s=1e3))
    assert g.capacity_rate_per_s == cap
    assert g.rate_per_s <= cap and g.rate_per_s == pytest.approx(cap, rel=2e-3)


def test_dispatch_regime_comm_share_scales_with_the_link_by_hand(tmp_path: Path) -> None:
    """DeepSeek-V3 EP over 64 H100s at 128 tokens/GPU: each GPU sends 128·8·7168·2 B =
    14.7 MB for dispatch and again for combine over its 50 GB/s NIC (bandwidth-bound:
    ≥ 0.58 ms, ≫ the 5 µs latency). The share s = c/(c + b) fixes c/b; a NIC 100× slower
    multiplies c by 100 and leaves the expert block b alone, so s' = 100r/(100r + 1),
    r = s/(1 − s)."""
    txt = Path("hardware/catalog/h100-sxm.toml").read_text()
    slow = txt.replace(
        "bw_per_direction_bytes_per_s = 50e9", "bw_per_direction_bytes_per_s = 0.5e9"
    )
    assert slow != txt
    (tmp_path / "slow.toml").write_text(slow)

    def share(device: str, tokens: list[int], agg: str = "min") -> float:
        v = {"model": "deepseek-v3", "device": device, "num_gpus": 64, "tokens_per_gpu": tokens}
        v |= {"skew": 1.0, "field": "comm_share", "aggregate": agg, "samples": 1}
        return float(get_check("dispatch_regime")(Side(tmp_path, v, "test")).value)

    s = share("h100-sxm", [128])
    assert s > 0.5  # communication-dominated (the library's DeepSeek claim)
    r = s / (1 - s)
    assert share(str(tmp_path / "slow.toml"), [128]) == pytest.approx(
        100 * r / (100 * r + 1), abs=1e-3
    )
    # the aggregate over cells: two token counts, mean halfway between min and max
    lo, hi, mean = (share("h100-sxm", [16, 128], a) for a in ("min", "max", "mean"))
    assert lo < hi
    assert mean == pytest.approx((lo + hi) / 2)
