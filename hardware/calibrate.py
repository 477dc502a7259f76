"""Calibrating the roofline (compute and memory efficiency, overhead) to measured latencies."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike, NDArray

if TYPE_CHECKING:
    from hardware.device import Device
    from hardware.roofline import Roofline


Arr = NDArray[np.float64]


def calibrate_roofline(
    device: Device, flops: ArrayLike, bytes_: ArrayLike, y: ArrayLike, *, dtype: str = "bf16"
) -> Roofline:
    """The roofline with efficiencies and overhead fitted to measured times.

    Minimizes the soft-L1 relative error of ``max(flops/(e_c·peak), bytes/(e_m·BW)) + ov``
    over ``e_c, e_m ∈ (0, 1]``, ``ov ≥ 0``. Used as the baseline a max-affine profile must
    beat.
    """
    from scipy.optimize import least_squares

    from hardware.roofline import Roofline

    f = np.asarray(flops, dtype=np.float64)
    b = np.asarray(bytes_, dtype=np.float64)
    t = np.asarray(y, dtype=np.float64)
    ideal = Roofline(device, eff_compute=1.0, eff_memory=1.0, overhead_s=0.0).times(
        f, b, dtype=dtype
    )
    fs, bs, ts = ideal.compute_s, ideal.memory_s, float(np.median(t))

    def res(p: Arr) -> Arr:
        return (np.maximum(fs * p[0], bs * p[1]) + ts * p[2]) / t - 1.0

    r = least_squares(
        res, np.array([1.25, 1.25, 0.1]), bounds=([1.0, 1.0, 0.0], [1e3, 1e3, 1e3]),
        loss="soft_l1", f_scale=0.02,
    )  # fmt: skip
    return Roofline(
        device,
        eff_compute=float(1.0 / r.x[0]),
        eff_memory=float(1.0 / r.x[1]),
        overhead_s=float(ts * r.x[2]),
    )
