"""What an answer was modelled with: the engine's id and the error to expect from
validation (the engine file's stored held-out errors), said in every output.

``engine`` arguments are the ``--engine`` spec (``auto``: the device family's default,
``none``: the engine-less roofline, a name or a TOML path), to say when the engine is
the device's default.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hardware.device import Device
from hardware.engine import AUTO_ENGINE, Engine, engine_for

#: What the engine-less roofline's answers are worth: the median error of the engine-less
#: column of the README's "How accurate is it" table (benchmarks/validate_published.py).
NO_ENGINE_NOTE = (
    "the engine-less roofline, 12-113 % optimistic against published engines (median by table)"
)


def describe_engine(
    eng: Engine | None, device: Device, act_dtype: str, engine: str, *, where: str | None = None
) -> str:
    """The engine note of one device; ``where`` names it in the default's clause."""
    auto = engine.strip().lower() == AUTO_ENGINE
    if eng is None:
        who = device.vendor or device.id
        return (
            f"none: no engine model for {who} devices; {NO_ENGINE_NOTE}"
            if auto
            else f"none; {NO_ENGINE_NOTE}"
        )
    note = eng.accuracy_note(device.id, act_dtype)
    if auto:
        on = where or f"on {device.id}"
        note += f"; the default {on} (--engine none for the engine-less roofline)"
    return note


def engines_for(
    devices: Sequence[Device], act_dtype: str | Mapping[str, str], engine: str = AUTO_ENGINE
) -> tuple[dict[str, Any], list[str]]:
    """The ``engine``/``engine_accuracy`` JSON keys and the ``engine:`` text lines of an
    answer over several device types (``auto`` may pick a different engine on each): one
    engine id and note, or ``{device: ...}`` over several devices. ``act_dtype``: the math
    dtype, or one per device id."""
    devs = list({d.id: d for d in devices}.values())
    engs = [engine_for(engine, d) for d in devs]
    dts = {d.id: act_dtype if isinstance(act_dtype, str) else act_dtype[d.id] for d in devs}
    notes = [describe_engine(e, d, dts[d.id], engine) for e, d in zip(engs, devs, strict=True)]
    ids = {d.id: (e.id if e else None) for e, d in zip(engs, devs, strict=True)}
    if len(devs) == 1:
        return {"engine": ids[devs[0].id], "engine_accuracy": notes[0]}, [f"engine: {notes[0]}"]
    # one text line per distinct note (devices of one family and engine share it)
    short: dict[str, list[str]] = {}
    for e, d in zip(engs, devs, strict=True):
        short.setdefault(describe_engine(e, d, dts[d.id], engine, where="there"), []).append(d.id)
    lines = [f"engine on {', '.join(ds)}: {n}" for n, ds in short.items()]
    return {"engine": ids, "engine_accuracy": dict(zip(ids, notes, strict=True))}, lines
