"""``pd phase`` sweeps share work across cells (phase options by prompt law, colocated
estimates by workload); every cell equals the same cell computed alone."""

from __future__ import annotations

import pytest

from hardware.device import load_device
from perfmodel.errors import SpecError
from perfmodel.model import load_model
from perfmodel.workload.lengths import fixed_lengths
from perfmodel.workload.presets import Workload
from perfmodel.workload.slo import SLO
from reports.pd_plot import _cell, length_sweep
from solvers.pd.enumerate import evaluate_options

MODEL = load_model("llama-3.1-8b")
H100 = load_device("h100-sxm")
SLO_ = SLO(0.5, 0.05, percentile=0.9)


def test_options_memo_keyed_by_the_lengths_it_depends_on() -> None:
    """One memo serves two workloads with the same prompts: the prefill entries are
    shared, the decode ones are not (they depend on the outputs), and each call's
    options equal those of a fresh memo."""
    memo: dict = {}  # type: ignore[type-arg]
    kw = {"prefill_devices": [H100], "decode_devices": [H100]}
    a = evaluate_options(MODEL, fixed_lengths(512, 32), SLO_, memo=memo, **kw)  # type: ignore[arg-type]
    n_prefill = sum(k[0] == "prefill" for k in memo)
    n_decode = sum(k[0] == "decode" for k in memo)
    b = evaluate_options(MODEL, fixed_lengths(512, 256), SLO_, memo=memo, **kw)  # type: ignore[arg-type]
    assert sum(k[0] == "prefill" for k in memo) == n_prefill  # reused
    assert sum(k[0] == "decode" for k in memo) == 2 * n_decode  # one set per output length
    for got, lengths in ((a, fixed_lengths(512, 32)), (b, fixed_lengths(512, 256))):
        fresh = evaluate_options(MODEL, lengths, SLO_, **kw)  # type: ignore[arg-type]
        assert got.prefill == fresh.prefill and got.decode == fresh.decode
    assert a.decode != b.decode


def test_prefill_goodput_searched_once_per_transfer(monkeypatch: pytest.MonkeyPatch) -> None:
    """A prefill goodput depends on the decode class only through the KV transfer: one
    search per (prefill configuration, transfer times, link), and every class's goodput
    equals the search on its own profile."""
    import solvers.pd.enumerate as en
    from perfmodel.pd.prefill import prefill_goodput

    calls: list[object] = []

    def counted(profile, slo, *, model):  # type: ignore[no-untyped-def]
        calls.append(profile)
        return prefill_goodput(profile, slo, model=model)

    monkeypatch.setattr(en, "prefill_goodput", counted)
    lengths = fixed_lengths(512, 128)
    kw = {"prefill_devices": [H100], "decode_devices": [H100, load_device("a100-sxm-80gb")]}
    memo: dict = {}  # type: ignore[type-arg]
    opts = evaluate_options(MODEL, lengths, SLO_, memo=memo, **kw)  # type: ignore[arg-type]
    po = en.profile_options(MODEL, lengths, memo=memo, **kw)  # type: ignore[arg-type]
    profiles = [p for v in po.prefill.values() for _, p in v]
    distinct = {(p.config.plan.tp, p.transfer_s.tobytes(), repr(p.link)) for p in profiles}
    assert len(calls) == len(distinct) < len(profiles)  # decode TPs share transfers
    for cls, entries in po.prefill.items():
        for (_, p), got in zip(entries, opts.prefill[cls], strict=True):
            assert got == prefill_goodput(p, SLO_, model=MODEL)


def test_phase_quantile_at_goodput_computed_when_read() -> None:
    """The percentile latency at a phase's goodput is not searched until it is read;
    read, it is the profile's own quantile there."""
    import solvers.pd.enumerate as en

    lengths = fixed_lengths(512, 128)
    kw = {"prefill_devices": [H100], "decode_devices": [H100]}
    memo: dict = {}  # type: ignore[type-arg]
    opts = evaluate_options(MODEL, lengths, SLO_, memo=memo, **kw)  # type: ignore[arg-type]
    po = en.profile_options(MODEL, lengths, memo=memo, **kw)  # type: ignore[arg-type]
    ((cls, entries),) = list(po.prefill.items())[:1]
    got, (_, prof) = opts.prefill[cls][0], entries[0]
    assert got.feasible and "quantile_at_goodput_s" not in vars(got)
    assert got.quantile_at_goodput_s == prof.ttft_quantile_s(got.rate_per_s, SLO_.percentile)
    dec = next(g for gs in opts.decode.values() for g in gs if g.feasible)
    assert "quantile_at_goodput_s" not in vars(dec)
    assert 0 < dec.quantile_at_goodput_s <= SLO_.tpot_s


@pytest.mark.slow  # about 10 s on an idle machine
def test_length_sweep_cells_equal_cells_alone() -> None:
    sweep = length_sweep(MODEL, [H100], SLO_, inputs=[128, 512], outputs=[32, 256])
    for c in sweep.cells:
        w = Workload(f"fixed-{c.x:g}-{c.y:g}", fixed_lengths(int(c.x), int(c.y)))
        assert _cell(MODEL, [H100], [H100], w, SLO_, c.x, c.y, "bf16", "bf16") == c


@pytest.mark.slow  # about 10 s on an idle machine
def test_phase_sweeps_in_two_processes_equal_the_serial_sweeps() -> None:
    from reports.pd_phase_run import phase_sweeps

    chat = Workload("fixed-512-128", fixed_lengths(512, 128))
    kw = {"inputs": [512, 128], "outputs": [32, 128], "slo_scales": [1.0, 2.0]}
    ticks: list[int] = []
    two = phase_sweeps(MODEL, [H100], SLO_, chat, workers=2, progress=ticks.append, **kw)  # type: ignore[arg-type]
    one = phase_sweeps(MODEL, [H100], SLO_, chat, workers=1, **kw)  # type: ignore[arg-type]
    assert two == one
    assert sorted(ticks) == [2, 2, 4]  # a row of 2 cells each, the SLO grid of 4
    assert two.lengths.xs == (512.0, 128.0)  # the rows in the order asked for
    assert [c.x for c in two.lengths.cells] == [512, 512, 128, 128]


@pytest.mark.slow  # a LocalCluster's start and its workers' imports: seconds
def test_phase_sweeps_on_a_local_dask_cluster_equal_the_serial_sweeps() -> None:
    """The rows and the SLO job on a 2-process LocalCluster (the path of a remote
    scheduler too): every cell the serial sweep's, the progress in the same units, and
    the serial run asked for by ``scheduler="serial"``."""
    pytest.importorskip("dask.distributed")
    from reports.pd_phase_run import phase_sweeps

    chat = Workload("fixed-512-128", fixed_lengths(512, 128))
    kw = {"inputs": [512, 128], "outputs": [32, 128], "slo_scales": [1.0, 2.0]}
    ticks: list[int] = []
    dask = phase_sweeps(
        MODEL, [H100], SLO_, chat, scheduler="local", workers=2, progress=ticks.append, **kw
    )  # type: ignore[arg-type]
    serial = phase_sweeps(MODEL, [H100], SLO_, chat, scheduler="serial", **kw)  # type: ignore[arg-type]
    assert dask == serial
    assert sorted(ticks) == [2, 2, 4]
    with pytest.raises(SpecError, match="--scheduler must be serial, local or tcp://host:port"):
        phase_sweeps(MODEL, [H100], SLO_, chat, scheduler="yarn", **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("s", "o", "ttft_s", "tpot_s"),
    [(512, 128, 0.5, 0.05), (8192, 32, 0.5, 0.05), (2048, 512, 2.0, 0.015), (128, 2048, 0.1, 0.2)],
)
def test_fluid_best_is_the_fluid_optimum_with_fewer_goodputs(
    s: int, o: int, ttft_s: float, tpot_s: float
) -> None:
    from solvers.pd.enumerate import profile_options
    from solvers.pd.fluid import fluid_best, fluid_optimum

    slo = SLO(ttft_s, tpot_s, percentile=0.9)
    kw = {"prefill_devices": [H100], "decode_devices": [H100]}
    lengths = fixed_lengths(s, o)
    full = fluid_optimum(evaluate_options(MODEL, lengths, slo, **kw))  # type: ignore[arg-type]
    memo: dict = {}  # type: ignore[type-arg]
    best = fluid_best(profile_options(MODEL, lengths, memo=memo, **kw), slo, model=MODEL, memo=memo)  # type: ignore[arg-type]
    assert best == full
    computed = sum(k[0].endswith("-goodput") for k in memo)
    assert computed < 4 + 16  # of every decode class and every prefill x decode pair


def test_fluid_best_raises_as_the_fluid_optimum_when_no_pair_meets_the_slos() -> None:
    from perfmodel.errors import InfeasibleError
    from solvers.pd.enumerate import profile_options
    from solvers.pd.fluid import fluid_best, fluid_optimum

    slo = SLO(0.5, 0.001, percentile=0.9)  # TPOT below any decode step
    kw = {"prefill_devices": [H100], "decode_devices": [H100]}
    with pytest.raises(InfeasibleError) as full:
        fluid_optimum(evaluate_options(MODEL, fixed_lengths(512, 128), slo, **kw))  # type: ignore[arg-type]
    memo: dict = {}  # type: ignore[type-arg]
    po = profile_options(MODEL, fixed_lengths(512, 128), memo=memo, **kw)  # type: ignore[arg-type]
    with pytest.raises(InfeasibleError) as best:
        fluid_best(po, slo, model=MODEL, memo=memo)
    assert str(best.value) == str(full.value)


def test_row_hints_follow_the_trend() -> None:
    """The next cell's hint moves on by the row's last step, clipped to [10⁻³, 1]; a row's
    first cell takes a copy of the cell above's; a configuration seen once keeps its hint."""
    from reports.pd_plot import _next_hints

    a, b = ("h100-sxm", 1), ("h100-sxm", 2)
    assert _next_hints({a: 0.62, b: 0.99}, {a: 0.60, b: 0.90}, None) == pytest.approx(
        {a: 0.64, b: 1.0}
    )
    assert _next_hints({a: 0.01}, {a: 0.2}, None) == {a: 1e-3}
    assert _next_hints({a: 0.5, b: 0.7}, {a: 0.4}, None) == pytest.approx({a: 0.6, b: 0.7})
    above = {a: 0.3}
    got = _next_hints({}, None, above)
    assert got == above and got is not above
    assert _next_hints(None, None, None) == {}


def test_a_sweep_hands_each_cell_its_rows_trend(monkeypatch: pytest.MonkeyPatch) -> None:
    """In a row, cell j starts from 2·h(j − 1) − h(j − 2) of the hints the two cells before
    it left (not the other way round), and a row's first cell from the cell above's."""
    import reports.pd_plot as pd_plot

    real = pd_plot.colocated_baseline
    seen: list[tuple[dict, dict]] = []  # type: ignore[type-arg]

    def spy(*args, hints, **kw):  # type: ignore[no-untyped-def]
        given = dict(hints)
        out = real(*args, hints=hints, **kw)
        seen.append((given, dict(hints)))
        return out

    monkeypatch.setattr(pd_plot, "colocated_baseline", spy)
    length_sweep(MODEL, [H100], SLO_, inputs=[512, 1024], outputs=[32, 64, 128])
    (g0, l0), (g1, l1), (g2, _), (g3, _), _, _ = seen
    assert g0 == {} and g1 == l0 and g3 == l0  # a row's first cell: the one above's
    assert g2 and g2 == pytest.approx(
        {k: min(max(2 * h - l0[k], 1e-3), 1.0) for k, h in l1.items()}
    )
