"""Request traces: Azure (``TIMESTAMP,ContextTokens,GeneratedTokens``), BurstGPT
(``Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type``; seconds from
the trace start, one service model per row) and the generic
``input_tokens,output_tokens[,arrival_s]`` CSV, with arrival times relative to the first row.

BurstGPT rows with 0 request or response tokens are failed requests (the dataset's
convention): they are skipped and counted in ``Trace.skipped``. ``model=`` keeps the rows
of one service model (``ChatGPT``, ``GPT-4``, …; case-insensitive).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from perfmodel.datafile import CsvTable, parse_float, parse_int, read_csv
from perfmodel.errors import SpecError
from perfmodel.workload.lengths import LengthDistribution, empirical_lengths

Arr = NDArray[np.float64]


IntArr = NDArray[np.int64]


@dataclass(frozen=True)
class Trace:
    """Recorded requests: arrival times (s, from the first), input and output tokens."""

    source: str
    arrival_s: Arr
    input_tokens: IntArr
    output_tokens: IntArr
    skipped: int = 0  # rows dropped (BurstGPT failures)

    @property
    def n(self) -> int:
        return int(self.input_tokens.size)

    @property
    def duration_s(self) -> float:
        return float(self.arrival_s[-1] - self.arrival_s[0]) if self.n > 1 else 0.0

    @property
    def rate_per_s(self) -> float:
        """Mean arrival rate: (n − 1) gaps over the span of the trace."""
        if self.duration_s <= 0:
            raise SpecError(
                f"trace {self.source} has no arrival times (or all equal); pass --rate-per-s"
            )
        return (self.n - 1) / self.duration_s

    @property
    def arrival_cv(self) -> float:
        gaps = np.diff(self.arrival_s)
        if gaps.size < 2 or gaps.mean() <= 0:
            return 1.0
        return float(gaps.std() / gaps.mean())

    def lengths(self) -> LengthDistribution:
        return empirical_lengths(self.input_tokens, self.output_tokens, name=self.source)

    def replay_times_s(self, time_scale: float = 1.0) -> Arr:
        """Arrival times with the clock sped up ``time_scale`` times (2 = twice the rate)."""
        if not (math.isfinite(time_scale) and time_scale > 0):
            raise SpecError(f"trace time scale must be > 0, got {time_scale}")
        return (self.arrival_s - self.arrival_s[0]) / time_scale


_AZURE = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_BURST = ("Timestamp", "Model", "Request tokens", "Response tokens")


#: Largest trace accepted by default (rows); a bigger one is refused before any work.
MAX_TRACE_ROWS = 10_000_000
#: Largest token count of one request a trace may hold.
MAX_TRACE_TOKENS = 10_000_000


def load_trace(path: str | Path, *, model: str | None = None) -> Trace:
    """Read a trace CSV (Azure, BurstGPT or generic format, see the module docstring);
    ``model`` filters a BurstGPT trace to one service model."""
    p = Path(path)
    tab = read_csv(p, what="trace", min_rows=0)
    header = list(tab.header)
    if all(h in header for h in _BURST):
        return _burstgpt(p, tab, model)
    if model is not None:
        raise SpecError(f"{p}: --trace-model applies to BurstGPT traces (a 'Model' column)")
    if all(h in header for h in _AZURE):
        cols = {"in": header.index(_AZURE[1]), "out": header.index(_AZURE[2])}
        ts_col, azure = header.index(_AZURE[0]), True
    elif "input_tokens" in header and "output_tokens" in header:
        cols = {"in": header.index("input_tokens"), "out": header.index("output_tokens")}
        ts_col = header.index("arrival_s") if "arrival_s" in header else -1
        azure = False
    else:
        raise SpecError(
            f"{p}:1: unrecognized header {','.join(header)!r}; expected "
            "'TIMESTAMP,ContextTokens,GeneratedTokens' (Azure), "
            "'Timestamp,Model,Request tokens,Response tokens,...' (BurstGPT) or "
            "'input_tokens,output_tokens[,arrival_s]'"
        )
    if len(tab) > MAX_TRACE_ROWS:
        raise SpecError(f"{p}: {len(tab)} requests, over the {MAX_TRACE_ROWS} limit; cut it")
    s: list[int] = []
    o: list[int] = []
    t: list[float] = []
    t0: datetime | None = None
    for lineno, row in tab:
        where = f"{p}:{lineno}"
        for key, dest in (("in", s), ("out", o)):
            name = header[cols[key]]
            dest.append(
                parse_int(
                    row[cols[key]], where=where, name=name, min_value=1, max_value=MAX_TRACE_TOKENS
                )
            )
        if ts_col < 0:
            continue
        raw = row[ts_col]
        if azure:
            try:
                ts = datetime.fromisoformat(raw[:26])
            except ValueError:
                raise SpecError(f"{where}: TIMESTAMP {raw!r} is not an ISO date-time") from None
            if t0 is not None and (ts.tzinfo is None) != (t0.tzinfo is None):
                raise SpecError(f"{where}: TIMESTAMP {raw!r} mixes time zones with line 2")
            t0 = t0 or ts
            t.append((ts - t0).total_seconds())
        else:
            t.append(parse_float(raw, where=where, name="arrival_s"))
        if len(t) > 1 and t[-1] < t[-2]:
            raise SpecError(f"{where}: arrival time goes backwards; sort the trace by time")
    if not s:
        raise SpecError(f"{p}: trace has a header but no requests")
    arr = np.asarray(t, dtype=np.float64) if t else np.zeros(len(s))
    return Trace(str(p), arr - arr[0], np.asarray(s, np.int64), np.asarray(o, np.int64))


def _burstgpt(p: Path, tab: CsvTable, model: str | None) -> Trace:
    """BurstGPT rows (see the module docstring)."""
    header = list(tab.header)
    ci, cm = header.index("Timestamp"), header.index("Model")
    cs, co = header.index("Request tokens"), header.index("Response tokens")
    want = model.strip().lower() if model is not None else None
    seen: set[str] = set()
    s: list[int] = []
    o: list[int] = []
    t: list[float] = []
    skipped = 0
    for lineno, row in tab:
        where = f"{p}:{lineno}"
        name = row[cm].strip()
        seen.add(name)
        if want is not None and name.lower() != want:
            continue
        try:
            ts, a, b = float(row[ci]), int(row[cs]), int(row[co])
        except ValueError:
            raise SpecError(
                f"{where}: Timestamp, Request tokens and Response tokens must be numbers"
            ) from None
        if not math.isfinite(ts) or a < 0 or b < 0:
            raise SpecError(f"{where}: Timestamp must be finite and token counts >= 0")
        if a == 0 or b == 0:
            skipped += 1  # a failed request
            continue
        if t and ts < t[-1]:
            raise SpecError(f"{where}: arrival time goes backwards; sort the trace by time")
        s.append(a)
        o.append(b)
        t.append(ts)
    if not s:
        which = f" for model {model!r} (models: {', '.join(sorted(seen))})" if want else ""
        raise SpecError(f"{p}: no successful requests{which}")
    arr = np.asarray(t, dtype=np.float64)
    src = f"{p}[{model}]" if model else str(p)
    return Trace(src, arr - arr[0], np.asarray(s, np.int64), np.asarray(o, np.int64), skipped)
