"""Per-phase PD instance models: KV transfer, M/G/1 tail, prefill and decode goodput."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hardware.device import load_device
from hardware.maxaffine import MaxAffine
from perfmodel.errors import SpecError
from perfmodel.model import load_model
from perfmodel.pd.models import (
    PhaseConfig,
    decode_goodput,
    decode_profile,
    kv_link,
    kv_transfer_time_s,
    mg1_wait_tail,
    planner_lengths,
    prefill_batch_tokens,
    prefill_goodput,
    prefill_profile,
)
from perfmodel.pd.simulate import Deployment, Pool, run_at_rate, sample_requests
from perfmodel.plan import ParallelPlan
from perfmodel.workload.lengths import TruncLogNormal, fixed_lengths, lognormal_lengths
from perfmodel.workload.slo import SLO

A100 = load_device("a100-sxm-80gb")
OPT = load_model("opt-13b")


def _cfg(phase: str, tp: int) -> PhaseConfig:
    return PhaseConfig(phase, A100, ParallelPlan(tp, "fp16", "fp16", "fp16"))


def test_kv_transfer_hand_derived() -> None:
    # OPT-13B KV: 2 (K,V) · 40 layers · 5120 · 2 B = 819,200 B/token; 755 tokens on TP1 ->
    # 618.5 MB over NVLink 3 (300 GB/s per direction, 70 % efficiency, 5 us launch + the
    # link's 1.045 us latency, a100-sxm-80gb.toml): 5 + 2945.22 + 1.045 = 2951.26 us
    p, d = _cfg("prefill", 1), _cfg("decode", 1)
    link = kv_link(p, d)
    assert link.kind == "scale-up"
    t = float(kv_transfer_time_s(OPT, np.array([755.0]), prefill=p, decode=d, link=link)[0])
    assert t == pytest.approx(5e-6 + 755 * 819_200 / (0.7 * 300e9) + 1.045e-6, rel=1e-9)
    assert t == pytest.approx(2951.26e-6, rel=1e-5)
    # TP2 sender, TP1 receiver: the receiver holds all 618.5 MB -> same time
    p2 = _cfg("prefill", 2)
    t2 = kv_transfer_time_s(OPT, np.array([755.0]), prefill=p2, decode=d, link=kv_link(p2, d))
    assert float(t2[0]) == pytest.approx(t, rel=1e-9)
    # TP4 -> TP8 cannot share an 8-GPU NVLink domain: InfiniBand HDR, 25 GB/s per GPU;
    # each decode rank receives 755 · 819,200 / 8 B
    p4, d8 = _cfg("prefill", 4), _cfg("decode", 8)
    lk = kv_link(p4, d8)
    assert lk.kind == "scale-out"
    t3 = kv_transfer_time_s(OPT, np.array([755.0]), prefill=p4, decode=d8, link=lk)
    send = 755 * 819_200 / 4
    assert float(t3[0]) == pytest.approx(5e-6 + send / (0.7 * 25e9) + 5e-6, rel=1e-9)


def test_mg1_tail_exact_for_mm1() -> None:
    # exponential service (fine quantile atoms): gamma = mu - lambda, C = rho
    u = (np.arange(4000) + 0.5) / 4000
    s = -np.log(1 - u) * 0.1  # mean 0.1 s
    w = np.full(s.size, 1 / s.size)
    rho, c, g = mg1_wait_tail(6.0, s, w)
    assert rho == pytest.approx(0.6, rel=1e-3)
    assert g == pytest.approx(10.0 - 6.0, rel=0.03)
    assert c == pytest.approx(0.6, rel=0.03)


def test_mg1_decay_rate_solves_lundberg_equation() -> None:
    """γ (Newton from above) is the positive root of λ(E[e^{γS}] − 1) = γ, as scipy's brentq
    finds it, for mixed service times at low and high load; and M/D/1 by hand: γ solves
    λ(e^{γd} − 1) = γ, at ρ = 0.5, d = 1: γ ≈ 1.2564312086261697."""
    from scipy.optimize import brentq

    def lundberg(x: float, lam: float, s: np.ndarray, w: np.ndarray) -> float:
        return lam * (float(w @ np.exp(x * s)) - 1.0) - x

    rng = np.random.default_rng(7)
    for rho in (0.05, 0.5, 0.95, 0.999):
        s = rng.lognormal(-3.0, 1.2, 17)
        w = rng.random(17)
        w /= w.sum()
        lam = rho / float(w @ s)
        _, _, g = mg1_wait_tail(lam, s, w)
        root = brentq(lundberg, 1e-9, 50 * g, args=(lam, s, w))
        assert g == pytest.approx(root, rel=1e-9)
    _, _, g = mg1_wait_tail(0.5, np.array([1.0]), np.array([1.0]))
    assert 0.5 * (math.exp(g) - 1) == pytest.approx(g, rel=1e-12)
    assert g == pytest.approx(1.2564312086261697, rel=1e-9)


def test_md1_quantile_against_fcfs_simulation() -> None:
    """The prefill TTFT quantile (Cramér–Lundberg) vs an exact FCFS simulation (M/D/1)."""
    p = prefill_profile(OPT, _cfg("prefill", 2), fixed_lengths(755, 100), decode=_cfg("decode", 1))
    d = float(p.prefill_s[0] + p.transfer_s[0])
    svc = float(p.service_s[0])
    rng = np.random.default_rng(3)
    for rho in (0.5, 0.8):
        lam = rho / svc
        arr = np.cumsum(rng.exponential(1 / lam, 200_000))
        free = 0.0
        ttft = np.empty(arr.size)
        for i, a in enumerate(arr):
            start = max(free, a)
            free = start + svc
            ttft[i] = start - a + d
        sim = float(np.quantile(ttft[20_000:], 0.9))
        assert p.ttft_quantile_s(lam, 0.9) == pytest.approx(sim, rel=0.05)


def test_tp_speedup_has_communication_cost() -> None:
    """DistServe eq. 3 premise: 1 < K < 2 for 2-way TP prefill (all-reduces included)."""
    s = fixed_lengths(512, 2)
    d1 = prefill_profile(OPT, _cfg("prefill", 1), s, decode=_cfg("decode", 1)).prefill_s[0]
    d2 = prefill_profile(OPT, _cfg("prefill", 2), s, decode=_cfg("decode", 1)).prefill_s[0]
    assert 1.0 < d1 / d2 < 2.0


@given(st.floats(0.12, 0.6), st.floats(0.6, 1.0))
def test_prefill_goodput_monotone_in_ttft(a: float, f: float) -> None:
    p = prefill_profile(
        OPT, _cfg("prefill", 2), planner_lengths("sharegpt", 16), decode=_cfg("decode", 1)
    )
    tight = prefill_goodput(p, SLO(a * f, 0.1), model=OPT)
    loose = prefill_goodput(p, SLO(a, 0.1), model=OPT)
    assert tight.rate_per_s <= loose.rate_per_s + 1e-9
    assert loose.rate_per_s < p.capacity_rate_per_s
    if not tight.feasible:
        assert tight.floor_s > a * f


def test_prefill_floor_is_unloaded_quantile() -> None:
    p = prefill_profile(OPT, _cfg("prefill", 1), fixed_lengths(1000, 10), decode=_cfg("decode", 1))
    unloaded = float(p.prefill_s[0] + p.transfer_s[0])
    g = prefill_goodput(p, SLO(unloaded * 0.99, 0.1), model=OPT)
    assert not g.feasible and g.floor_s == pytest.approx(unloaded)
    assert "unloaded p90 TTFT" in g.note
    assert prefill_goodput(p, SLO(unloaded * 1.5, 0.1), model=OPT).feasible


def test_decode_goodput_checked_by_simulation() -> None:
    """Decode TP1 (KV-memory bound): meets p90 TPOT at 0.9x its goodput, not at 1.15x."""
    lengths = planner_lengths("sharegpt", 32)
    pre, dec = _cfg("prefill", 4), _cfg("decode", 1)
    link = kv_link(pre, dec)
    g = decode_goodput(decode_profile(OPT, dec, lengths, link=link), SLO(0.2, 0.06))
    assert g.feasible and g.limiter in ("kv-memory", "tpot")
    dep = Deployment(OPT, (Pool(pre, 1, 30.0),), (Pool(dec, 1, g.rate_per_s),))
    req = sample_requests(lengths, 2500, seed=11)
    slo = SLO(10.0, 0.06)  # TTFT generous: this checks the decode side
    assert run_at_rate(dep, lengths, req, 0.9 * g.rate_per_s).meets(slo)
    assert not run_at_rate(dep, lengths, req, 1.15 * g.rate_per_s).meets(slo)


def test_decode_floor_and_kv_capacity() -> None:
    lengths = planner_lengths("sharegpt", 16)
    dec = _cfg("decode", 1)
    prof = decode_profile(OPT, dec, lengths, link=kv_link(_cfg("prefill", 1), dec))
    # OPT-13B fp16 on one A100-80GB: (0.9·80 GiB − 25.7 GB weights − reserve)/819,200 B
    assert 55_000 < prof.kv_capacity_tokens < 70_000
    # slots = M over the time-average reservation E[(s + o)(o − 1)]/E[o − 1] = 1,021.8
    # tokens on these lengths (E[s + o] = 955.25: long outputs hold their KV longest)
    assert prof.slots == pytest.approx(prof.kv_capacity_tokens / 1021.8, rel=0.01)
    g = decode_goodput(prof, SLO(0.2, 0.010))
    assert not g.feasible and g.floor_s > 0.010 and math.isfinite(g.floor_s)


def test_prompt_batching_checked_by_simulation() -> None:
    """Prompts below L_m (92 tokens for OPT-13B fp16 TP1 on the roofline) are batched;
    the prefill TTFT goodput with batching meets p90 TTFT 60 ms in simulation at 0.85x
    and misses it at 1.25x, and exceeds the goodput of one-prompt-at-a-time service."""
    lengths = lognormal_lengths(
        TruncLogNormal(4.0, 0.8, 4, 1024), TruncLogNormal(1.0, 0.1, 2, 4), name="short", n=64
    )
    pre = _cfg("prefill", 1)
    p = prefill_profile(OPT, pre, lengths, decode=_cfg("decode", 1))
    assert p.batch_tokens == prefill_batch_tokens(OPT, pre) == 92
    slo = SLO(0.06, 1.0)
    g = prefill_goodput(p, slo, model=OPT)
    # without batching every prompt occupies the server for D(s): capacity 1/E[D]
    assert p.capacity_rate_per_s > 1.3 / float(np.dot(p.weights, p.alone_s))
    dep = Deployment(OPT, (Pool(pre, 1, 1.0),), (Pool(_cfg("decode", 4), 1, 1.0),))
    req = sample_requests(lengths, 4000, seed=2)
    assert run_at_rate(dep, lengths, req, 0.85 * g.rate_per_s).quantiles_s(0.9)[0] <= 0.06
    assert run_at_rate(dep, lengths, req, 1.25 * g.rate_per_s).quantiles_s(0.9)[0] > 0.06


def test_calibrated_profile_replaces_the_roofline() -> None:
    """A one-piece quadratic prefill profile gives exactly a + b·s + c·s² per prompt."""
    prof = MaxAffine(
        ("prefill_tokens", "prefill_tokens_sq"), np.array([0.01]), np.array([[1e-4, 1e-8]])
    )
    pre = PhaseConfig("prefill", A100, ParallelPlan(2, "fp16", "fp16", "fp16"), profile=prof)
    p = prefill_profile(OPT, pre, fixed_lengths(500, 10), decode=_cfg("decode", 1))
    assert p.alone_s[0] == pytest.approx(0.01 + 1e-4 * 500 + 1e-8 * 500**2)
    # a/b = 100: the fixed cost equals the per-token cost (on a 5 % geometric grid)
    assert p.batch_tokens == pytest.approx(100, rel=0.05)
    with pytest.raises(SpecError, match=r"unknown; a (prefill|decode) profile uses"):
        PhaseConfig(
            "prefill",
            A100,
            ParallelPlan(1),
            profile=MaxAffine(("flop",), np.array([0.0]), np.array([[1e-15]])),
        )
