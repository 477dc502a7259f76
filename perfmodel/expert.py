"""The MoE expert block on one device as a max-affine profile derived from the roofline.

One grouped-GEMM expert FFN (gate/up + down, ``mats`` matrices of ``hidden x
inter``) on a device, with ``G`` activated experts and ``N`` token rows in total:

    memory piece:  t = overhead + G · (mats·hidden·inter·w_bytes) / (eff_m·BW)
    compute piece: t = overhead + N · (2·mats·hidden·inter)      / (eff_c·peak)

``N`` is the tile-padded row count (each expert's rows rounded up to 128) when
``padded=True`` is used by the caller. The crossover in tokens per activated expert is
``n* = (weight bytes per expert / BW_eff) / (FLOPs per token per expert / peak_eff)``
= ridge_eff · w_bytes / 2 for any expert shape.
"""

from __future__ import annotations

import numpy as np

from hardware.device import Device
from hardware.maxaffine import MaxAffine, Provenance
from hardware.roofline import Roofline
from perfmodel.dtypes import get_dtype
from perfmodel.model import ModelSpec


def expert_shape(model: ModelSpec, tp: int = 1) -> tuple[int, int, int]:
    """(hidden, intermediate per device, matrices) of one routed expert."""
    if model.moe is None:
        from perfmodel.errors import SpecError

        raise SpecError(f"{model.id} is not a mixture-of-experts model")
    mats = 3 if model.gated_mlp else 2
    return model.hidden, model.moe.expert_intermediate // tp, mats


def derived_expert_profile(
    device: Device,
    hidden: int,
    inter: int,
    *,
    mats: int = 3,
    weight_dtype: str = "bf16",
    act_dtype: str = "bf16",
    roofline: Roofline | None = None,
) -> MaxAffine:
    """Roofline-implied ``t = max(a + b·G, c + β·N)`` for one device's expert block."""
    prof = roofline or Roofline(device)
    w = get_dtype(weight_dtype).bytes
    expert_bytes = mats * hidden * inter * w
    flops_per_token = 2.0 * mats * hidden * inter
    b = expert_bytes / prof.byte_rate
    beta = flops_per_token / prof.flop_rate(act_dtype)
    ov = prof.overhead_s
    return MaxAffine(
        features=("G", "N"),
        intercepts_s=np.array([ov, ov]),
        slopes=np.array([[b, 0.0], [0.0, beta]]),
        provenance=Provenance(
            device.id, f"moe_expert_{hidden}x{inter}x{mats}", dtype=act_dtype, source="derived"
        ),
        piece_names=("weights", "tokens"),
    )


def crossover_tokens(profile: MaxAffine) -> float:
    """n*: tokens per activated expert where the G piece and the N piece are equal.

    For a profile ``max(a + b·G, c + β·N)`` evaluated at N = n·G: ``a + b·G = c + β·n·G``
    gives ``n* = (b + (a − c)/G) / β``; the intercept term vanishes for large G, so n* is
    reported as ``b / β`` (the per-expert balance point).
    """
    i_g = profile.features.index("G")
    i_n = profile.features.index("N")
    b = profile.slopes[:, i_g].max()
    beta = profile.slopes[:, i_n].max()
    return float(b / beta)
