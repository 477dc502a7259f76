"""The colocated baseline's best-first search and its memo give the answer of running
every configuration's bisection to the end (the plain branch-and-bound's answer)."""

from __future__ import annotations

import pytest

from hardware.device import load_device
from perfmodel.errors import InfeasibleError, SpecError
from perfmodel.model import load_model
from perfmodel.serving.goodput import slo_attainment
from perfmodel.serving.search import max_rate
from perfmodel.serving.service import latency, service_rate
from perfmodel.step.instance import Instance
from perfmodel.workload.lengths import fixed_lengths
from perfmodel.workload.presets import Workload
from perfmodel.workload.slo import SLO
from solvers.pd.colocated import ColocatedMemo, colocated_baseline
from solvers.pd.enumerate import parallel_plan, valid_tps

MODEL = load_model("llama-3.1-8b")
H100 = load_device("h100-sxm")
WORK = Workload("fixed-2048-256", fixed_lengths(2048, 256))


def exhaustive(slo: SLO) -> tuple[int, float]:
    """(TP, goodput) of the best per-GPU configuration: every bisection run to the end."""
    best = (0, 0.0)
    for tp in valid_tps(MODEL):
        try:
            sv = service_rate(
                Instance(MODEL, H100, parallel_plan(tp, "bf16", "bf16")), WORK,
                max_batched_tokens=2048,
            )  # fmt: skip
        except (InfeasibleError, SpecError):
            continue
        if not sv.largest_request_fits:
            continue

        def ok(r: float, sv=sv) -> bool:  # type: ignore[no-untyped-def]
            return slo_attainment(latency(sv, r), slo).meets_percentiles

        lo_rate = sv.rate_per_s * 1e-3
        if not ok(lo_rate):
            continue
        lo = max_rate(ok, sv.rate_per_s, lo=lo_rate, rel_tol=0.02)
        if lo / tp > best[1] / max(best[0], 1):
            best = (tp, lo)
    return best


@pytest.mark.parametrize("ttft_s,tpot_s", [(0.5, 0.05), (0.15, 0.012), (2.0, 0.2)])
def test_best_first_equals_exhaustive(ttft_s: float, tpot_s: float) -> None:
    slo = SLO(ttft_s, tpot_s, percentile=0.9)
    tp, rate = exhaustive(slo)
    got = colocated_baseline(MODEL, WORK, slo, devices=[H100])
    assert got.feasible == (tp > 0)
    if tp:
        assert (got.tp, got.goodput_per_instance_per_s) == (tp, rate)


def test_memo_shared_across_slos_same_answers() -> None:
    memo = ColocatedMemo()
    for ttft_s, tpot_s in [(2.0, 0.2), (0.5, 0.05), (0.5, 0.02), (0.15, 0.012)]:
        slo = SLO(ttft_s, tpot_s, percentile=0.9)
        fresh = colocated_baseline(MODEL, WORK, slo, devices=[H100])
        shared = colocated_baseline(MODEL, WORK, slo, devices=[H100], memo=memo)
        assert shared == fresh


def test_hints_move_estimates_not_answers() -> None:
    """Hints from another workload (far off) and from the same one give the answer of no
    hints; the same workload's hints need fewer latency estimates."""
    slo = SLO(0.5, 0.05, percentile=0.9)
    plain = colocated_baseline(MODEL, WORK, slo, devices=[H100])
    far: dict[tuple[str, int], float] = {}
    colocated_baseline(MODEL, Workload("f-128-1024", fixed_lengths(128, 1024)), slo,
                       devices=[H100], hints=far)  # fmt: skip
    assert colocated_baseline(MODEL, WORK, slo, devices=[H100], hints=far) == plain
    own: dict[tuple[str, int], float] = {}
    colocated_baseline(MODEL, WORK, slo, devices=[H100], hints=own)
    memo_a, memo_b = ColocatedMemo(), ColocatedMemo()
    assert colocated_baseline(MODEL, WORK, slo, devices=[H100], memo=memo_a, hints=own) == plain
    colocated_baseline(MODEL, WORK, slo, devices=[H100], memo=memo_b)
    count = [sum(map(len, m.estimates.values())) for m in (memo_a, memo_b)]
    assert count[0] < count[1]


@pytest.mark.slow  # about 15 s on an idle machine
def test_slo_sweep_cells_equal_independent_cells() -> None:
    """The sweep shares its phase profiles and colocated estimates across cells; each cell
    equals the one computed alone (fresh memos: the per-cell computation of before)."""
    from perfmodel.workload.lengths import lognormal_lengths
    from perfmodel.workload.presets import PRESETS
    from reports.pd_plot import _cell, slo_sweep

    small = Workload("chat-12", lognormal_lengths(*PRESETS["chat"], name="chat-12", n=12))
    ttft, tpot = [0.25, 1.0], [0.02, 0.08]
    sweep = slo_sweep(MODEL, [H100], small, ttft_s=ttft, tpot_s=tpot, percentile=0.9)
    for c in sweep.cells:
        alone = _cell(
            MODEL, [H100], [H100], small, SLO(c.x, c.y, percentile=0.9), c.x, c.y, "bf16", "bf16"
        )
        assert alone == c
    assert {c.regime for c in sweep.cells} >= {"disaggregated", "colocated"}


def test_a_ttft_miss_decides_its_rate_without_the_tpot_law() -> None:
    """At 0.9 μ the p90 TTFT of 2048-token prompts misses 100 ms: the search's verdict
    there is False without the TPOT law computed (its variance is a chain product per
    lag), the same verdict as the full attainment; an estimate pickled before its TPOT
    law was read gives the same TPOT quantile, to the bit, once read."""
    import pickle

    from solvers.pd.colocated import _Meets

    sv = service_rate(
        Instance(MODEL, H100, parallel_plan(1, "bf16", "bf16")), WORK, max_batched_tokens=2048
    )
    slo = SLO(0.1, 0.05, percentile=0.9)
    rate = 0.9 * sv.rate_per_s
    cache: dict = {}
    meets = _Meets(sv, slo, cache, {})
    assert meets(rate) is False
    est = cache[rate]
    assert est.ttft_quantile_s(0.9) > slo.ttft_s
    assert "_tpot" not in est.__dict__  # not read
    copy = pickle.loads(pickle.dumps(est))
    a = slo_attainment(est, slo)
    assert not (a.ttft_quantile_s <= slo.ttft_s and a.tpot_quantile_s <= slo.tpot_s)
    assert "_tpot" in est.__dict__
    assert copy.tpot_quantile_s(0.9) == est.tpot_quantile_s(0.9)
    assert copy.tpot_mean_s == est.tpot_mean_s == latency(sv, rate).tpot_mean_s


def test_a_converged_hint_is_its_last_bracket_middle() -> None:
    """The winner's hint is the middle of its bisection's last bracket ``[lo, hi]``
    (``hi − lo ≤ 2 %`` of ``hi``): above the goodput ``lo``, by at most 1 % of ``hi``."""
    slo = SLO(0.5, 0.05, percentile=0.9)
    hints: dict[tuple[str, int], float] = {}
    memo = ColocatedMemo()
    got = colocated_baseline(MODEL, WORK, slo, devices=[H100], memo=memo, hints=hints)
    sv = memo.services[H100.id, got.tp]
    assert sv is not None
    lo, mid = got.goodput_per_instance_per_s, hints[H100.id, got.tp] * sv.rate_per_s
    hi_max = lo / (1 - 0.02)
    assert lo < mid <= (lo + hi_max) / 2 * (1 + 1e-12)


@pytest.mark.parametrize("plain_after", [1, 2, 100])
def test_plain_bisection_threshold_moves_estimates_not_answers(
    plain_after: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any number of undecisive predictions before plain bisection gives the same answer,
    with hints far off (another workload's) or none."""
    import solvers.pd.colocated as colocated

    slo = SLO(0.5, 0.05, percentile=0.9)
    far: dict[tuple[str, int], float] = {}
    colocated_baseline(MODEL, Workload("f-128-1024", fixed_lengths(128, 1024)), slo,
                       devices=[H100], hints=far)  # fmt: skip
    plain = colocated_baseline(MODEL, WORK, slo, devices=[H100])
    monkeypatch.setattr(colocated, "PLAIN_AFTER", plain_after)
    assert colocated_baseline(MODEL, WORK, slo, devices=[H100]) == plain
    assert colocated_baseline(MODEL, WORK, slo, devices=[H100], hints=dict(far)) == plain
