"""PD planner: MILP vs brute force, errors, ratio direction, phase diagram, CLI."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from cli.main import app
from hardware.device import Link, load_device
from perfmodel.errors import InfeasibleError
from perfmodel.model import load_model
from perfmodel.parallel import ParallelPlan
from perfmodel.pd_models import PhaseConfig, PhaseGoodput, planner_lengths
from perfmodel.workload import SLO, Workload, fixed_lengths
from solvers.pd_plan import PhaseOptions, _solve, evaluate_options, fluid_optimum, plan_pd

A100 = load_device("a100-sxm-80gb")
OPT = load_model("opt-13b")


def _good(phase: str, tp: int, rate: float, link: float = 1e9) -> PhaseGoodput:
    cfg = PhaseConfig(phase, A100, ParallelPlan(tp))
    return PhaseGoodput(cfg, True, rate, rate / tp, rate * 2, link, "x", 0.0, 0.0, 1, "")


@settings(max_examples=30)
@given(
    st.lists(st.floats(0.5, 20), min_size=2, max_size=2),
    st.lists(st.floats(0.5, 20), min_size=2, max_size=2),
    st.floats(1, 40),
)
def test_milp_matches_brute_force(gp: list[float], gd: list[float], rate: float) -> None:
    cls = ("a100-sxm-80gb", 1)
    pre = [_good("prefill", 1, gp[0]), _good("prefill", 2, gp[1])]
    dec = [_good("decode", 1, gd[0]), _good("decode", 2, gd[1])]
    opts = PhaseOptions({cls: pre}, {cls: dec}, {cls: "x"}, {})
    sol, _, status = _solve(opts, rate, max_gpus=None, prices=None, time_limit_s=10)
    assert status == "optimal"
    cost = sum(v * (1 if k[2] == 0 else 2) for k, v in sol.items())

    def cheapest(g: list[float]) -> int:  # brute force over the TP2 count
        return min(
            2 * b + max(0, math.ceil((rate - b * g[1]) / g[0] - 1e-9))
            for b in range(0, math.ceil(rate / g[1]) + 1)
        )

    best = cheapest(gp) + cheapest(gd)
    assert cost == best


def test_plan_meets_rate_and_reports_slack() -> None:
    w = Workload("sharegpt", planner_lengths("sharegpt", 32))
    p = plan_pd(
        OPT,
        w,
        SLO(0.2, 0.1),
        20.0,
        prefill_devices=[A100],
        dtype="fp16",
        kv_dtype="fp16",
        baseline=False,
    )
    assert p.capacity_rate_per_s >= 20.0
    assert p.gpus == sum(a.gpus for a in (*p.prefill, *p.decode))
    assert sum(c.binding for c in p.constraints) == 1
    b = next(c for c in p.constraints if c.binding)
    assert b.slack == min(c.slack for c in p.constraints)
    assert p.ratio == p.prefill_instances / p.decode_instances


def test_gpu_limit_error_names_the_need() -> None:
    w = Workload("sharegpt", planner_lengths("sharegpt", 16))
    with pytest.raises(InfeasibleError, match=r"gpu_limit.*needs \d+ GPUs"):
        plan_pd(
            OPT,
            w,
            SLO(0.2, 0.1),
            20.0,
            prefill_devices=[A100],
            dtype="fp16",
            kv_dtype="fp16",
            max_gpus=2,
            baseline=False,
        )


def test_slo_below_floor_says_the_floor() -> None:
    w = Workload("sharegpt", planner_lengths("sharegpt", 16))
    with pytest.raises(InfeasibleError, match=r"below the unloaded p90 TTFT floor of [\d.]+ ms"):
        plan_pd(OPT, w, SLO(0.01, 0.1), 5.0, prefill_devices=[A100], baseline=False)
    with pytest.raises(InfeasibleError, match=r"below the unloaded p90 TPOT floor of [\d.]+ ms"):
        plan_pd(OPT, w, SLO(0.5, 0.001), 5.0, prefill_devices=[A100], baseline=False)


def test_model_fitting_nothing() -> None:
    w = Workload("chat", planner_lengths("chat", 8))
    with pytest.raises(InfeasibleError, match="fits no prefill configuration"):
        plan_pd(
            load_model("llama-3.1-405b"),
            w,
            SLO(1, 0.1),
            1.0,
            prefill_devices=[load_device("l40s")],
            baseline=False,
        )


def test_slow_link_is_the_binding_constraint() -> None:
    # a 0.5 GB/s NIC: the KV of a 2000-token OPT prompt (1.6 GB) takes seconds
    slow = dataclasses.replace(A100, scale_out=Link("slow NIC", 0.5e9, 5e-6))
    w = Workload("fixed", fixed_lengths(2000, 200))
    p = plan_pd(
        OPT,
        w,
        SLO(8.0, 0.1),
        2.0,
        prefill_devices=[slow],
        placement="scale-out",
        dtype="fp16",
        kv_dtype="fp16",
        baseline=False,
    )
    assert p.binding == "kv_link_egress"
    assert all(a.limiter == "kv-link" for a in p.prefill)
    with pytest.raises(
        InfeasibleError, match=r"KV link is too slow \(binding constraint: kv-link\)"
    ):
        plan_pd(
            OPT,
            w,
            SLO(0.3, 0.1),
            2.0,
            prefill_devices=[slow],
            placement="scale-out",
            dtype="fp16",
            kv_dtype="fp16",
            baseline=False,
        )


def _gpu_ratio(s: int, o: int, slo: SLO) -> float:
    opts = evaluate_options(
        OPT,
        fixed_lengths(s, o),
        slo,
        prefill_devices=[A100],
        decode_devices=[A100],
        dtype="fp16",
        kv_dtype="fp16",
        tp_candidates=(1, 2),
    )
    return fluid_optimum(opts).gpu_ratio


@settings(max_examples=8)
@given(st.integers(256, 1024), st.floats(1.2, 3.0), st.integers(16, 400))
def test_ratio_moves_toward_prefill_for_long_inputs(s: int, k: float, o: int) -> None:
    """Longer prompts need more prefill GPUs per decode GPU; longer outputs, fewer.

    Prompts start at 256 tokens: prompts are not batched, so below the roofline ridge
    (~150 tokens for fp16 on A100) a prefill costs one weight read whatever its length
    and the ratio can move the other way.
    """
    slo = SLO(1.5, 0.1)
    assert _gpu_ratio(int(s * k), o, slo) >= _gpu_ratio(s, o, slo) * (1 - 1e-6)
    assert _gpu_ratio(s, int(o * k), slo) <= _gpu_ratio(s, o, slo) * (1 + 1e-6)


def test_cli_plan_json_and_errors(tmp_path: object) -> None:
    r = CliRunner().invoke(
        app,
        [
            "pd",
            "plan",
            "--model",
            "opt-13b",
            "--hardware",
            "a100-sxm-80gb",
            "--workload",
            "sharegpt",
            "--rate-per-s",
            "10",
            "--ttft-slo-ms",
            "200",
            "--tpot-slo-ms",
            "100",
            "--no-baseline",
            "--json",
        ],
    )
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["capacity_rate_per_s"] >= 10 and d["binding"] in {c["name"] for c in d["constraints"]}
    r = CliRunner().invoke(
        app,
        [
            "pd",
            "plan",
            "--model",
            "opt-13b",
            "--hardware",
            "a100-sxm-80gb",
            "--workload",
            "chat",
            "--trace",
            "x.csv",
        ],
    )
    assert r.exit_code == 2 and "exactly one of --workload" in r.output
    r = CliRunner().invoke(
        app,
        [
            "pd",
            "plan",
            "--model",
            "opt-13b",
            "--hardware",
            "a100-sxm-80gb",
            "--workload",
            "sharegpt",
            "--ttft-slo-ms",
            "5",
            "--no-baseline",
        ],
    )
    assert r.exit_code == 2 and "floor" in r.output and "Traceback" not in r.output


def test_slo_sweep_tight_tpot_favours_disaggregation() -> None:
    """OPT-13B/A100, ShareGPT stand-in, TTFT 800 ms: at TPOT 25 ms disaggregation wins,
    at a loose 400 ms colocated chunked prefill wins (the cells also carry the ratio)."""
    from reports.pd_plot import slo_sweep

    w = Workload("sharegpt", planner_lengths("sharegpt", 32))
    d = slo_sweep(OPT, [A100], w, ttft_s=[0.8], tpot_s=[0.025, 0.4], dtype="fp16", kv_dtype="fp16")
    tight, loose = d.cell(0.8, 0.025), d.cell(0.8, 0.4)
    for c in (tight, loose):
        assert c.gain == pytest.approx(c.disagg_per_gpu / c.colocated_per_gpu)
        assert c.gpu_ratio is not None and c.gpu_ratio > 0
    assert tight.regime == "disaggregated" and tight.gain is not None and tight.gain > 1
    assert loose.regime == "colocated" and loose.gain is not None and loose.gain < 1
