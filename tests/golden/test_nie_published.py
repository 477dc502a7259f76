"""Nie–Si–Zhou's measured stable rates (arXiv 2605.04595; formal_models.md §1.1 and T2).

Llama-3-8B on one A100 under vLLM v1, chunk = budget = 512, KV 131,000 tokens (a 40 GB
A100 at vLLM's 0.9 memory fraction), uniform lengths (1:1 ``s, o ~ U(10, 1600)``, 2:1
``s ~ U(10, 2133), o ~ U(10, 1066)``, 1:2 reversed, mixed = half 2:1 then half 1:2,
8 GPUs = 8 independent 1:1 replicas); ``vllm@0.8`` (the V1 file, not fitted to these
rows: its A100 16-bit kernel efficiencies are Vidur's measured linear layers,
``benchmarks/fit_vidur_linear.py``) with the recompute-preemption term through its
prefix cache. Measured (req/s): 1:1 3.387, 2:1 3.650, 1:2 2.969, mixed 3.137, 8 GPUs
26.710, LongBench v2 0.610 (formal_models.md T2; LongBench has no length distribution
here: unrepresentable). Issue 12 asks 1:1 within 10 % and the other splits within
12 %. ``benchmarks/validate_nie.py`` prints them: 1:1 3.161 (−6.7 %), 2:1 3.971
(+8.8 %), 1:2 2.695 (−9.2 %), mixed 3.211 (+2.4 %), 8 GPUs 25.290 (−5.3 %); with V0's
fitted A100 efficiencies (0.95 / 0.585) they were −16.1 / +2.3 / −20.4 / −7.7 / −14.9 %.
The pinned values (±2 %) catch a drift of the model; the bands are the acceptance.
"""

from __future__ import annotations

import pytest

from benchmarks.validate_nie import MEASURED, predicted_rates
from hardware.device import load_device
from hardware.engine import load_engine
from perfmodel.model import load_model
from perfmodel.plan import ParallelPlan
from perfmodel.step.instance import Instance

#: the model's rates when the V1 A100 efficiencies came from the Vidur kernel fit (req/s)
PREDICTED = {"1:1": 3.161, "2:1": 3.971, "1:2": 2.695, "mixed": 3.211, "8 GPUs 1:1": 25.290}
#: issue 12's acceptance: 1:1 within 10 %, the other published splits within 12 %
BAND = {"1:1": 0.10, "2:1": 0.12, "1:2": 0.12, "mixed": 0.12, "8 GPUs 1:1": 0.12}


@pytest.fixture(scope="module")
def rates() -> dict[str, tuple[float, float]]:
    inst = Instance(
        load_model("llama-3.1-8b"), load_device("a100-40gb"), ParallelPlan(),
        engine=load_engine("vllm@0.8"),
    )  # fmt: skip
    return predicted_rates(inst)


@pytest.mark.parametrize("split", list(MEASURED))
def test_published_split_within_the_asked_band(
    rates: dict[str, tuple[float, float]], split: str
) -> None:
    assert rates[split][0] == pytest.approx(MEASURED[split], rel=BAND[split])


@pytest.mark.parametrize("split", list(PREDICTED))
def test_predicted_rate_pinned(rates: dict[str, tuple[float, float]], split: str) -> None:
    assert rates[split][0] == pytest.approx(PREDICTED[split], rel=0.02)


def test_splits_order_as_measured(rates: dict[str, tuple[float, float]]) -> None:
    # measured 2:1 > 1:1 > 1:2 (longer outputs hold KV longer)
    assert rates["2:1"][0] > rates["1:1"][0] > rates["1:2"][0]
