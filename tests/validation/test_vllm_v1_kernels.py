"""vllm-v1's A100 16-bit kernel efficiencies are the fit of Vidur's measured linear layers.

``hardware/engines/vllm-v1.toml`` [efficiency."ampere/fp16"] states gemm_compute 0.728 and
memory 0.737 as the roofline fitted to ../shared/data/vidur-profiling/a100__*__mlp.csv
(``benchmarks/fit_vidur_linear.py``): the file must keep matching its source, and the
fit must describe the kernels (median APE ≤ 6 %, stable when a model is left out).
"""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.fit_vidur_linear import ape, fit, read_rows
from hardware.engine import load_engine
from tests.conftest import shared_file


@pytest.fixture(scope="module")
def rows() -> dict[str, np.ndarray]:
    return read_rows("a100", shared_file("vidur-profiling"))


def test_engine_file_states_the_vidur_fit(rows: dict[str, np.ndarray]) -> None:
    ec, em = fit("a100-sxm-80gb", rows)
    eff = load_engine("vllm@0.8").kernel_efficiency("a100-40gb", "bf16")
    assert eff.gemm_compute == pytest.approx(ec, abs=0.001)
    assert eff.memory == pytest.approx(em, abs=0.001)
    assert np.median(ape("a100-sxm-80gb", rows, ec, em)) <= 0.06


def test_fit_holds_without_each_model(rows: dict[str, np.ndarray]) -> None:
    ec, em = fit("a100-sxm-80gb", rows)
    for model in sorted(set(rows["model"])):
        keep = rows["model"] != model
        c, m = fit("a100-sxm-80gb", {k: v[keep] for k, v in rows.items()})
        assert c == pytest.approx(ec, abs=0.01) and m == pytest.approx(em, abs=0.01)
        held = {k: v[~keep] for k, v in rows.items()}
        assert np.median(ape("a100-sxm-80gb", held, c, m)) <= 0.07
