"""Held-out error pooled over several engine files of one family, by acceptance group.

    git show 68520ca:hardware/engines/trtllm-0.13.toml > /tmp/s013.toml
    git show 68520ca:hardware/engines/trtllm.toml > /tmp/s017.toml
    python -m benchmarks.convert_published --src ../shared/data/published --out /tmp/p.csv
    python -m benchmarks.pooled_held_out --data /tmp/p.csv /tmp/s013.toml /tmp/s017.toml

Each file is refitted from the START values given (the committed start values of a
calibrated file, from its git history) exactly as ``perfmodel calibrate`` does (offline rows
whose engine resolves to that file, same fit settings), once per left-out model and once per
left-out device; the held-out rows of all files are pooled, so a row is predicted by its own
file's fit that never saw its model (or device). A family split into version ranges has its
acceptance number here: the files' stored provenance holds each file's own rows only.
"""

from __future__ import annotations

import argparse
import sys

from hardware.engine import load_engine
from perfmodel.errors import SpecError
from perfmodel.validate.calibrate import held_out, rows_for
from perfmodel.validate.data import read_measurements
from perfmodel.validate.summary import acceptance_summary, error_stats


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("starts", nargs="+", help="engine TOML files holding start values")
    ap.add_argument("--data", required=True, help="long-format CSV (convert_published)")
    ap.add_argument("--max-evals", type=int, default=8)
    ap.add_argument("--max-rows", type=int, default=80)
    a = ap.parse_args()
    try:
        data = [m for m in read_measurements(a.data) if m.request_rate_per_s is None]
        starts = [load_engine(p) for p in a.starts]
    except SpecError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for by in ("model", "device"):
        res = []
        for s in starts:
            res += held_out(s, rows_for(s, data), by=by, max_evals=a.max_evals, max_rows=a.max_rows)
        print(f"\n== leave-one-{by}-out, pooled over {', '.join(s.id for s in starts)}")
        for name, st in [("all rows", error_stats(res)), *acceptance_summary(res).items()]:
            print(
                f"{name:36s} n={st.n:4d} median {100 * st.median_abs:5.1f}% "
                f"signed {100 * st.signed_median:+6.1f}% p90 {100 * st.p90_abs:5.1f}%"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
