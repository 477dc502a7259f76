"""The prefill-backlog chain against closed forms it must reproduce in limiting cases."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from perfmodel.serving.chain_tail import TAIL_MASS, tail_rate
from perfmodel.serving.compound_poisson import compound_poisson
from perfmodel.serving.prefill_chain import BacklogChain, Transition, grid_pmf, solve_chain
from perfmodel.serving.tagged import tagged_request


def test_compound_poisson_unit_jumps_is_poisson() -> None:
    """``CP(r, δ₁)`` is Poisson(r); the mass beyond the grid is lumped at its top. The
    transform has at least ``2n`` points: what wraps around is the mass beyond ``2n``."""
    pmf = compound_poisson(np.array([3.7, 0.2]), np.array([0.0, 1.0]), 12)
    k = np.arange(11)
    wrap = stats.poisson.sf(2 * 12 - 1, 3.7)  # 1.7e-12
    assert np.allclose(pmf[0, :11], stats.poisson.pmf(k, 3.7), atol=1e-13 + wrap)
    assert pmf[0, 11] == pytest.approx(stats.poisson.sf(10, 3.7), abs=1e-13 + wrap)
    assert pmf[1, 0] == pytest.approx(np.exp(-0.2), rel=1e-12)


def test_grid_pmf_keeps_the_mean() -> None:
    tokens, w = np.array([100, 250, 1000]), np.array([0.2, 0.5, 0.3])
    f = grid_pmf(tokens, w, 128.0)
    assert f.sum() == pytest.approx(1.0)
    assert 128.0 * np.dot(np.arange(f.size), f) == pytest.approx(np.dot(tokens, w))


def _affine_chain(
    a: float, c: float, delta: float, G: int, prompt_steps: int, lam: float
) -> BacklogChain | None:
    tau = a + c * delta * np.arange(G + 1)
    f = np.zeros(prompt_steps + 1)
    f[prompt_steps] = 1.0
    return solve_chain(tau, f, rate_per_s=lam, decode_seqs=0.0, budget_tokens=G * delta)


def test_stationary_law_is_invariant() -> None:
    """``π·T = π``, with ``T`` assembled densely from its definition."""
    rng = np.random.default_rng(3)
    G, f = 8, rng.random(20)
    f /= f.sum()
    ch = solve_chain(
        0.01 + 0.002 * np.arange(G + 1), f, rate_per_s=20.0, decode_seqs=0.0, budget_tokens=8.0
    )
    assert ch is not None
    n, A = ch.states, ch.transition.arrivals
    T = np.zeros((n, n))
    T[: G + 1] = A
    for i in range(G + 1, n):
        T[i, i - G :] = A[G][: n - i + G]
        T[i, -1] += 1 - T[i].sum()
    assert np.allclose(ch.stationary @ T, ch.stationary, atol=1e-14)
    x = rng.random(n)
    assert np.allclose(Transition(A)(x), x @ T, atol=1e-13)


def test_gated_branching_limit() -> None:
    """Affine step time, a budget that never binds: the gated branching process.

    Iteration ``k + 1`` carries the prompts that arrived during iteration ``k``:
    ``X' = a + Σ_{N(X)} Δ`` with ``N ~ Poisson(λX)`` and ``Δ = c·s``, so ``ρ = λΔ``,
    ``b̄ = a/(1 − ρ)``, ``Var X = λ·b̄·Δ²/(1 − ρ²)`` and ``E[X' | X] = a + ρX``. A request
    arriving in an iteration (length-biased, ``E[X²]/b̄``) is served in the next one,
    ``X_R = a + Δ + ρ·E[X²]/b̄`` (Slivnyak–Mecke), and its j-th decode iteration has mean
    ``b̄ + ρ^j (X_R − b̄)``. Hand-derived, independent of the chain's construction.
    """
    a, c, delta, G, lam = 0.01, 2e-5, 500.0, 32, 50.0
    s = 500.0  # one grid step; 32 prompts would be needed to fill the budget
    ch = _affine_chain(a, c, delta, G, 1, lam)
    assert ch is not None
    d = c * s
    rho = lam * d
    b = a / (1 - rho)
    ex2 = b * b + lam * b * d * d / (1 - rho**2)
    assert ch.mean_step_s == pytest.approx(b, rel=1e-9)
    assert ch.mean_residual_s == pytest.approx(ex2 / (2 * b), rel=1e-9)
    assert ch.full_fraction < 1e-12
    tg = tagged_request(ch, decode_step_s=ch.step_s, max_steps=100, rel_tol=1e-9)
    x_r = a + d + rho * ex2 / b
    assert tg.full_iterations < 1e-9
    assert tg.last_prefill_s == pytest.approx(x_r, rel=1e-7)
    j = np.arange(1, 11)
    assert np.allclose(tg.decode_step_s[:10], b + rho**j * (x_r - b), rtol=1e-7)
    # TPOT over n decode steps is the mean of the profile
    n = np.array([1.0, 5.0, 50.0])
    want = [np.mean(b + rho ** np.arange(1, k + 1) * (x_r - b)) for k in (1, 5, 50)]
    assert np.allclose(tg.mean_tpot_s(n), want, rtol=1e-6)


def test_prompt_longer_than_the_budget() -> None:
    """A lone prompt of 2.5 budgets: two full iterations, then one with half a budget."""
    a, c, delta, G = 0.01, 2e-5, 100.0, 32
    ch = _affine_chain(a, c, delta, G, 80, 1e-6)
    assert ch is not None
    tg = tagged_request(ch, decode_step_s=ch.step_s, max_steps=10)
    assert tg.full_iterations == pytest.approx(2.0, rel=1e-6)
    assert tg.full_wait_s == pytest.approx(2 * (a + c * G * delta), rel=1e-6)
    assert tg.last_prefill_s == pytest.approx(a + c * 16 * delta, rel=1e-5)
    assert tg.decode_step_s[0] == pytest.approx(a, rel=1e-5)  # nothing left behind


def test_overloaded_prompts_are_not_recurrent() -> None:
    """``λ·τ(B')·E[s] ≥ B'``: prompts arrive faster than full iterations serve them."""
    a, c, delta, G = 0.01, 2e-5, 100.0, 32
    full = a + c * G * delta
    lam_edge = G / (full * 10)  # prompts of 10 grid steps
    assert _affine_chain(a, c, delta, G, 10, 1.01 * lam_edge) is None
    assert _affine_chain(a, c, delta, G, 10, 0.9 * lam_edge) is not None


def test_tail_rate_of_unit_jumps_is_lambert_w() -> None:
    """Unit jumps, one grid step per budget: ``r(e^θ − 1) = θ``, whose positive root is
    ``θ = −W₋₁(−r·e^{−r}) − r`` (the principal branch gives the trivial root 0)."""
    from scipy.special import lambertw

    for r in (0.2, 0.5, 0.9):
        exact = float(np.real(-lambertw(-r * np.exp(-r), -1))) - r
        assert tail_rate(r, np.array([0.0, 1.0]), 1) == pytest.approx(exact, rel=1e-6)
    assert tail_rate(1.2, np.array([0.0, 1.0]), 1) == 0.0  # drifts up: no tail


def test_the_backlog_decays_at_the_tail_rate() -> None:
    """``log π(u)`` falls with slope ``−θ`` through the grid (two-atom prompts of 4.3
    budgets, a busy engine): fitted over the upper half below the top budget."""
    G = 16
    f = grid_pmf(np.array([1100]), np.array([1.0]), 16.0)  # 68.75 grid steps
    tau = 0.02 + 0.0004 * np.arange(G + 1)
    lam = 0.8 * G / (tau[G] * np.dot(np.arange(f.size), f))
    ch = solve_chain(tau, f, rate_per_s=lam, decode_seqs=0.0, budget_tokens=16.0 * G)
    assert ch is not None
    theta = tail_rate(lam * tau[G], f, G)
    # budget masses (smooth out the lattice of the prompt size), then their decay per step
    mass = ch.stationary[: ch.levels * G].reshape(ch.levels, G).sum(axis=1)
    half = np.arange(ch.levels // 2, ch.levels - 1)
    slope = np.polyfit(half * G, np.log(mass[half]), 1)[0]
    assert -slope == pytest.approx(theta, rel=0.03)


def _counted_solves(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """The grids of the chain's stationary solves from now on, in order: (G, budgets)."""
    import perfmodel.serving.prefill_chain as pc
    from perfmodel.serving.stationary import stationary as real

    solves: list[tuple[int, int]] = []

    def counted(arrivals: np.ndarray) -> np.ndarray:
        G = arrivals.shape[0] - 1
        solves.append((G, (arrivals.shape[1] - 1) // G))
        return real(arrivals)

    monkeypatch.setattr(pc, "stationary", counted)
    return solves


def _long_prompts_at_half_drift(**kw: int) -> BacklogChain | None:
    """Prompts of 4.3 budgets (G = 16) at drift 0.5: the chain from a first grid of 12."""
    G = 16
    f = grid_pmf(np.array([1100]), np.array([1.0]), 16.0)
    tau = 0.02 + 0.0004 * np.arange(G + 1)
    lam = 0.5 * G / (tau[G] * np.dot(np.arange(f.size), f))
    return solve_chain(tau, f, rate_per_s=lam, decode_seqs=0.0, budget_tokens=16.0 * G, **kw)


def test_a_regrown_grid_costs_less_than_doubling(monkeypatch: pytest.MonkeyPatch) -> None:
    """Prompts of 4.3 budgets at drift 0.5, from a first grid of 12 budgets: regrown by
    the tail (12 -> 48 -> 58 budgets) the solves cost 0.48 of doubling's (12 -> 24 -> 48 ->
    96, the work of a solve ~ states²), and the top budget still holds < TAIL_MASS."""
    import perfmodel.serving.prefill_chain as pc

    def run() -> list[int]:
        solves = _counted_solves(monkeypatch)
        ch = _long_prompts_at_half_drift()
        assert ch is not None and ch.stationary[-16:].sum() < TAIL_MASS
        return solves

    regrown = run()
    monkeypatch.setattr(pc, "regrown_levels", lambda pi, levels, G, theta: 2 * levels)
    doubled = run()
    assert [lv for _, lv in regrown] == [12, 48, 58]
    assert [lv for _, lv in doubled] == [12, 24, 48, 96]
    work = sum(lv * lv for _, lv in regrown) / sum(lv * lv for _, lv in doubled)
    assert work == pytest.approx(0.48, abs=0.02)


def test_a_grid_capped_below_its_tail_says_how_many_budgets_it_wants(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The case above with ``max_levels=24``: the first grid (12 budgets) would regrow to
    48, past the cap, so that grid is not solved; the chain of the one solve says 48."""
    solves = _counted_solves(monkeypatch)
    capped = _long_prompts_at_half_drift(max_levels=24)
    assert capped is not None and solves == [(16, 12)]
    assert capped.levels == 12 and capped.wanted_levels == 48
    full = _long_prompts_at_half_drift(max_levels=64)  # the cap is not reached: no wish
    assert full is not None and full.wanted_levels == 0 and full.levels == 58


def test_a_backlog_spanning_many_budgets_is_on_the_halved_grid(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``COARSE_LEVELS``: a chain whose grid needs more budgets than that is solved on
    ``G/2`` points per budget — at once where its first grid is known to (a caller's
    ``min_levels``, prompts spanning 16 budgets), else when a solve's tail on ``G`` asks
    for it (8k-token prompts on 4×H100 near μ: the light-load decode count's chain regrew
    to 128 budgets on the fine grid, 9x the work) — and its top budget holds
    < ``TAIL_MASS`` unless the grid is at ``MAX_LEVELS``."""
    from hardware.device import load_device
    from hardware.engine import engine_for
    from perfmodel.model import load_model
    from perfmodel.serving.prefill_chain import (
        COARSE_LEVELS,
        GRID_PER_BUDGET,
        MAX_LEVELS,
        backlog_chain,
        prompt_law,
    )
    from perfmodel.serving.service import service_rate
    from perfmodel.step.instance import Instance
    from perfmodel.workload.lengths import fixed_lengths
    from perfmodel.workload.presets import Workload
    from solvers.pd.enumerate import parallel_plan

    d = load_device("h100-sxm")
    fine, half = GRID_PER_BUDGET, GRID_PER_BUDGET // 2

    def chain(tp: int, s: int, frac: float, n_d: float, **kw: int) -> list[tuple[int, int]]:
        inst = Instance(
            load_model("llama-3.1-8b"), d, parallel_plan(tp, "bf16", "bf16"),
            engine=engine_for("auto", d),
        )  # fmt: skip
        lengths = fixed_lengths(s, 32)
        sv = service_rate(inst, Workload("fixed", lengths), max_batched_tokens=2048)
        solves = _counted_solves(monkeypatch)
        ch = backlog_chain(
            inst, prompt_law(lengths), sv.moments, rate_per_s=frac * sv.rate_per_s,
            decode_seqs=n_d, max_batched_tokens=2048, **kw,
        )  # fmt: skip
        assert ch is not None and (ch.per_budget, ch.levels) == solves[-1]
        assert ch.per_budget == (half if ch.levels > COARSE_LEVELS else fine)
        top = float(ch.stationary[-ch.per_budget :].sum())
        assert top < TAIL_MASS or ch.levels == MAX_LEVELS
        return solves

    assert chain(4, 8192, 0.1, 1.0) == [(fine, 12), (fine, 17)]  # small: the fine grid
    assert chain(4, 8192, 0.5, 1.1) == [(fine, 12), (half, 47)]  # the tail asked
    assert chain(4, 8192, 0.957, 1.3)[-1] == (half, MAX_LEVELS)
    assert chain(4, 8192, 0.1, 1.0, min_levels=30) == [(half, 30)]  # known at once
    assert chain(1, 32768, 0.05, 1.0) == [(half, 36)]  # 16-budget prompts: at once


@pytest.mark.parametrize(("G", "n"), [(4, 49), (8, 97), (16, 161)])
def test_the_backward_product_is_t_times_f(G: int, n: int) -> None:
    """``Transition.backward(f) = T·f`` for arrival laws over the whole grid (every row
    reaches the top state, where the lumped mass sits): the correlation behind it is
    circular on ~2n points, and a shorter one would wrap the top of ``f`` onto its
    bottom."""
    rng = np.random.default_rng(G)
    A = rng.random((G + 1, n))
    A /= A.sum(axis=1, keepdims=True)
    T = np.zeros((n, n))
    T[: G + 1] = A
    for i in range(G + 1, n):
        T[i, i - G :] = A[G][: n - i + G]
        T[i, -1] += 1 - T[i].sum()
    g = rng.standard_normal(n)
    g[-1] = 50.0
    np.testing.assert_allclose(Transition(A).backward(g), T @ g, rtol=0, atol=1e-12)
