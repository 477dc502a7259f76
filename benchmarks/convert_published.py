"""Convert the published engine benchmarks to the long validation format.

    python -m benchmarks.convert_published --src ../shared/data/published --out /tmp/published.csv

Writes one CSV (never into the repository: the data stay where they are published) and
prints how many rows were converted, merged as repeats and left out, with the reasons.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

from perfmodel.errors import SpecError
from perfmodel.validate.convert import convert_published, write_long_csv


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", required=True, help="folder with the three published CSVs")
    ap.add_argument("--out", required=True, help="output CSV (long format)")
    a = ap.parse_args()
    try:
        conv = convert_published(a.src)
    except SpecError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(a.out)
    if not out.parent.is_dir():
        print(f"error: directory {out.parent} does not exist", file=sys.stderr)
        return 2
    write_long_csv(conv.rows, out)
    print(f"{len(conv.rows)} rows -> {out}")
    print(
        f"{conv.duplicates} repeats merged into their median ({conv.conflicting_duplicates} "
        "groups with a repeat > 5 % from the median)"
    )
    for reason, n in collections.Counter(r for _, r in conv.skipped).most_common():
        print(f"left out {n}: {reason}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
