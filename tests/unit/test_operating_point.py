"""The operating point's fixed point (perfmodel.serving.operating_point), checked on its
own equations: whatever the search's path, the point it returns must satisfy Little's
law twice to its tolerance, with ``τ₊`` the step time at ``N̄ + 1`` decodes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from hardware.device import load_device
from hardware.engine import engine_for
from perfmodel.model import load_model
from perfmodel.plan import ParallelPlan
from perfmodel.serving import service as q
from perfmodel.serving.latency import _length_atoms
from perfmodel.serving.operating_point import TOL, _FixedPoint
from perfmodel.serving.prefill_chain import prefill_step_s
from perfmodel.serving.tagged import TaggedStart, tagged_request
from perfmodel.step.instance import Instance
from perfmodel.workload.lengths import fixed_lengths
from perfmodel.workload.presets import Workload, preset


def _service(workload: Workload, *, engine: str | None = "auto") -> q.ServiceRate:
    dev = load_device("h100-sxm")
    inst = Instance(
        load_model("llama-3.1-8b"), dev, ParallelPlan(tp=1), engine=engine_for(engine, dev)
    )
    return q.service_rate(inst, workload, max_batched_tokens=2048)


@pytest.fixture(scope="module")
def short() -> q.ServiceRate:
    """Fixed 128-token prompts and outputs: TensorRT-LLM pads the decode batch, so
    ``τ₊`` and ``b̄`` step with the decode count and the residual of ``n_d`` jumps."""
    return _service(Workload("fixed-128-128", fixed_lengths(128, 128)))


@pytest.fixture(scope="module")
def chat() -> q.ServiceRate:
    return _service(preset("chat"))


def _check_equations(sv: q.ServiceRate, est: q.LatencyEstimate) -> None:
    op = est.point
    assert op is not None
    chain, lam, m = op.chain, est.rate_per_s, sv.moments
    atoms = _length_atoms(sv.workload.lengths)
    pos = atoms.decode_steps >= 1
    mean_n = float(atoms.decode_weights[pos] @ atoms.decode_steps[pos])
    n_d = chain.decode_seqs
    # n_d = λ·b̄·E[o − 1]/P(busy)
    assert lam * chain.mean_step_s * m.decode_steps / op.busy == pytest.approx(n_d, rel=TOL)
    # τ₊ is the step with N̄ + 1 decodes on the chain's grid, to the bit
    grid = chain.prompt_grid_tokens
    tau = prefill_step_s(
        sv.instance, m, atoms.prompts, prompt_tokens=grid, decode_seqs=op.decoders + 1
    )
    assert np.array_equal(op.decode_step_s[: grid.size], tau)
    # N̄ = λ·(E[n]·π·τ₊ + excess): the excess of the last tagged request moved by < TOL
    e_inf = float(chain.stationary @ op.decode_step_s)
    assert lam * (mean_n * e_inf + op.excess_s) == pytest.approx(op.decoders, rel=2 * TOL)


@pytest.mark.parametrize("rho", [0.05, 0.5, 0.9, 0.98])
def test_the_point_satisfies_its_equations(short: q.ServiceRate, rho: float) -> None:
    est = q.latency(short, rho * short.rate_per_s)
    assert est.stable
    _check_equations(short, est)


@pytest.mark.parametrize("rho", [0.3, 0.7, 0.95])
def test_the_point_satisfies_its_equations_on_chat(chat: q.ServiceRate, rho: float) -> None:
    est = q.latency(chat, rho * chat.rate_per_s)
    assert est.stable
    _check_equations(chat, est)


def test_near_the_critical_rate_the_point_is_found(short: q.ServiceRate) -> None:
    """At 114.24 req/s (98.4 % of μ = 116.05) the fixed point exists: the residual of
    ``n_d`` changes sign between 800 (+11.6) and 900 (−2.1) decodes (probed by hand).
    The per-coordinate secant iteration before overshot to 1,570 decodes, where the
    chain is not recurrent, and called the rate unstable."""
    assert short.rate_per_s == pytest.approx(116.05, rel=1e-3)
    est = q.latency(short, 114.23641)
    assert est.stable
    assert 800 < est.decode_batch < 900
    _check_equations(short, est)


def _fixed_point(sv: q.ServiceRate, rate_per_s: float) -> _FixedPoint:
    """The fixed point of ``sv`` at ``rate_per_s``, before any tagged-request terms."""
    atoms = _length_atoms(sv.workload.lengths)
    pos = atoms.decode_steps >= 1
    return _FixedPoint(
        sv.instance, atoms.prompts, sv.moments, rate_per_s=rate_per_s,
        max_batched_tokens=2048,
        mean_steps=float(atoms.decode_weights[pos] @ atoms.decode_steps[pos]), levels=4,
    )  # fmt: skip


def test_the_residual_is_a_function_of_n_d(short: q.ServiceRate) -> None:
    """A search needs ``h(n_d)`` to be a function: the same ``n_d`` evaluated again
    (its chain then cached) gives the same residual and decoders, in either mode."""
    fp = _fixed_point(short, 100.0)
    for exact in (False, True):
        a = fp.evaluate(292.5714, exact=exact)
        fp.evaluate(300.0, exact=exact)
        fp.exact.clear()  # computed again, not the kept exact evaluation
        b = fp.evaluate(292.5714, exact=exact)
        assert a is not None and b is not None
        assert (a.h, a.decoders, a.busy) == (b.h, b.decoders, b.busy)


def test_an_exact_evaluation_is_made_once_per_point_and_terms(
    short: q.ServiceRate, monkeypatch: pytest.MonkeyPatch
) -> None:
    """:meth:`_FixedPoint.solve` checks its point exactly and its exact search starts
    there: the second evaluation is the first one's result (no step time), until the
    tagged-request terms change, which make it a new point."""
    import perfmodel.serving.operating_point as op_mod

    fp = _fixed_point(short, 100.0)
    calls: list[float] = []
    real = op_mod._plus_step_s

    def counted(*a: Any) -> Any:
        calls.append(a[-1])
        return real(*a)

    monkeypatch.setattr(op_mod, "_plus_step_s", counted)
    a = fp.evaluate(292.5714, exact=True)
    first = len(calls)
    assert first >= 1  # N̄'s secant steps took step times
    assert fp.evaluate(292.5714, exact=True) is a
    assert len(calls) == first
    fp.excess = 0.01  # N̄ = λ·(E[n]·π·τ₊ + excess): one more decoder at 100 req/s
    b = fp.evaluate(292.5714, exact=True)
    assert b is not None and a is not None and b is not a
    assert b.decoders == pytest.approx(a.decoders + 1.0, rel=0.02)
    fp.ttft = 0.05  # a new TTFT is a new point too (here P(busy) is 1 either way)
    assert fp.evaluate(292.5714, exact=True) is not b
    assert len(calls) > first


def test_a_kept_tagged_start_gives_the_same_request(chat: q.ServiceRate) -> None:
    """The tagged request from a :class:`TaggedStart` kept from an earlier profile (its
    laws ξ·T^j reused) equals the one computed afresh, to the bit."""
    op = q.latency(chat, 0.7 * chat.rate_per_s).point
    assert op is not None
    start = TaggedStart(op.chain)
    tagged_request(op.chain, decode_step_s=op.decode_step_s * 0.9, max_steps=500, start=start)
    kept = tagged_request(op.chain, decode_step_s=op.decode_step_s, max_steps=500, start=start)
    fresh = tagged_request(op.chain, decode_step_s=op.decode_step_s, max_steps=500)
    assert np.array_equal(kept.decode_step_s, fresh.decode_step_s)
    assert np.array_equal(kept.start_law, fresh.start_law)
    assert (kept.full_wait_s, kept.last_prefill_s, kept.tail_ratio) == (
        fresh.full_wait_s, fresh.last_prefill_s, fresh.tail_ratio,
    )  # fmt: skip


def test_the_lowest_of_several_roots() -> None:
    """Prompts of 128 tokens, outputs of 184, at 85.94 req/s (96.9 % of μ): the residual
    of ``n_d`` crosses zero three times, near 725 (down), 768 (up) and 830 (down) — the
    engine pads the decode batch, so ``b̄`` steps with ``n_d`` (probed by hand over
    650-890). The physical point is the lowest, where a load rising from zero settles;
    a secant step from 641 decodes once jumped to 872 and the bracket closed on 830."""
    sv = _service(Workload("fixed-128-184", fixed_lengths(128, 184)))
    est = q.latency(sv, 85.9411)
    assert est.decode_batch == pytest.approx(725.2, rel=2e-3)
    _check_equations(sv, est)
