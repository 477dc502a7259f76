"""PD planner, step 1: enumerate and evaluate per-phase configurations.

**Enumerate** per-phase configurations: device type × TP (× decode batch cap). Each
prefill configuration is evaluated against every decode *class* (device, TP), since
the KV transfer in its TTFT depends on the receiver (``perfmodel.pd_models``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from hardware.device import Device
from hardware.engine import Engine, engine_for
from hardware.maxaffine import MaxAffine
from perfmodel.errors import InfeasibleError, SpecError
from perfmodel.memory import describe_shortfall
from perfmodel.model import ModelSpec
from perfmodel.pd.config import PhaseConfig, PhaseGoodput, kv_link
from perfmodel.pd.decode import DecodeProfile, decode_goodput, decode_profile
from perfmodel.pd.prefill import PrefillProfile, prefill_goodput, prefill_profile
from perfmodel.plan import ParallelPlan
from perfmodel.serving.stationary import one_blas_thread as one_blas_thread  # re-export
from perfmodel.units import MS_PER_S
from perfmodel.workload.lengths import LengthDistribution
from perfmodel.workload.slo import SLO

TP_CANDIDATES = (1, 2, 4, 8)


# ---- enumeration -----------------------------------------------------------------------------


@dataclass(frozen=True)
class PhaseOptions:
    """Evaluated configurations: prefill per decode class, decode per class."""

    prefill: dict[tuple[str, int], list[PhaseGoodput]]
    decode: dict[tuple[str, int], list[PhaseGoodput]]
    links: dict[tuple[str, int], str]
    profiles: dict[tuple[str, int], list[DecodeProfile]]


def parallel_plan(tp: int, dtype: str, kv_dtype: str, *, ep: int = 1, dp: int = 1) -> ParallelPlan:
    return ParallelPlan(tp=tp, weight_dtype=dtype, act_dtype=dtype, kv_dtype=kv_dtype, ep=ep, dp=dp)


def valid_tps(model: ModelSpec, tps: Sequence[int] = TP_CANDIDATES) -> list[int]:
    return model.valid_tps(tps)


#: An engine, or a spec resolved per device by :func:`hardware.engine.engine_for`.
EngineSpec = Engine | str | None

#: Calibrated phase profiles, keyed ``(phase, device id, TP)``.
PhaseProfiles = Mapping[tuple[str, str, int], MaxAffine]


def phase_tps(
    model: ModelSpec, phase: str, dev: Device, tps: Sequence[int], profiles: PhaseProfiles | None
) -> list[tuple[int, MaxAffine | None]]:
    """TP degrees to enumerate for a phase on a device, with their calibrated profiles.

    A phase with a calibrated profile for some TP on this device is enumerated only at
    the TPs that have one (a measured profile is not mixed with roofline configurations
    of the same phase and device); otherwise every valid TP, costed by the roofline.
    """
    valid = valid_tps(model, tps)
    mine = {k[2]: v for k, v in (profiles or {}).items() if k[:2] == (phase, dev.id)}
    if not mine:
        return [(tp, None) for tp in valid]
    return [(tp, mine[tp]) for tp in valid if tp in mine]


@dataclass(frozen=True)
class ProfiledOptions:
    """The SLO-free half of :func:`evaluate_options`: each configuration's phase profile
    with its memo key (:func:`goodput_of` turns one into a goodput at an SLO)."""

    prefill: dict[tuple[str, int], list[tuple[tuple[Any, ...], PrefillProfile]]]
    decode: dict[tuple[str, int], list[tuple[tuple[Any, ...], DecodeProfile]]]
    links: dict[tuple[str, int], str]


def goodput_of(
    memo: dict[tuple[Any, ...], Any],
    key: tuple[Any, ...],
    profile: PrefillProfile | DecodeProfile,
    slo: SLO,
    model: ModelSpec,
) -> PhaseGoodput:
    """The goodput of a :class:`ProfiledOptions` entry at ``slo``, memoized by target (a
    prefill goodput depends on the TTFT target only, a decode one on the TPOT target only:
    an SLO sweep asks again at the same targets). A prefill goodput depends on the decode
    class only through the KV transfer: it is kept by the transfer times and the link
    instead of the class (decode TPs on one link often give the same transfer: 146
    prefill searches instead of 240 in a five-device plan)."""
    if isinstance(profile, PrefillProfile):
        _, dev, tp, _cls, prompts = key
        gkey = (
            "prefill-goodput", dev, tp, prompts, profile.transfer_s.tobytes(),
            repr(profile.link), slo.ttft_s, slo.percentile,
        )  # fmt: skip
        if gkey not in memo:
            memo[gkey] = prefill_goodput(profile, slo, model=model)
    else:
        gkey = ("decode-goodput", *key[1:], slo.tpot_s, slo.percentile)
        if gkey not in memo:
            memo[gkey] = decode_goodput(profile, slo)
    return cast(PhaseGoodput, memo[gkey])


def evaluate_options(
    model: ModelSpec,
    lengths: LengthDistribution,
    slo: SLO,
    *,
    memo: dict[tuple[Any, ...], Any] | None = None,
    **options: Any,
) -> PhaseOptions:
    """Per-instance goodputs of every configuration that fits (see the module docstring).

    ``options``: those of :func:`profile_options`. ``memo``: the SLO-free phase profiles
    (:func:`profile_options`) and the goodputs by target (:func:`goodput_of`), shared by
    calls that differ only in ``slo`` or ``lengths``; same answers.
    Raises InfeasibleError when the model fits no configuration of a phase.
    """
    memo = {} if memo is None else memo
    po = profile_options(model, lengths, memo=memo, **options)
    dec = {c: [goodput_of(memo, k, d, slo, model) for k, d in v] for c, v in po.decode.items()}
    pre = {c: [goodput_of(memo, k, p, slo, model) for k, p in v] for c, v in po.prefill.items()}
    profs = {c: [d for _, d in v] for c, v in po.decode.items()}
    return PhaseOptions(pre, dec, po.links, profs)


def profile_options(
    model: ModelSpec,
    lengths: LengthDistribution,
    *,
    prefill_devices: Sequence[Device],
    decode_devices: Sequence[Device],
    dtype: str = "bf16",
    kv_dtype: str = "bf16",
    decode_batch_caps: Sequence[int | None] = (None,),
    placement: str = "auto",
    tp_candidates: Sequence[int] = TP_CANDIDATES,
    profiles: PhaseProfiles | None = None,
    kv_capacity_tokens: Mapping[tuple[str, int], int] | None = None,
    ep: int = 1,
    dp: int = 1,
    memo: dict[tuple[Any, ...], Any] | None = None,
    engine: EngineSpec = None,
) -> ProfiledOptions:
    """The phase profiles of every configuration that fits (see the module docstring).

    ``profiles``: calibrated phase cost profiles by ``(phase, device id, TP)`` (see
    :func:`phase_tps`); configurations without one are costed by the roofline.
    ``kv_capacity_tokens``: measured decode KV capacities by ``(device id, TP)``
    (default: ``memory_fit``). ``memo``: the profiles, keyed by the length atoms they
    depend on (a prefill entry by the prompts only), so calls that differ only in
    ``lengths`` share it (a length sweep; same model, devices, dtypes, placement and
    engine); same answers. ``engine``: the serving engine of every instance, or a
    spec resolved per device (``"auto"``: each device's default; ``None``: none).
    Raises InfeasibleError when the model fits no configuration of a phase.
    """
    memo = {} if memo is None else memo
    max_in = int(lengths.input_tokens.max())
    # the length atoms a memo entry depends on: a prefill entry the prompts, a decode one all
    prompts = (lengths.input_tokens.tobytes(), lengths.weights.tobytes())
    atoms = (*prompts, lengths.output_tokens.tobytes())
    tp_candidates = [t for t in tp_candidates if (t * dp) % ep == 0]
    if not tp_candidates:
        raise SpecError(f"ep={ep} divides tp·dp for no TP candidate; choose ep dividing dp·tp")
    pre_cfgs: list[PhaseConfig] = []
    short: list[str] = []
    for dev in prefill_devices:
        for tp, prof in phase_tps(model, "prefill", dev, tp_candidates, profiles):
            plan = parallel_plan(tp, dtype, kv_dtype, ep=ep, dp=dp)
            cfg = PhaseConfig("prefill", dev, plan, profile=prof, engine=engine_for(engine, dev))
            fkey = ("prefill-fit", dev.id, tp, max_in)
            if fkey not in memo:  # None: it fits, else the shortfall
                fit = cfg.instance(model).memory_fit(
                    batch=2, context_len=max_in, max_batched_tokens=max_in
                )
                memo[fkey] = None if fit.fits else describe_shortfall(fit, model, dev, tp)
            if memo[fkey] is None:
                pre_cfgs.append(cfg)
            else:
                short.append(memo[fkey])
    if not pre_cfgs:
        raise InfeasibleError(
            f"{model.id} fits no prefill configuration (TP {', '.join(map(str, tp_candidates))}): "
            + "; ".join(short[-1:])
        )
    dec: dict[tuple[str, int], list[tuple[tuple[Any, ...], DecodeProfile]]] = {}
    links: dict[tuple[str, int], str] = {}
    reasons: list[str] = []
    probe_p = pre_cfgs[0]
    for dev in decode_devices:
        for tp, cost in phase_tps(model, "decode", dev, tp_candidates, profiles):
            for cap in decode_batch_caps:
                kv = (kv_capacity_tokens or {}).get((dev.id, tp))
                cfg = PhaseConfig(
                    "decode",
                    dev,
                    parallel_plan(tp, dtype, kv_dtype, ep=ep, dp=dp),
                    cap,
                    cost,
                    kv,
                    engine_for(engine, dev),
                )
                key = ("decode", dev.id, tp, cap, probe_p.device.id, probe_p.plan.tp, atoms)
                if key not in memo:
                    try:
                        link = kv_link(
                            probe_p, cfg, "scale-out" if placement == "scale-out" else "auto"
                        )
                        memo[key] = decode_profile(model, cfg, lengths, link=link)
                    except InfeasibleError as e:
                        memo[key] = e
                dprof = memo[key]
                if isinstance(dprof, InfeasibleError):
                    reasons.append(str(dprof))
                    continue
                dec.setdefault((dev.id, tp), []).append((key, dprof))
    if not dec:
        raise InfeasibleError(
            f"{model.id} fits no decode configuration: " + (reasons[-1] if reasons else "")
        )
    pre: dict[tuple[str, int], list[tuple[tuple[Any, ...], PrefillProfile]]] = {}
    for cls, entries in dec.items():
        dcfg = entries[0][1].config
        for pc in pre_cfgs:
            pkey = ("prefill", pc.device.id, pc.plan.tp, cls, prompts)
            if pkey not in memo:
                try:
                    memo[pkey] = prefill_profile(
                        model, pc, lengths, decode=dcfg, placement=placement
                    )
                except SpecError:
                    memo[pkey] = None  # this pair cannot use the requested placement
            pprof = memo[pkey]
            if pprof is None:
                continue
            pre.setdefault(cls, []).append((pkey, pprof))
            links.setdefault(cls, pprof.link.name)
    return ProfiledOptions(pre, dec, links)


def check_feasible(opts: PhaseOptions, slo: SLO) -> None:
    """Clear errors when no configuration of a phase can meet its SLO even unloaded."""
    q = f"p{slo.percentile * 100:g}"
    pre = [g for gs in opts.prefill.values() for g in gs]
    if not any(g.feasible for g in pre):
        best = min(pre, key=lambda g: g.floor_s)
        if best.limiter == "kv-link":
            raise InfeasibleError(
                f"the KV link is too slow (binding constraint: kv-link): {best.note}; the "
                f"TTFT SLO {slo.ttft_s * MS_PER_S:.0f} ms cannot be met -- use a faster link "
                "(--kv-link scale-up) or raise --ttft-slo-ms"
            )
        raise InfeasibleError(
            f"TTFT SLO {slo.ttft_s * MS_PER_S:.0f} ms is below the unloaded {q} TTFT floor of "
            f"{best.floor_s * MS_PER_S:.1f} ms (best: {best.config.label}, {best.note}); raise "
            f"--ttft-slo-ms to at least {math.ceil(best.floor_s * MS_PER_S)}"
        )
    dec = [g for gs in opts.decode.values() for g in gs]
    if not any(g.feasible for g in dec):
        best = min(dec, key=lambda g: g.floor_s)
        raise InfeasibleError(
            f"TPOT SLO {slo.tpot_s * MS_PER_S:.1f} ms is below the unloaded {q} TPOT floor of "
            f"{best.floor_s * MS_PER_S:.2f} ms (best: {best.config.label}); raise --tpot-slo-ms "
            f"to at least {math.ceil(best.floor_s * 1e4) / 10:.1f}"
        )
