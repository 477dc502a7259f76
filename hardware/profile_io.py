"""Max-affine profiles as TOML files with their provenance.

Calibrated profiles live next to the devices, ``hardware/profiles/<device>__<op>.toml``,
and load by ``"<device>:<op>"`` (e.g. ``h100-sxm:gemm_bf16``); a user can pass a file
path instead. File format (SI units: seconds, seconds per unit of each feature)::

    features = ["flop_padded", "weight_elems", "act_elems", "log2_k"]
    piece_names = ["compute", "memory"]      # optional
    intercepts_s = [5e-06, 5e-06]
    slopes = [[1.5e-15, 0.0, 0.0, 0.0],      # one row per piece, one column per feature
              [0.0, 7.4e-13, 7.4e-13, 0.0]]

    [residual]                               # optional: measured corrections,
    neighbours = 4                           # see hardware.residual
    radius = 0.31
    offset = [...]; centre = [...]; scale = [...]
    points = [[...], ...]                    # standardized log features of the rows
    log_ratio = [...]                        # log(measured / max-affine) per row

    [provenance]
    device = "h100-sxm"
    op = "gemm_bf16"
    dtype = "bf16"
    source = "h100_sxm__gemm.csv"           # or "derived"
    rows = 35700
    train_mape = 4.9                        # percent (median absolute percentage error)
    heldout_mape = 5.0
    notes = "..."
"""

from __future__ import annotations

import json
import math
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from hardware.maxaffine import MaxAffine, Provenance
from hardware.residual import ResidualSurface
from perfmodel.datafile import read_data_file
from perfmodel.errors import SpecError

PROVENANCE_FIELDS = (
    "device", "op", "dtype", "source", "rows", "train_mape", "heldout_mape",
    "residual_heldout_mape",
)  # fmt: skip


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise SpecError("profile values must be finite")
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise SpecError(f"cannot write {type(v).__name__} to a profile file")


def profile_to_toml(profile: MaxAffine) -> str:
    """The TOML text of a profile (see the module docstring)."""
    lines = [
        f"# max-affine cost profile: t = max_k (intercepts_s[k] + slopes[k] . x), seconds; "
        f"device {profile.provenance.device}, op {profile.provenance.op}",
        f"features = {_toml_value(list(profile.features))}",
    ]
    if profile.piece_names:
        lines.append(f"piece_names = {_toml_value(list(profile.piece_names))}")
    lines.append(f"intercepts_s = {_toml_value([float(a) for a in profile.intercepts_s])}")
    rows = ",\n  ".join(_toml_value([float(b) for b in r]) for r in profile.slopes)
    lines += [f"slopes = [\n  {rows},\n]", "", "[provenance]"]
    for k, v in vars(profile.provenance).items():
        if v is None:
            continue  # TOML has no null: an absent error means "not measured"
        lines.append(f"{k} = {_toml_value(v)}")
    if profile.residual is not None:
        lines += ["", "[residual]"]
        for k, v in profile.residual.to_dict().items():
            if k == "points":
                body = ",\n  ".join(_toml_value(r) for r in v)
                lines.append(f"points = [\n  {body},\n]" if v else "points = []")
            else:
                lines.append(f"{k} = {_toml_value(v)}")
    return "\n".join(lines) + "\n"


def profile_from_dict(data: dict[str, Any], *, where: str) -> MaxAffine:
    """Build a profile from parsed TOML; errors name the file and the field."""
    for key in ("features", "intercepts_s", "slopes", "provenance"):
        if key not in data:
            raise SpecError(f"{where}: missing field {key!r}")
    prov = data["provenance"]
    if not isinstance(prov, dict) or "device" not in prov or "op" not in prov:
        raise SpecError(f"{where}: [provenance] needs at least device and op")
    known = set(Provenance.__dataclass_fields__)
    extra = set(prov) - known
    if extra:
        raise SpecError(f"{where}: unknown [provenance] field(s) {sorted(extra)}")
    try:
        residual = None
        if "residual" in data:
            if not isinstance(data["residual"], dict):
                raise SpecError("[residual] must be a table")
            residual = ResidualSurface.from_dict(data["residual"])
        return MaxAffine(
            features=tuple(str(f) for f in data["features"]),
            intercepts_s=np.asarray(data["intercepts_s"], dtype=np.float64),
            slopes=np.asarray(data["slopes"], dtype=np.float64),
            provenance=Provenance(**prov),
            piece_names=tuple(str(p) for p in data.get("piece_names", ())),
            residual=residual,
        )
    except (TypeError, ValueError) as e:
        if isinstance(e, SpecError):
            raise SpecError(f"{where}: {e}") from None
        raise SpecError(f"{where}: malformed profile ({e})") from None


def load_profile_file(path: str | Path) -> MaxAffine:
    p = Path(path)
    data = read_data_file(p, what="profile file")
    return profile_from_dict(data, where=str(p))


def catalog_profiles() -> list[str]:
    """``device:op`` names of the built-in calibrated profiles."""
    files = resources.files("hardware.profiles").iterdir()
    return sorted(
        f.name.removesuffix(".toml").replace("__", ":", 1)
        for f in files
        if f.name.endswith(".toml") and "__" in f.name
    )


def load_profile(spec: str | Path, *, device: str | None = None) -> MaxAffine:
    """A profile by ``"<device>:<op>"`` or by file path.

    ``device``: the device the caller is modeling; a profile measured on another device is
    an error (a profile does not transfer between devices).
    """
    s = str(spec)
    if s.endswith(".toml") or "/" in s or Path(s).is_file():
        prof = load_profile_file(s)
    else:
        if ":" not in s:
            raise SpecError(
                f"profile {s!r}: give <device>:<op> (e.g. h100-sxm:gemm_bf16) or a path"
            )
        dev, op = s.split(":", 1)
        names = catalog_profiles()
        if s not in names:
            raise SpecError(
                f"no calibrated profile {s!r}; built-in: {', '.join(names) or 'none'} "
                "(or fit one with `perfmodel profile fit` and pass its path)"
            )
        ref = resources.files("hardware.profiles").joinpath(f"{dev}__{op}.toml")
        with resources.as_file(ref) as p:
            prof = load_profile_file(p)
    if device is not None and prof.provenance.device != device:
        raise SpecError(
            f"profile {s} was measured on {prof.provenance.device!r}, not {device!r}; "
            f"fit or pick a profile for {device}"
        )
    return prof
