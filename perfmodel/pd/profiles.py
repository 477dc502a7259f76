"""Calibrated per-phase cost profiles for the PD planner (loaded by ``hardware.profile_io``).

A phase profile is a :class:`hardware.maxaffine.MaxAffine` over the phase's features
(:data:`PREFILL_FEATURES` or :data:`DECODE_FEATURES`, see
``perfmodel.pd_config.PHASE_FEATURES``) measured for one model on one TP group of one
device, e.g. DistServe's OPT-13B A100 prefill ``a + b·Σl + c·Σl²``. Its provenance says
what it was measured on: ``device``, ``dtype`` and ``op = "<model>_<phase>_tp<N>"``
(``opt-13b_prefill_tp2``); the loader checks all four against the plan, so a profile is
never applied to another model, phase, TP degree, device or dtype.

Published profiles ship in ``hardware/profiles/published/`` (DistServe's OPT-13B on
A100-80GB); they carry no held-out error of ours, so they live apart from the fitted
profiles of ``hardware/profiles/`` and load by path.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from hardware.maxaffine import MaxAffine
from hardware.profile_io import load_profile
from perfmodel.errors import SpecError
from perfmodel.pd.config import PHASES

PREFILL_FEATURES = ("prefill_tokens", "prefill_tokens_sq", "prefill_seqs")
DECODE_FEATURES = ("decode_seqs", "decode_tokens")
_FEATURES = {"prefill": PREFILL_FEATURES, "decode": DECODE_FEATURES}
_OP = re.compile(r"^(?P<model>.+)_(?P<phase>prefill|decode)_tp(?P<tp>[1-9][0-9]*)$")


def phase_profile_tp(
    profile: MaxAffine, *, phase: str, model_id: str, dtype: str, where: str
) -> int:
    """The TP degree a phase profile was measured at, after checking it fits the plan.

    Raises SpecError (one line, naming ``where``) when the features are not the phase's,
    or the provenance ``op``/``dtype`` names another model, phase or dtype.
    """
    if phase not in PHASES:
        raise SpecError(f"phase must be one of {PHASES}, got {phase!r}")
    want = _FEATURES[phase]
    bad = [f for f in profile.features if f not in want]
    if bad:
        raise SpecError(
            f"{where}: features {', '.join(profile.features)} are not {phase} features; a "
            f"{phase} profile uses {', '.join(want)}"
        )
    m = _OP.match(profile.provenance.op)
    if m is None:
        raise SpecError(
            f"{where}: provenance op {profile.provenance.op!r} does not name a phase profile; "
            f"expected <model>_{phase}_tp<N> (e.g. {model_id}_{phase}_tp1)"
        )
    if m["phase"] != phase:
        raise SpecError(f"{where}: is a {m['phase']} profile, given as the {phase} profile")
    if m["model"] != model_id:
        raise SpecError(f"{where}: was measured for model {m['model']!r}, not {model_id!r}")
    if profile.provenance.dtype != dtype:
        raise SpecError(
            f"{where}: was measured in {profile.provenance.dtype}, not {dtype}; pass "
            f"--dtype {profile.provenance.dtype}"
        )
    return int(m["tp"])


def load_phase_profiles(
    specs: Iterable[str], *, phase: str, model_id: str, device_id: str, dtype: str
) -> dict[tuple[str, str, int], MaxAffine]:
    """Phase profiles by ``(phase, device id, TP)``, each spec a file path or ``device:op``.

    At most one profile per TP degree; every profile must be measured on ``device_id``.
    """
    out: dict[tuple[str, str, int], MaxAffine] = {}
    for spec in specs:
        prof = load_profile(spec, device=device_id)
        tp = phase_profile_tp(prof, phase=phase, model_id=model_id, dtype=dtype, where=spec)
        key = (phase, device_id, tp)
        if key in out:
            raise SpecError(f"two {phase} profiles for TP{tp} on {device_id}; give one per TP")
        out[key] = prof
    return out
