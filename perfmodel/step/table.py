"""An instance's iteration time tabulated for the simulator: one iteration in a few ops.

``step_time`` sums per-operator times. For a batch with ``T`` tokens, ``R`` logit rows,
prefill pairs ``P``, decode pairs ``Q`` (context + one per decode), KV tokens read ``K``:

* every operator except attention and the LM head depends on ``T`` only -> a table
  ``token_s[T]`` for ``T = 0 … T_max`` (exact at integers, tile padding included);
* the LM head (and its logits gather) and the engine's host time (fixed + per request,
  one request per logit row) depend on ``R`` only -> ``rows_s[R]``;
* attention is one roofline op: ``max(a·P + b·Q, c·K + d·T) + overhead``, its
  coefficients read from ``step_time`` on unit batches.

The table is *checked* against ``step_time`` on random batches when built; if the
cost profile is not of this form (max error above ``1e-6`` relative), ``exact`` is
False and :meth:`StepTable.time_s` calls :meth:`Instance.iteration_s` directly (slow
but correct) — as for an instance with a calibrated iteration profile.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from perfmodel.step.batch import Batch
from perfmodel.step.instance import Instance, OnInstance
from perfmodel.step.time import HOST_OP, StepTime

Arr = NDArray[np.float64]
_ATTN = "attention"
#: ops that depend on the logit rows R only: the LM head, and the engine's host time
#: (fixed + per request; one request per row: ``Batch.logit_rows`` counts the sequences)
_ROW_OPS = ("lm_head", "logits_gather", HOST_OP)
_CHECK_TOL = 1e-6


def _sum_ops(st: StepTime, names: tuple[str, ...], include: bool) -> Arr:
    total = np.zeros_like(st.total_s)
    for o in st.ops:
        if (o.name in names) == include:
            total = total + o.total_s
    return total


@dataclass(frozen=True)
class StepTable(OnInstance):
    instance: Instance
    max_tokens: int
    token_s: Arr  # index T
    rows_s: Arr  # index R
    attn_prefill_pair_s: float
    attn_decode_pair_s: float
    attn_kv_token_s: float
    attn_token_s: float
    attn_decode_kv_extra_s: float  # per decode-context token beyond a prefill KV token
    attn_overhead_s: float
    exact: bool
    max_rel_error: float

    def time_s(
        self,
        tokens: int,
        rows: int,
        prefill_pairs: float,
        decode_pairs: float,
        kv_read_tokens: float,
        *,
        prefill_tokens: int = 0,
        prefill_seqs: int = 0,
        decode_seqs: int = 0,
    ) -> float:
        """Seconds of one iteration (the keyword counts are needed only if not ``exact``)."""
        if tokens <= 0:
            return 0.0
        if not self.exact:
            b = Batch(
                *(
                    np.asarray(float(v))
                    for v in (
                        prefill_tokens,
                        prefill_seqs,
                        prefill_pairs,
                        kv_read_tokens - (decode_pairs - decode_seqs),
                        decode_seqs,
                        decode_pairs - decode_seqs,
                    )
                )
            )
            return float(self.instance.iteration_s(b))
        c = self.attn_prefill_pair_s * prefill_pairs + self.attn_decode_pair_s * decode_pairs
        m = self.attn_kv_token_s * kv_read_tokens + self.attn_token_s * tokens
        m += self.attn_decode_kv_extra_s * (decode_pairs - decode_seqs)
        return float(self.token_s[tokens] + self.rows_s[rows]) + max(c, m) + self.attn_overhead_s

    def iteration_fn(self) -> Callable[[int, int, float, float, float, int, int, int], float]:
        """:meth:`time_s` as a plain function of positional arguments, for the simulator.

        Equal bit for bit to ``time_s`` (the same float operations, the tables read as
        Python floats: no numpy scalar per call); a subclass overriding :meth:`time_s`
        or a non-``exact`` table goes through it.
        """
        if not self.exact or type(self).time_s is not StepTable.time_s:
            tt = self.time_s
            return lambda tok, rows, pp, dp, kv, ptok, pseq, dseq: tt(
                tok, rows, pp, dp, kv, prefill_tokens=ptok, prefill_seqs=pseq, decode_seqs=dseq
            )
        token_s, rows_s = self.token_s.tolist(), self.rows_s.tolist()
        a_pp, a_dp = float(self.attn_prefill_pair_s), float(self.attn_decode_pair_s)
        a_kv, a_tok = float(self.attn_kv_token_s), float(self.attn_token_s)
        a_dx = float(self.attn_decode_kv_extra_s)
        over = float(self.attn_overhead_s)

        def time_s(
            tokens: int, rows: int, pp: float, dp: float, kv: float, _pt: int, _ps: int, ds: int
        ) -> float:
            if tokens <= 0:
                return 0.0
            c = a_pp * pp + a_dp * dp
            m = a_kv * kv + a_tok * tokens
            m += a_dx * (dp - ds)
            return token_s[tokens] + rows_s[rows] + max(c, m) + over

        return time_s

    def decode_step_fn(self, seqs: int) -> Callable[[int], float]:
        """``x ↦`` time of one decode-only iteration of ``seqs`` requests with total context ``x``.

        Equal bit for bit to ``time_s(seqs, seqs, 0.0, x + seqs, x, decode_seqs=seqs)``
        (the same float operations), with the terms that do not depend on ``x`` hoisted;
        a subclass overriding :meth:`time_s` or a non-``exact`` table goes through it.
        """
        if not self.exact or type(self).time_s is not StepTable.time_s or seqs <= 0:
            return lambda x: self.time_s(seqs, seqs, 0.0, x + seqs, x, decode_seqs=seqs)
        base = float(self.token_s[seqs] + self.rows_s[seqs])
        zero = self.attn_prefill_pair_s * 0.0
        a_dp, a_kv, tok = self.attn_decode_pair_s, self.attn_kv_token_s, self.attn_token_s * seqs
        a_dx, over = self.attn_decode_kv_extra_s, self.attn_overhead_s
        return lambda x: base + max(zero + a_dp * (x + seqs), a_kv * x + tok + a_dx * x) + over

    def decode_run_s(self, seqs: int, context_tokens: int, steps: int) -> Arr:
        """Times of ``steps`` consecutive decode-only iterations of ``seqs`` requests.

        Iteration ``i`` reads a total context of ``context_tokens + i·seqs`` (every request
        appends one token per iteration). Element ``i`` equals
        ``time_s(seqs, seqs, 0.0, x_i + seqs, x_i, decode_seqs=seqs)`` bit for bit: the same
        float operations in the same order, vectorized over ``i``. A subclass that
        overrides :meth:`time_s`, or a table that is not ``exact``, is evaluated one
        iteration at a time through :meth:`time_s`.
        """
        x = context_tokens + seqs * np.arange(steps, dtype=np.int64)
        if not self.exact or type(self).time_s is not StepTable.time_s:
            return np.array(
                [self.time_s(seqs, seqs, 0.0, xi + seqs, xi, decode_seqs=seqs) for xi in x.tolist()]
            )
        if seqs <= 0:
            return np.zeros(steps)
        c = self.attn_prefill_pair_s * 0.0 + self.attn_decode_pair_s * (x + seqs)
        m = self.attn_kv_token_s * x + self.attn_token_s * seqs
        m += self.attn_decode_kv_extra_s * x
        base = float(self.token_s[seqs] + self.rows_s[seqs])
        return base + np.maximum(c, m) + self.attn_overhead_s

    def batch_time_s(self, b: Batch) -> Arr:
        """Vectorized table evaluation of batches with integer token and row counts."""
        T = np.asarray(b.tokens).astype(np.int64)
        R = np.asarray(b.logit_rows).astype(np.int64)
        q = b.decode_context + b.decode_seqs
        c = self.attn_prefill_pair_s * b.prefill_pairs + self.attn_decode_pair_s * q
        m = self.attn_kv_token_s * b.kv_read_tokens + self.attn_token_s * b.tokens
        m = m + self.attn_decode_kv_extra_s * b.decode_context
        t = self.token_s[T] + self.rows_s[R] + np.maximum(c, m) + self.attn_overhead_s
        return np.where(T > 0, t, 0.0)


def build_step_table(
    inst: Instance,
    max_tokens: int,
    *,
    rng: np.random.Generator | None = None,
) -> StepTable:
    """Tabulate ``step_time`` for batches of up to ``max_tokens`` tokens and verify it."""
    T = np.arange(max_tokens + 1, dtype=np.float64)
    z = np.zeros_like(T)
    by_tokens = inst.step(Batch(T, z, z, z, z, z))
    token_s = _sum_ops(by_tokens, (_ATTN, *_ROW_OPS), include=False)
    token_s[0] = 0.0
    by_rows = inst.step(Batch(z, T, z, z, z, z))
    rows_s = _sum_ops(by_rows, _ROW_OPS, include=True)

    def attn(b: Batch) -> tuple[float, float, float]:
        op = inst.step(b).op(_ATTN)
        return float(op.compute_s), float(op.memory_s), float(op.total_s)

    one, zero = np.asarray(1.0), np.asarray(0.0)
    c_pp, _, _ = attn(Batch(zero, zero, one, zero, zero, zero))
    # one decode seq with zero context: 1 pair, 1 token (for T), 0 KV read
    c_dp, m_tok, tot = attn(Batch(zero, zero, zero, zero, one, zero))
    _, m_kv_plus, _ = attn(Batch(zero, zero, zero, one, zero, zero))
    # a decode-context token may cost more than a prefill one (an engine's K/V re-reads
    # across grouped query heads, software dequantization): the difference, 0 without one
    _, m_kv_dec, _ = attn(Batch(zero, zero, zero, zero, zero, one))
    overhead = tot - max(c_dp, m_tok)
    table = StepTable(
        instance=inst,
        max_tokens=max_tokens,
        token_s=token_s,
        rows_s=rows_s,
        attn_prefill_pair_s=c_pp,
        attn_decode_pair_s=c_dp,
        attn_kv_token_s=m_kv_plus,
        attn_token_s=m_tok,
        attn_decode_kv_extra_s=m_kv_dec - m_kv_plus,
        attn_overhead_s=overhead,
        exact=True,
        max_rel_error=0.0,
    )
    err = _check(table, rng or np.random.default_rng(0))
    if err > _CHECK_TOL:
        return StepTable(**{**table.__dict__, "exact": False, "max_rel_error": err})
    return StepTable(**{**table.__dict__, "max_rel_error": err})


def random_batches(max_tokens: int, n: int, rng: np.random.Generator) -> Batch:
    """Mixed batches with integer counts within a token budget (for checks and tests)."""
    dec = rng.integers(0, max_tokens // 2 + 1, n).astype(float)
    pre = np.floor(rng.random(n) * (max_tokens - dec)).astype(float)
    seqs = np.where(pre > 0, rng.integers(1, 4, n), 0).astype(float)
    ctx = rng.integers(0, 20000, n).astype(float)
    pairs = pre * ctx + pre * (pre + 1) / 2
    return Batch(pre, seqs, pairs, ctx + pre, dec, dec * rng.integers(1, 8000, n))


def _check(table: StepTable, rng: np.random.Generator) -> float:
    b = random_batches(table.max_tokens, 64, rng)
    ref = table.instance.iteration_s(b)
    got = table.batch_time_s(b)
    ok = ref > 0
    return float(np.max(np.abs(got[ok] - ref[ok]) / ref[ok], initial=0.0))
