"""One chunk of a sweep: the static-batch estimate of every configuration in it.

Each row carries what ``perfmodel estimate`` reports for that configuration (TTFT,
TPOT, end-to-end time, output tokens/s, memory fit) and equals it exactly: the chunk is
cut into runs that differ only in the output length (the fastest axis of the grid), and
a run needs one prefill and one decode iteration-time call (through
:class:`perfmodel.step.instance.Instance`, as ``estimate``) — the decode steps of the
longest output, whose leading ``o − 1`` entries are those of every shorter one (the
same element-wise arithmetic as :func:`perfmodel.estimate.estimate`, checked by the
tests).
"""

from __future__ import annotations

from functools import cache
from itertools import groupby
from typing import Any

import numpy as np

from hardware.device import Device, load_device
from hardware.engine import engine_for
from perfmodel.errors import PerfModelError
from perfmodel.model import ModelSpec, load_model
from perfmodel.plan import ParallelPlan
from perfmodel.step.batch import Batch
from perfmodel.step.instance import Instance
from perfmodel.units import ms
from reports.sweep.spec import SweepSpec


@cache
def _model(name: str) -> ModelSpec:
    return load_model(name)


@cache
def _device(name: str) -> Device:
    return load_device(name)


_MAX_ELEMENTS = 1 << 18  # decode steps costed in one step_time call (bounded temporaries)


def evaluate_chunk(spec: SweepSpec, chunk: int) -> list[dict[str, Any]]:
    """The rows of chunk ``chunk`` in index order (a configuration that cannot be
    evaluated, e.g. a TP that does not divide the heads, gets an ``error`` instead)."""
    rows: list[dict[str, Any]] = []
    configs = [(i, spec.config(i)) for i in spec.chunk_range(chunk)]

    def plan_key(item: tuple[int, dict[str, Any]]) -> tuple[Any, ...]:
        c = item[1]
        return tuple(
            c[k]
            for k in ("model", "hardware", "tp", "pp", "dtype", "act_dtype", "kv_dtype", "engine")
        )

    for _, group in groupby(configs, key=plan_key):
        items = list(group)
        try:
            rows += _evaluate_plan(items)
        except PerfModelError as e:
            rows += [{"index": i, **cfg, "error": str(e)} for i, cfg in items]
    return rows


def _evaluate_plan(items: list[tuple[int, dict[str, Any]]]) -> list[dict[str, Any]]:
    """Configurations of one (model, device, plan): runs differing only in the output
    length, costed together — one prefill call for the runs' first iterations and one
    decode call for their decode steps (rows = runs, columns = steps)."""
    c0 = items[0][1]
    model, device = _model(c0["model"]), _device(c0["hardware"])
    plan = ParallelPlan(
        tp=c0["tp"],
        weight_dtype=c0["dtype"],
        act_dtype=c0["act_dtype"],
        kv_dtype=c0["kv_dtype"],
        pp=c0["pp"],
    )
    inst = Instance(model, device, plan, engine=engine_for(c0["engine"], device))
    runs = [list(r) for _, r in groupby(items, key=lambda it: (it[1]["batch"], it[1]["input_len"]))]
    longest = max(cfg["output_len"] for _, cfg in items)
    steps = max(longest - 1, 1)
    per_call = max(_MAX_ELEMENTS // steps, 1)
    out: list[dict[str, Any]] = []
    for lo in range(0, len(runs), per_call):
        part = runs[lo : lo + per_call]
        b = np.array([r[0][1]["batch"] for r in part], dtype=np.float64)
        s = np.array([r[0][1]["input_len"] for r in part], dtype=np.float64)
        mb = np.ceil(b / plan.pp)  # ⌈batch/pp⌉, as in estimate()
        prefill = inst.iteration_s(Batch.prefill(mb, s))
        ctx = s[:, None] + np.arange(steps, dtype=np.float64)[None, :]
        dec = Batch.decode(mb[:, None], ctx)
        dec_s = inst.iteration_s(dec)
        roof = inst.step(dec)  # the breakdown, for the arithmetic intensity
        flops, nbytes = roof.flops, roof.bytes
        for j, run in enumerate(part):
            out += _rows(inst, run, float(prefill[j]), dec_s[j], flops[j], nbytes[j])
    return out


def _rows(
    inst: Instance,
    run: list[tuple[int, dict[str, Any]]],
    ttft: float,
    dec_s: np.ndarray,
    flops: np.ndarray,
    nbytes: np.ndarray,
) -> list[dict[str, Any]]:
    """Rows of one run (same batch and input length) from its step times."""
    out = []
    for i, cfg in run:
        b, s, o = cfg["batch"], cfg["input_len"], cfg["output_len"]
        fit = inst.memory_fit(batch=b, context_len=s + o)
        n_dec = o - 1
        e2e = ttft + float(dec_s[:n_dec].sum())
        mid = n_dec // 2
        ai = float(flops[mid] / nbytes[mid]) if float(nbytes[mid]) > 0 else float("inf")
        out.append(
            {
                "index": i,
                **cfg,
                "engine_id": inst.engine.id if inst.engine else "none",
                "fits": fit.fits,
                "kv_capacity_tokens": fit.kv_capacity_tokens,
                "ttft_ms": ms(ttft),
                "tpot_ms": ms(float(dec_s[: max(n_dec, 1)].mean()) if n_dec > 0 else 0.0),
                "e2e_ms": ms(e2e),
                "output_tokens_per_s": b * o / e2e,
                "decode_arith_intensity_flop_per_byte": ai,
            }
        )
    return out
