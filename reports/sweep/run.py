"""Run a sweep serially or on ``dask.distributed``, streaming results to one file.

The grid is cut into chunks (:class:`reports.sweep.spec.SweepSpec`); a chunk's rows are
formatted where they are computed and appended to the output in chunk order, so the
file is the same byte for byte whatever ran it (serial, a ``LocalCluster``, a remote
cluster). Beside it, ``OUT.done`` records the spec's fingerprint and, after each chunk
is flushed to disk, its number and the file's length: a restarted sweep truncates the
output to the last recorded chunk and computes only the chunks after it. Chunks that
finished out of order and were still waiting for an earlier one when the process died
are computed again (at most the in-flight window, two chunks per worker).

Dask is optional (``pip install 'perfmodel[dask]'``): without it ``scheduler="serial"``
is the only choice and the default.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

from perfmodel.errors import SpecError
from reports.cluster import check_scheduler, connected, keep_freed_heap
from reports.sweep.evaluate import evaluate_chunk
from reports.sweep.spec import PARAMS, SweepSpec

RESULT_FIELDS = (
    "engine_id",
    "fits",
    "kv_capacity_tokens",
    "ttft_ms",
    "tpot_ms",
    "e2e_ms",
    "output_tokens_per_s",
    "decode_arith_intensity_flop_per_byte",
    "error",
)
CSV_FIELDS = ("index", *PARAMS, *RESULT_FIELDS)
WINDOW_PER_WORKER = 2  # chunks in flight per worker


@dataclass(frozen=True)
class SweepRun:
    """What a run did: configurations and chunks in all, computed now, found done."""

    out: str
    scheduler: str
    workers: int
    configurations: int
    chunks: int
    computed_chunks: int
    resumed_chunks: int
    wall_s: float
    engine: tuple[str, ...] = ()  # the engine axis (auto, none, ids or paths)

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "engine": list(self.engine)}


def output_format(out: Path) -> str:
    return "csv" if out.suffix.lower() == ".csv" else "jsonl"


def chunk_text(spec: SweepSpec, chunk: int, fmt: str) -> str:
    """The formatted rows of one chunk (runs where the chunk is computed)."""
    rows = evaluate_chunk(spec, chunk)
    if fmt == "jsonl":
        return "".join(json.dumps(r) + "\n" for r in rows)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
    w.writerows(rows)
    return buf.getvalue()


def fingerprint(spec: SweepSpec, fmt: str) -> str:
    text = json.dumps({"spec": spec.to_dict(), "format": fmt}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def manifest_path(out: Path) -> Path:
    """The file beside ``out`` that records its finished chunks (what a resume reads)."""
    return out.with_name(out.name + ".done")


def _resume_point(out: Path, fp: str) -> tuple[int, int]:
    """(next chunk, output length) from an earlier run's manifest (0, 0 if none)."""
    man = manifest_path(out)
    if not man.exists():
        return 0, 0
    lines = man.read_text(encoding="utf-8", errors="replace").splitlines()
    if not out.exists() or (not lines and out.stat().st_size <= len(",".join(CSV_FIELDS)) + 1):
        return 0, 0  # the results are gone, or a sweep stopped before its record: restart
    try:
        head = json.loads(lines[0]) if lines else {}
    except json.JSONDecodeError:
        head = {}
    if not isinstance(head, dict) or head.get("fingerprint") != fp:
        raise SpecError(
            f"{man} belongs to a different sweep (spec or format changed) or is not a sweep's "
            "record; delete it and "
            f"{out}, or pass --force to start over"
        )
    nxt, end = 0, 0
    for ln in lines[1:]:
        try:
            rec = json.loads(ln)
        except json.JSONDecodeError:
            break  # a record cut by the crash: everything after it is recomputed
        if rec.get("chunk") != nxt:
            break
        nxt, end = nxt + 1, int(rec["end"])
    return nxt, end


class _Writer:
    """Appends chunks in order; records each in the manifest once it is on disk."""

    def __init__(self, out: Path, spec: SweepSpec, fmt: str, *, resume: bool, force: bool):
        fp = fingerprint(spec, fmt)
        man = manifest_path(out)
        if force:
            out.unlink(missing_ok=True)
            man.unlink(missing_ok=True)
        self.next, end = _resume_point(out, fp) if resume else (0, 0)
        # this sweep's own file, stopped before its first chunk: nothing to keep
        ours = resume and man.exists()
        if self.next == 0:
            if out.exists() and not (force or ours):
                raise FileExistsError(f"{out} exists; pass --force to overwrite it")
            if not out.parent.is_dir():
                raise SpecError(f"directory {out.parent} does not exist")
            self.f = out.open("w", encoding="utf-8", newline="")
            if fmt == "csv":
                self.f.write(",".join(CSV_FIELDS) + "\n")
            self.man = man.open("w", encoding="utf-8")
            self.man.write(json.dumps({"fingerprint": fp, "chunks": spec.chunks}) + "\n")
            self.man.flush()  # a sweep killed before its first chunk still has its record
        else:
            self.f = out.open("r+", encoding="utf-8", newline="")
            self.f.truncate(end)
            self.f.seek(end)
            self.man = man.open("a", encoding="utf-8")
        self.first = self.next
        self.pending: dict[int, str] = {}

    def add(self, chunk: int, text: str) -> int:
        """Take a finished chunk; write every chunk now in order. Returns chunks written."""
        self.pending[chunk] = text
        n = 0
        while self.next in self.pending:
            self.f.write(self.pending.pop(self.next))
            self.f.flush()
            os.fsync(self.f.fileno())
            self.man.write(json.dumps({"chunk": self.next, "end": self.f.tell()}) + "\n")
            self.man.flush()
            self.next += 1
            n += 1
        return n

    def close(self) -> None:
        self.f.close()
        self.man.close()


def _write(
    w: _Writer,
    spec: SweepSpec,
    results: Iterator[tuple[int, str]],
    progress: Callable[[int], None] | None,
) -> None:
    """Every chunk of ``results`` into ``w``, in order; an error if one never came."""
    for c, text in results:
        w.add(c, text)
        if progress is not None:
            progress(len(spec.chunk_range(c)))
    if w.pending or w.next != spec.chunks:  # a chunk never came back: do not pretend
        raise SpecError(f"sweep incomplete: chunk {w.next} missing; run it again to resume")


def _serial(spec: SweepSpec, todo: range, fmt: str) -> Iterator[tuple[int, str]]:
    for c in todo:
        yield c, chunk_text(spec, c, fmt)


def _distributed(
    spec: SweepSpec, todo: range, fmt: str, client: Any, workers: int
) -> Iterator[tuple[int, str]]:
    from dask.distributed import as_completed

    chunks = iter(todo)
    window = max(WINDOW_PER_WORKER * workers, 1)
    first = [
        client.submit(chunk_text, spec, c, fmt, pure=False, key=f"chunk-{c}")
        for c in islice(chunks, window)
    ]
    ac = as_completed(first)
    for fut in ac:
        c = int(str(fut.key).rsplit("-", 1)[1])
        yield c, fut.result()
        nxt = next(chunks, None)
        if nxt is not None:
            ac.add(client.submit(chunk_text, spec, nxt, fmt, pure=False, key=f"chunk-{nxt}"))


def check_catalog_ids(spec: SweepSpec) -> None:
    """Every model, hardware and engine of the grid loads (a typo fails before any work)."""
    from hardware.device import load_device
    from hardware.engine import engine_for
    from perfmodel.model import load_model

    axes = dict(spec.axes)
    for m in axes["model"]:
        load_model(m)
    devs = [load_device(d) for d in axes["hardware"]]
    for e in axes["engine"]:
        engine_for(e, devs[0])


def run_sweep(
    spec: SweepSpec,
    out: Path,
    *,
    scheduler: str = "serial",
    workers: int | None = None,
    resume: bool = True,
    force: bool = False,
    progress: Callable[[int], None] | None = None,
) -> SweepRun:
    """Run the chunks not yet in ``out`` and append them in order (see the module
    docstring). ``scheduler``: ``serial``, ``local`` (a ``LocalCluster`` of ``workers``
    processes, default one per core) or a scheduler address ``tcp://host:port``."""
    check_scheduler(scheduler)
    if workers is not None and workers < 1:
        raise SpecError(f"--workers must be >= 1, got {workers}")
    fmt = output_format(out)
    check_catalog_ids(spec)
    keep_freed_heap()
    t0 = time.perf_counter()
    # the cluster first: a scheduler that does not answer leaves no file behind
    on = connected(scheduler, workers) if scheduler != "serial" else nullcontext((None, 1))
    with on as (client, n):
        w = _Writer(out, spec, fmt, resume=resume, force=force)
        todo = range(w.next, spec.chunks)
        if progress is not None and w.first:
            progress(min(w.first * spec.chunk, spec.size))
        try:
            chunks = (
                _serial(spec, todo, fmt)
                if client is None
                else _distributed(spec, todo, fmt, client, n)
            )
            _write(w, spec, chunks, progress)
        finally:
            w.close()
    return SweepRun(
        out=str(out),
        scheduler=scheduler,
        workers=n,
        configurations=spec.size,
        chunks=spec.chunks,
        computed_chunks=len(todo),
        resumed_chunks=w.first,
        wall_s=time.perf_counter() - t0,
        engine=tuple(str(e) for e in dict(spec.axes)["engine"]),
    )
