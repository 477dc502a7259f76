"""End-to-end error against the published engine benchmarks (issue 12 acceptance tables).

    python -m benchmarks.validate_published [--src ../shared/data/published] [--no-baseline]

Converts the three published tables (in memory, to a temporary CSV), predicts every row
with the shipped engine files (each row's own engine: ``trtllm@0.5`` -> the 0.5-0.12
file, ``trtllm@0.13``/``0.14`` -> ``trtllm-0.13``, ``trtllm@0.17``+ and the unversioned
Argonne rows -> ``trtllm``, ``vllm``) and, unless ``--no-baseline``, with the
engine-less model, and prints for every acceptance group: rows, median |error|, signed
median and p90 (errors are ``predicted/measured − 1``; + = optimistic for a throughput,
too slow for a latency). The shipped engines were fitted on these rows: the in-sample
tables here are therefore followed by the held-out errors stored in each engine file's
provenance by ``perfmodel calibrate`` (leave-one-model-out and leave-one-device-out over
the engine's rows, and leave-one-model-out per acceptance group).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from hardware.engine import load_engine
from perfmodel.errors import SpecError
from perfmodel.validate.convert import convert_published, write_long_csv
from perfmodel.validate.data import read_measurements
from perfmodel.validate.predict import BASELINE, RowResult, predict_rows
from perfmodel.validate.summary import error_stats

MOE = ("mixtral-8x7b", "mixtral-8x22b", "qwen3-235b-a22b", "llama-4-scout")
Pred = Callable[[RowResult], bool]
ENGINES = ("trtllm@0.5", "trtllm@0.13", "trtllm", "vllm")  # the calibrated engine files


def _src(r: RowResult) -> str:
    return r.measurement.raw.get("source", "")


def groups() -> list[tuple[str, Pred]]:
    def po(r: RowResult) -> bool:
        return (
            _src(r).startswith("trtllm_perf_overview") and r.measurement.request_rate_per_s is None
        )

    def sb(r: RowResult) -> bool:
        return _src(r).startswith("trtllm_static")

    def ar(r: RowResult) -> bool:
        return _src(r).startswith("argonne")

    out: list[tuple[str, Pred]] = [
        ("TRT-LLM perf overview offline, A100+H100", po),
        ("  A100", lambda r: po(r) and r.measurement.device == "a100-sxm-80gb"),
        ("  H100", lambda r: po(r) and r.measurement.device == "h100-sxm"),
        ("  MoE rows", lambda r: po(r) and r.measurement.model in MOE),
        ("  dense rows", lambda r: po(r) and r.measurement.model not in MOE),
        ("TRT-LLM static batch, throughput", lambda r: sb(r) and r.measurement.metric != "ttft_ms"),
        (
            "  GQA 70B/180B",
            lambda r: (
                sb(r)
                and r.measurement.metric != "ttft_ms"
                and r.measurement.model in ("llama-2-70b", "falcon-180b")
            ),
        ),
        (
            "TRT-LLM static batch, batch-1 TTFT",
            lambda r: sb(r) and r.measurement.metric == "ttft_ms",
        ),
        (
            "MHA 7B rows (Llama-2-7B, GPT-J 6B), all tables",
            lambda r: r.measurement.model in ("llama-2-7b", "gpt-j-6b"),
        ),
        (
            "  static batch only",
            lambda r: sb(r) and r.measurement.model in ("llama-2-7b", "gpt-j-6b"),
        ),
    ]

    def argonne(eng: str, dev: str) -> Pred:
        def pred(r: RowResult) -> bool:
            m = r.measurement
            return ar(r) and m.engine_family == eng and m.device == dev

        return pred

    for eng in ("vllm", "trtllm"):
        for dev in ("a100-sxm-80gb", "h100-sxm", "mi250"):
            out.append((f"Argonne {eng} {dev}", argonne(eng, dev)))
    out.append(
        (
            "TRT-LLM online sweep: mean TTFT",
            lambda r: (
                r.measurement.request_rate_per_s is not None and r.measurement.metric == "ttft_ms"
            ),
        )
    )
    out.append(
        (
            "TRT-LLM online sweep: mean ITL",
            lambda r: (
                r.measurement.request_rate_per_s is not None and r.measurement.metric == "tpot_ms"
            ),
        )
    )
    return out


def _line(title: str, res: list[RowResult]) -> str:
    s = error_stats(res)
    if s.n == 0:
        return f"{title:52s} {'':>5s} {'—':>8s} {'':>9s} {'':>7s} unrep {s.unrepresentable}"
    return (
        f"{title:52s} {s.n:5d} {100 * s.median_abs:7.1f}% {100 * s.signed_median:+8.1f}% "
        f"{100 * s.p90_abs:6.1f}% unrep {s.unrepresentable}"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--src",
        default=str(Path(__file__).resolve().parents[1].parent / "shared" / "data" / "published"),
    )
    ap.add_argument("--no-baseline", action="store_true")
    a = ap.parse_args()
    try:
        conv = convert_published(a.src)
    except SpecError as err:
        print(f"error: {err} (pass --src)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "published.csv"
        write_long_csv(conv.rows, path)
        rows = read_measurements(path)
    print(f"{len(rows)} rows ({conv.duplicates} repeats merged, {len(conv.skipped)} left out)")
    runs: list[tuple[str, str | None]] = [("shipped engines (row's engine)", None)]
    if not a.no_baseline:
        runs.append(("engine-less model (today's answer)", BASELINE))
    for label, eng in runs:
        t0 = time.perf_counter()
        res = predict_rows(rows, engine=eng)
        print(f"\n== {label}  ({time.perf_counter() - t0:.1f} s)")
        print(f"{'group':52s} {'n':>5s} {'median':>8s} {'signed':>9s} {'p90':>7s}")
        for title, pred in groups():
            print(_line(title, [r for r in res if pred(r)]))
    print("\n== held-out error stored in the shipped engine files (provenance)")
    for name in ENGINES:
        e = load_engine(name)
        prov = e.provenance
        for k in ("fit", "leave_one_model_out", "leave_one_device_out"):
            s = prov.get(k)
            if s:
                med, sig = s["median_abs_error_pct"], s["signed_median_error_pct"]
                print(
                    f"{e.id:12s} {k:22s} n={s['rows']:4d} median {med:5.1f}% "
                    f"signed {sig:+6.1f}% p90 {s['p90_abs_error_pct']:5.1f}%"
                )
        if not prov:
            print(f"{e.id:12s} not calibrated (start values)")
    for key, what in (
        (
            "leave_one_model_out_by_group",
            "leave-one-model-out (each engine refitted without the model)",
        ),
        ("leave_one_device_out_by_group", "leave-one-device-out (refitted without the device)"),
    ):
        print(f"\n== {what}, by acceptance group")
        for name in ENGINES:
            e = load_engine(name)
            for group, s in e.provenance.get(key, {}).items():
                med, sig = s["median_abs_error_pct"], s["signed_median_error_pct"]
                print(
                    f"{e.id:12s} {group:34s} n={s['rows']:4d} median {med:5.1f}% "
                    f"signed {sig:+6.1f}% p90 {s['p90_abs_error_pct']:5.1f}%"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
