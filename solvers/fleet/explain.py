"""Why the planner chose its fleet, and which price changes would flip the choice."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hardware.engine import engine_label
from perfmodel.cost.power import power_model
from perfmodel.cost.prices import PriceBook
from perfmodel.units import MS_PER_S
from solvers.fleet.candidates import Candidate, Unsearched
from solvers.fleet.results import Alternative, Fleet


def _money(x: float | None, priced: bool) -> str:
    if x is None:
        return "n/a"
    return f"${x:,.2f}/h" if priced else f"{x:g} devices"


def _cost(f: Fleet, priced: bool) -> float:
    c = f.economics.cost_per_hour_usd
    return c if priced and c is not None else float(f.devices)


def unit_costs(
    cands: Sequence[Candidate], prices: PriceBook, *, priced: bool
) -> list[tuple[float, Candidate]]:
    """Feasible candidates by cost per req/s of goodput (lowest first)."""
    out = []
    for c in cands:
        if not c.feasible:
            continue
        p = prices.price(c.device.id) if priced else 1.0
        out.append(((p or 0.0) * c.devices / c.goodput_per_instance_per_s, c))
    return sorted(out, key=lambda t: t[0])


def explain(
    rec: Fleet,
    singles: Mapping[str, Alternative],
    colo: Alternative,
    pd: Alternative | None,
    cands: Sequence[Candidate],
    prices: PriceBook,
    priced: bool,
    rejected: Sequence[str] = (),
) -> tuple[str, ...]:
    """Plain-language reasons, each with its numbers (``rejected``: the configurations
    without a candidate, those left unsearched as dominated among them)."""
    unit = "$/h per req/s" if priced else "devices per req/s"
    why = []
    unsearched = sum(isinstance(r, Unsearched) for r in rejected)
    ranked = unit_costs([c for c in cands if c.role == "colocated"], prices, priced=priced)
    if ranked:
        top = ", ".join(f"{c.label} {u:.3g}" for u, c in ranked[:3])
        why.append(
            f"cheapest colocated configurations ({unit} of goodput): {top}"
            + (f" (TP degrees dominated by a smaller one of the same device, not searched "
               f"to the end: {unsearched}, in the rejected configurations)" if unsearched else "")
        )  # fmt: skip
    feas = {k: a for k, a in singles.items() if a.fleet is not None}
    if feas:
        best_t, best = min(feas.items(), key=lambda kv: _cost(kv[1].fleet, priced))  # type: ignore[arg-type]
        assert best.fleet is not None
        c_best, c_rec = _cost(best.fleet, priced), _cost(rec, priced)
        if len(rec.device_types) > 1 and c_rec < c_best - 1e-9:
            why.append(
                f"the mix ({rec.summary}) costs {_money(c_rec, priced)}, "
                f"{(1 - c_rec / c_best):.1%} less than the best single-type fleet "
                f"({best.fleet.summary}, {_money(c_best, priced)}): " + _mix_reason(rec)
            )
        else:
            why.append(
                f"no mix of device types beats the best single type: {best_t} "
                f"({_money(c_best, priced)})"
            )
    if pd is not None and colo.fleet is not None and pd.fleet is not None:
        cc, cp = _cost(colo.fleet, priced), _cost(pd.fleet, priced)
        word = "cheaper" if cp < cc else "dearer"
        why.append(
            f"disaggregated serving ({pd.fleet.summary}) is {word} than colocated "
            f"({colo.fleet.summary}): {_money(cp, priced)} vs {_money(cc, priced)}"
        )
    elif pd is not None and pd.fleet is None:
        why.append(f"no disaggregated fleet: {pd.reason}")
    why.append(f"binding constraint: {rec.binding}")
    return tuple(why)


def _mix_reason(rec: Fleet) -> str:
    if any(p.buckets for p in rec.pools):
        return "; ".join(
            f"{', '.join(f'{f:.0%} of {b}' for b, f in p.buckets)} go to {p.candidate.label} "
            f"(goodput {p.candidate.goodput_per_instance_per_s:.3g} req/s per instance on that mix)"
            for p in rec.pools
        )
    roles = {p.candidate.role for p in rec.pools}
    if roles & {"prefill", "decode"}:
        pre = sorted({p.candidate.device.id for p in rec.pools if p.candidate.role == "prefill"})
        dec = sorted({p.candidate.device.id for p in rec.pools if p.candidate.role == "decode"})
        if pre != dec:
            return (
                f"prefill runs where prefill goodput is cheapest ({', '.join(pre)}) and decode "
                f"where decode goodput is cheapest ({', '.join(dec)})"
            )
    big = max(rec.pools, key=lambda p: p.rate_per_s)
    rest = [p for p in rec.pools if p is not big]
    return (
        f"{big.candidate.label} carries {big.rate_per_s:.3g} req/s; whole instances of it would "
        f"leave capacity idle, so the remainder ({sum(p.rate_per_s for p in rest):.3g} req/s) "
        f"goes to smaller or cheaper instances ({', '.join(p.candidate.label for p in rest)})"
    )


def price_flips(
    rec: Fleet, singles: Mapping[str, Alternative], prices: PriceBook
) -> tuple[str, ...]:
    """For each device type not in the mix: the price at which its fleet alone ties the mix.

    A single-type fleet's cost is linear in its device price, so the all-``t`` fleet is
    cheaper than the recommendation below ``price_t × cost_rec / cost_t``.
    """
    c_rec = rec.economics.cost_per_hour_usd
    if c_rec is None:
        return ()
    out = []
    used = set(rec.device_types)
    for t, alt in sorted(singles.items()):
        f = alt.fleet
        p = prices.price(t)
        if f is None or p is None or f.economics.cost_per_hour_usd is None:
            continue
        c_t = f.economics.cost_per_hour_usd
        if t in used and len(used) == 1:
            continue
        flip = p * c_rec / c_t
        out.append(
            f"{t}: an all-{t} fleet ({f.summary}, ${c_t:,.2f}/h) wins below "
            f"${flip:.2f}/h per device (now ${p:.2f}, {flip / p - 1:+.0%})"
        )
    return tuple(out)


def assumptions(inputs: Any) -> dict[str, Any]:
    """What the plan assumed, with provenance."""
    devs = {}
    for d in inputs.devices:
        pm = power_model(d)
        e = inputs.prices.get(d.id)
        devs[d.id] = {
            "price_per_hour_usd": e.price_per_hour_usd,
            "price_source": e.source,
            "max_devices": e.max_devices,
            "min_devices": e.min_devices,
            "power": pm.to_dict() if pm else None,
        }
    w = inputs.workload
    return {
        "model": inputs.model.id,
        "workload": w.name,
        "mean_input_tokens": w.lengths.mean_input_tokens,
        "mean_output_tokens": w.lengths.mean_output_tokens,
        "arrival_cv": w.arrival_cv,
        "rate_per_s": inputs.rate_per_s,
        "headroom": inputs.headroom,
        "planned_demand_per_s": inputs.demand_per_s,
        "slo": {
            "ttft_ms": inputs.slo.ttft_s * MS_PER_S,
            "tpot_ms": inputs.slo.tpot_s * MS_PER_S,
            "percentile": inputs.slo.percentile,
            "goal": inputs.slo.goal,
        },
        "engine": engine_label(inputs.engine, inputs.devices),
        "max_batched_tokens": inputs.max_batched_tokens,
        "allow_pd": inputs.allow_pd,
        "devices": devs,
        "goodput": "largest Poisson rate with SLO attainment >= goal (perfmodel.queueing); "
        "PD roles: DistServe percentile criterion per phase (solvers.pd_enumerate)",
        "power_model": "P(u) = idle + (TDP - idle) * u (perfmodel.cost.power)",
    }


def no_candidate(cands: Sequence[Candidate], rejected: Sequence[str], inputs: Any) -> str:
    """Why no configuration can serve at all (memory or the SLO), and what to change."""
    slo = inputs.slo
    q = f"p{slo.percentile * 100:g}"
    tried = [c for c in cands if c.role == "colocated"]
    if not tried:
        why = "; ".join(rejected[-2:]) or "no configuration fits in memory"
        return (
            f"{inputs.model.id} fits no configuration of {', '.join(d.id for d in inputs.devices)} "
            f"(binding constraint: memory): {why} -- add devices with more memory"
        )
    best = tried[0]
    return (
        f"no configuration meets {q} TTFT <= {slo.ttft_s * MS_PER_S:g} ms and TPOT <= "
        f"{slo.tpot_s * MS_PER_S:g} ms at goal {slo.goal:.0%} (binding constraint: SLO); e.g. "
        f"{best.label}: {best.note} -- relax --ttft-slo-ms / --tpot-slo-ms or add faster devices"
    )
