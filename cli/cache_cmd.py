"""``perfmodel cache plan``: split device memory among KV, expert cache and adapters.

``--out FILE.html`` adds the figure (objective over the split grid, hit ratio vs size).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli import options as po
from cli.common import JsonOpt, echo_json, fail, handle_errors, progress, table, write_atomic
from perfmodel.units import MS_PER_S

if TYPE_CHECKING:
    from perfmodel.model import ModelSpec
    from solvers.cache.budget import CacheBudgetSpec, CachePlan

app = typer.Typer(
    help="Memory budgets: KV cache vs offloaded-expert cache vs LoRA adapters.",
    no_args_is_help=True,
)

Objective = Annotated[str, typer.Option(help="goodput (SLO goodput at the rate) | tpot.")]
Budget = Annotated[
    float | None, typer.Option("--budget-gib", help="Device memory to split (default 90% HBM).")
]
Offload = Annotated[bool, typer.Option(help="Keep routed experts in host memory, cache some.")]
ExpDtype = Annotated[str, typer.Option(help="Precision of cached experts (bf16, fp8, int4).")]
ExpZipf = Annotated[float, typer.Option(help="Zipf exponent of expert popularity (0 = uniform).")]
ExpCounts = Annotated[
    Path | None, typer.Option(help="Recorded routing counts CSV (step,layer,e0,...).")
]
ExpPolicy = Annotated[str, typer.Option(help="Expert cache policy: lru | static.")]
LowDtype = Annotated[
    str | None, typer.Option(help="Low-precision fallback for missed experts (e.g. int4).")
]
LowFrac = Annotated[float, typer.Option(help="Fraction of misses loaded in low precision.")]
Prefetch = Annotated[float, typer.Option(help="Fraction of misses prefetched (overlapped).")]
Adapters = Annotated[int, typer.Option(help="LoRA adapters in the catalog (0 = none).")]
Rank = Annotated[int, typer.Option(help="LoRA rank.")]
AdZipf = Annotated[float, typer.Option(help="Zipf exponent of adapter popularity.")]
AdSource = Annotated[str, typer.Option(help="Where missed adapters come from: host | nvme.")]
NvmeGbps = Annotated[
    float, typer.Option("--nvme-gb-per-s", help="NVMe read bandwidth (GB/s, decimal).")
]
Levels = Annotated[int, typer.Option(help="Grid levels for this pool.")]


def _plan(spec: Any) -> Any:
    from solvers.cache.budget import plan_cache_budget

    n = spec.kv_levels * (spec.expert_levels if spec.offload_experts else 1)
    with progress(n, "splits") as tick:
        return plan_cache_budget(spec, progress=tick)


@app.command("plan")
@handle_errors
def plan_cmd(
    model: po.ModelOpt = po.DEFAULT_MODEL,
    hardware: po.HardwareOpt = po.DEFAULT_HARDWARE,
    tp: po.TpOpt = 1,
    workload: po.WorkloadOpt = po.DEFAULT_WORKLOAD,
    trace: po.TraceOpt = None,
    rate_per_s: po.RateOpt = 1.0,
    ttft_slo_ms: po.TtftSloOpt = po.DEFAULT_TTFT_SLO_MS,
    tpot_slo_ms: po.TpotSloOpt = po.DEFAULT_TPOT_SLO_MS,
    slo_percentile: po.SloPercentileOpt = po.DEFAULT_SLO_PERCENTILE,
    goal: po.GoalOpt = po.DEFAULT_GOAL,
    objective: Objective = "goodput",
    budget_gib: Budget = None,
    max_batched_tokens: po.MaxBatchedTokensOpt = po.DEFAULT_MAX_BATCHED_TOKENS,
    offload_experts: Offload = False,
    expert_cache_dtype: ExpDtype = "bf16",
    expert_zipf: ExpZipf = 1.0,
    expert_counts: ExpCounts = None,
    expert_policy: ExpPolicy = "lru",
    low_precision_dtype: LowDtype = None,
    low_fraction: LowFrac = 0.0,
    prefetched: Prefetch = 0.0,
    adapters: Adapters = 0,
    adapter_rank: Rank = 16,
    adapter_zipf: AdZipf = 1.0,
    adapter_source: AdSource = "host",
    nvme_gb_per_s: NvmeGbps = 7.0,
    kv_levels: Levels = 6,
    expert_levels: Levels = 5,
    adapter_levels: Levels = 5,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Also write the figure: objective over the split grid and hit "
            "ratio vs cache size (self-contained HTML)."
        ),
    ] = None,
    force: po.ForceOpt = False,
    dtype: po.DtypeOpt = None,
    act_dtype: po.ActDtypeOpt = None,
    kv_dtype: po.KvDtypeOpt = None,
    engine: po.EngineOpt = po.DEFAULT_ENGINE,
    json_out: bool = JsonOpt,
) -> None:
    """Choose the KV / expert-cache / adapter split that serves the rate best."""
    if out is not None and out.exists() and not force:
        raise fail(f"{out} exists; pass --force to overwrite it")
    from cli.plan_options import build_plan
    from hardware.device import load_device
    from perfmodel.cache.paging import SOURCES, nvme_link
    from perfmodel.model import load_model
    from perfmodel.units import GIGA, GiB
    from reports.cache_plot import CachePlanReport, hit_curves
    from reports.written import Engined
    from solvers.cache.budget import CacheBudgetSpec

    counts = {"tp": tp, "max_batched_tokens": max_batched_tokens, "kv_levels": kv_levels,
              "expert_levels": expert_levels, "adapter_levels": adapter_levels}  # fmt: skip
    for name, v in counts.items():
        if v < 1:
            raise fail(f"--{name.replace('_', '-')} must be a positive integer, got {v}")
    if adapter_source not in SOURCES:
        raise fail(f"--adapter-source must be one of {', '.join(SOURCES)}")
    m = load_model(model)
    d = load_device(hardware)
    wl = po.build_workload(workload, trace)
    act = _activation(m, offload_experts, expert_counts, expert_zipf)
    spec = CacheBudgetSpec(
        model=m,
        device=d,
        plan=build_plan(m, d, tp=tp, dtype=dtype, act_dtype=act_dtype, kv_dtype=kv_dtype)[0],
        workload=wl,
        rate_per_s=rate_per_s,
        slo=po.build_slo(ttft_slo_ms, tpot_slo_ms, slo_percentile, goal),
        objective=objective,
        max_batched_tokens=max_batched_tokens,
        budget_bytes=None if budget_gib is None else budget_gib * GiB,
        offload_experts=offload_experts,
        expert_cache_dtype=expert_cache_dtype,
        expert_activation=act,
        expert_policy=expert_policy,
        low_precision_dtype=low_precision_dtype,
        low_fraction=low_fraction,
        prefetched=prefetched,
        adapters=adapters,
        adapter_rank=adapter_rank,
        adapter_zipf=adapter_zipf,
        adapter_source=adapter_source,
        nvme=nvme_link(nvme_gb_per_s * GIGA),
        kv_levels=kv_levels,
        expert_levels=expert_levels,
        adapter_levels=adapter_levels,
        engine=po.resolve_engine(engine, d),
    )
    plan = _plan(spec)
    curves = hit_curves(spec) if out is not None else []
    eng_json, eng_lines = po.engines_for([spec.device], spec.plan.act_dtype, engine)
    if out is not None:
        _write_figure(out, spec, plan, curves, force=force)
    if json_out:
        echo_json(Engined(CachePlanReport(plan, out, tuple(curves)), eng_json))
        return
    if out is not None:
        typer.echo(f"wrote {out}")
    typer.echo("\n".join(eng_lines))
    _render(spec, plan)


def _activation(m: ModelSpec, offload: bool, counts: Path | None, zipf: float) -> Any:
    """The experts' activation law: from recorded counts, else Zipf popularity (MoE offload)."""
    from perfmodel.cache.hitrate import activation_from_counts
    from perfmodel.moe.routing import load_counts_csv
    from solvers.cache.budget import popularity_activation

    if not offload or m.moe is None:
        return None
    if counts:
        rec = load_counts_csv(counts, num_experts=m.moe.num_experts, top_k=m.moe.top_k)
        return activation_from_counts(rec.counts, rec.tokens)
    return popularity_activation(m, zipf)


def _render(spec: CacheBudgetSpec, plan: CachePlan) -> None:
    """The text answer: the split, the state at the rate, the marginal value of a GiB."""
    d = plan.to_dict()
    head = f"{spec.model.id} on {spec.plan.tp}x {spec.device.id}, {spec.workload.name} at "
    typer.echo(head + f"{spec.rate_per_s:g} req/s")
    if not plan.feasible:
        typer.echo(f"  infeasible: {plan.explanation}")
        return
    typer.echo(
        f"  budget {d['pool_budget_gib']:.2f} GiB after weights {d['weights_gib']:.2f} GiB and "
        f"activation reserve {d['activation_reserve_gib']:.2f} GiB"
    )
    rows = [[k, f"{v:.2f}"] for k, v in d["split_gib"].items()]
    typer.echo(table(rows, ["pool", "GiB"]))
    a = d["at_rate"]
    typer.echo(
        f"  KV {plan.kv_capacity_tokens:,} tokens; experts cached/layer {plan.expert_capacity:g}; "
        f"adapters resident {plan.adapters_resident:g}"
    )
    typer.echo(f"  {plan.explanation}")
    typer.echo(
        f"  TPOT mean {a['tpot_mean_ms']:.1f} ms, p{spec.slo.percentile * 100:g} TTFT "
        f"{a['ttft_quantile_ms']:.0f} ms, SLO attainment {a['slo_attainment']:.1%}"
    )
    typer.echo(f"  binding resource: {plan.binding_resource}")
    rows = [
        [k, plan.marginal_per_gib[k], plan.marginal_service_rate_per_gib[k]]
        for k in plan.marginal_per_gib
    ]
    typer.echo(table(rows, ["pool", f"Δ{spec.objective} per GiB", "Δμ req/s per GiB"]))


def _write_figure(out: Path, spec: Any, plan: Any, curves: list[Any], *, force: bool) -> None:
    """Write the split figure and the hit-ratio curves."""
    from reports.cache_plot import cache_figure
    from reports.html import figure_html

    slo = spec.slo
    title = (
        f"Cache budget: {spec.model.id} on {spec.plan.tp}x {spec.device.id}, "
        f"{spec.workload.name} at {spec.rate_per_s:g} req/s (p{slo.percentile * 100:g} "
        f"TTFT ≤ {slo.ttft_s * MS_PER_S:g} ms, TPOT ≤ {slo.tpot_s * MS_PER_S:g} ms)"
    )
    fig = cache_figure(plan, curves, title=title, rate_per_s=spec.rate_per_s)
    write_atomic(out, figure_html(fig), force=force)
