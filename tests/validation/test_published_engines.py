"""End-to-end errors against the published engine benchmarks (../shared/data/published).

Pins what ``benchmarks/validate_published.py`` measures with the shipped engine files
(each row predicted with its own engine) — bounds a little above the measured values, so
a modeling change that makes the tool worse against real engines fails here — and the
held-out (leave-one-model-out) errors ``perfmodel calibrate`` stored in the engine files.
Errors are ``predicted/measured − 1``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hardware.engine import load_engine
from perfmodel.validate.convert import convert_published, write_long_csv
from perfmodel.validate.data import read_measurements
from perfmodel.validate.predict import BASELINE, RowResult, predict_rows
from perfmodel.validate.summary import acceptance_summary
from tests.conftest import shared_file


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> list:
    conv = convert_published(shared_file("published"))
    path = Path(tmp_path_factory.mktemp("published")) / "long.csv"
    write_long_csv(conv.rows, path)
    return read_measurements(path)


@pytest.fixture(scope="module")
def shipped(rows: list) -> dict:
    return acceptance_summary(predict_rows(rows))


# group: (median |err| bound, |signed median| bound, p90 bound), in percent; measured
# values (shipped engines, in-sample) in the comments
BOUNDS = {
    "perf_overview offline A100+H100": (8.5, 3, 27),  # 6.7, -0.7, 24.4 (one file: 8.8, -1.9, 24.0)
    "perf_overview offline A100": (7.5, 4, 26.5),  # 5.7, -1.9, 25.0 (one file: 10.6, -8.5, 23.9)
    "perf_overview offline H100": (8.5, 3, 26),  # 6.9, +0.1, 23.5 (one file: 8.1, +0.9, 25.0)
    "perf_overview offline MoE": (8, 3, 29.5),  # 6.3, +0.1, 27.9 (one file: 7.4, +1.5, 24.6)
    "static_batch throughput": (6.5, 4, 19),  # 5.1, -2.5, 16.9
    "static_batch batch-1 TTFT": (12.5, 12, 22),  # 10.8, -10.5, 18.8
    # TRT-LLM rows 2-3.5x off on pipeline-parallel runs; since the trtllm 0.13/0.17 split the
    # 0.17+ file fits them beside 79 perf-overview A100 rows (was 201 vs 190)
    "argonne A100": (9, 3, 50),  # 7.5, -0.3, 46.4 (one file: 5.1, +1.1, 61.1)
    "argonne H100": (6, 3, 13),  # 4.4, -1.7, 10.9 (one file: 5.4, -2.8, 11.5)
    "argonne MI250": (11, 4, 25),  # 9.1, +0.9, 21.9
    "MHA 7B static batch": (6, 4, 18),  # 4.8, -2.7, 15.9 (engine-less: 6.8, +1.3, 35.3)
}


@pytest.mark.parametrize("group", sorted(BOUNDS))
def test_shipped_engines_error_bounds(shipped: dict, group: str) -> None:
    s = shipped[group]
    med, signed, p90 = BOUNDS[group]
    assert s.n > 10
    assert 100 * s.median_abs <= med, (group, s)
    assert abs(100 * s.signed_median) <= signed, (group, s)
    assert 100 * s.p90_abs <= p90, (group, s)


def test_held_out_error_stored_in_the_engine_files() -> None:
    # leave-one-model-out over each engine's rows (bounds: measured + ~1.5 points)
    # trtllm 0.17+ (perf overview v0.17+ and Argonne): 9.6 / 36.7 (one 0.13+ file: 10.0 / 30.2)
    for name, med, p90 in (
        ("trtllm@0.5", 7.5, 21),
        ("trtllm@0.13", 9.5, 23),
        ("trtllm", 11, 38),
        ("vllm", 8.5, 27),
    ):
        prov = load_engine(name).provenance
        lomo = prov["leave_one_model_out"]
        assert lomo["rows"] >= 75
        assert lomo["median_abs_error_pct"] <= med, (name, lomo)
        assert lomo["p90_abs_error_pct"] <= p90, (name, lomo)
        assert abs(lomo["signed_median_error_pct"]) <= 5, (name, lomo)


@pytest.mark.slow
def test_engine_less_model_is_optimistic(rows: list) -> None:
    """The answer without an engine (the issue's table): +24 % signed on the perf overview
    when the issue was filed, +16 % since the engine-less model pays recompute preemption
    (serving/preemption.py), +61 % on the static GQA 70B rows, batch-1 TTFT 32 % short."""
    res: list[RowResult] = predict_rows(rows, engine=BASELINE)
    s = acceptance_summary(res)
    assert 100 * s["perf_overview offline A100+H100"].signed_median > 12
    assert 100 * s["static_batch batch-1 TTFT"].signed_median < -25
    assert 100 * s["argonne MI250"].signed_median > 90
