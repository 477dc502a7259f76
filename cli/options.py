"""The options every command shares, declared once: same name, unit suffix and default.

A command declares ``model: ModelOpt = DEFAULT_MODEL`` and so on; ``tests/cli/
test_options.py`` walks the Typer app and fails if a shared option appears with another
default, or an option of the same meaning under another name (``--percentile``).
Builders turn parsed options into the library's objects (lazily imported, so that
``perfmodel --help`` stays light).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from reports.cluster import SCHEDULER_HELP

if TYPE_CHECKING:
    from hardware.device import Device
    from hardware.engine import Engine
    from perfmodel.step.instance import Instance
    from perfmodel.workload.presets import Workload
    from perfmodel.workload.slo import SLO

DEFAULT_MODEL = "llama-3.1-8b"
DEFAULT_MOE_MODEL = "qwen3-30b-a3b"  # commands that need a mixture-of-experts model
DEFAULT_HARDWARE = "h100-sxm"
DEFAULT_WORKLOAD = "chat"
DEFAULT_TTFT_SLO_MS = 500.0
DEFAULT_TPOT_SLO_MS = 50.0
DEFAULT_SLO_PERCENTILE = 0.9
DEFAULT_GOAL = 0.9
DEFAULT_MAX_BATCHED_TOKENS = 8192

ModelOpt = Annotated[str, typer.Option(help="Model id or Hugging Face config.json path.")]
#: a phase command's grid: its jobs in forked processes or on Dask (reports.cluster)
WorkersOpt = Annotated[
    int | None,
    typer.Option(
        help="Processes sharing the grid (default: the CPUs, at most 2; 1: serial; with "
        "--scheduler local: the LocalCluster's, default one per core)."
    ),
]
SchedulerOpt = Annotated[
    str | None,
    typer.Option(
        help=f"Run the grid's jobs on Dask: {SCHEDULER_HELP} (default: processes forked here)."
    ),
]
MoeModelOpt = Annotated[
    str, typer.Option("--model", help="Mixture-of-experts model id or config.json path.")
]
HardwareOpt = Annotated[str, typer.Option(help="Device id or device TOML path.")]
TpOpt = Annotated[int, typer.Option(help="Tensor-parallel degree of one instance.")]
PpOpt = Annotated[
    int, typer.Option(help="Pipeline-parallel stages of one instance (devices = tp x pp).")
]
DtypeOpt = Annotated[
    str | None,
    typer.Option(
        "--dtype",
        help="Weight dtype of every module (bf16 fp16 fp8 int8 int4 nvfp4 mxfp4); "
        "default: the checkpoint's quantization_config, else bf16.",
    ),
]
ActDtypeOpt = Annotated[
    str | None,
    typer.Option(help="Math/activation dtype (default: the checkpoint's, if the device has it)."),
]
KvDtypeOpt = Annotated[str | None, typer.Option(help="KV-cache dtype (default bf16).")]
ExpertDtypeOpt = Annotated[
    str | None, typer.Option(help="Routed-expert weight dtype (overrides --dtype for experts).")
]
AttnDtypeOpt = Annotated[
    str | None, typer.Option(help="Attention weight dtype (overrides --dtype for attention).")
]
EpOpt = Annotated[
    int,
    typer.Option(help="Expert parallelism: routed experts split over ep of the tp x dp devices."),
]
DpOpt = Annotated[
    int,
    typer.Option(help="Attention data parallelism: dp replicas of tp devices (tp x dp x pp)."),
]
TraceModelOpt = Annotated[
    str | None, typer.Option(help="BurstGPT: keep the rows of this Model (ChatGPT, GPT-4).")
]
WorkloadOpt = Annotated[str, typer.Option(help="Built-in workload: chat or code.")]
TraceOpt = Annotated[
    Path | None,
    typer.Option(help="Trace CSV (Azure, BurstGPT, or input_tokens,output_tokens"
                 "[,arrival_s]); overrides --workload."),
]  # fmt: skip
RateOpt = Annotated[float, typer.Option(help="Arrival rate, requests/s.")]
OptionalRateOpt = Annotated[
    float | None,
    typer.Option("--rate-per-s", help="Arrival rate, requests/s (default: the trace's, or 0.7·μ)."),
]
ArrivalCvOpt = Annotated[float, typer.Option(help="Inter-arrival CV (1 = Poisson, >1 bursty).")]
TtftSloOpt = Annotated[float, typer.Option(help="TTFT target, ms.")]
TpotSloOpt = Annotated[float, typer.Option(help="TPOT target, ms.")]
SloPercentileOpt = Annotated[float, typer.Option(help="Percentile the SLO targets apply to (0-1).")]
GoalOpt = Annotated[float, typer.Option(help="Fraction of requests that must meet both targets.")]
KvCapacityOpt = Annotated[
    int | None, typer.Option(help="KV capacity in tokens (default: from the memory model).")
]
MaxBatchedTokensOpt = Annotated[
    int, typer.Option(help="Token budget per iteration (vLLM max_num_batched_tokens).")
]
ChunkSizeOpt = Annotated[
    int | None, typer.Option(help="Largest prefill chunk per request (default: the budget).")
]
SeedOpt = Annotated[int, typer.Option(help="Random seed.")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Overwrite an existing output file.")]

#: Options whose default may differ by command, with the reason (checked by the test).
PER_COMMAND_DEFAULTS = {
    "--rate-per-s": "a rate is required to plan (pd, cache) but derived from μ to analyse",
    "--model": "MoE-only commands default to DEFAULT_MOE_MODEL (or require one)",
    "--out": "required where a figure is the result, optional elsewhere",
}


DEFAULT_ENGINE = "auto"
EngineOpt = Annotated[
    str,
    typer.Option(
        help="Serving engine: auto (the device's calibrated engine: trtllm on NVIDIA, vllm on "
        "AMD and Ascend; hardware/engines/families.toml), none (the engine-less roofline), "
        "trtllm, vllm, sglang, NAME@version, or a TOML path."
    ),
]


def resolve_engine(engine: str, device: Device) -> Engine | None:
    """The engine ``--engine`` names on ``device`` (``auto``: the device's default)."""
    from hardware.engine import engine_for

    return engine_for(engine, device)


def engines_for(
    devices: Sequence[Device], act_dtype: str | Mapping[str, str], engine: str = DEFAULT_ENGINE
) -> tuple[dict[str, Any], list[str]]:
    """``hardware.engine_note.engines_for`` (imported when called: keeps --help light)."""
    from hardware.engine_note import engines_for as of

    return of(devices, act_dtype, engine)


def build_instance(
    model: str, hardware: str, tp: int = 1, pp: int = 1, *, dtype: str | None = None,
    act_dtype: str | None = None, kv_dtype: str | None = None,
    expert_dtype: str | None = None, attn_dtype: str | None = None, ep: int = 1, dp: int = 1,
    engine: str = DEFAULT_ENGINE,
) -> Instance:  # fmt: skip
    """The instance the options describe (model and device by id or file); the formats
    follow ``perfmodel.plan.resolve_precision``, whose notes go to stderr."""
    from cli.plan_options import build_plan
    from hardware.device import load_device
    from perfmodel.errors import SpecError
    from perfmodel.model import load_model
    from perfmodel.plan import check_pp
    from perfmodel.step.instance import Instance

    for name, v in (("--tp", tp), ("--pp", pp), ("--ep", ep), ("--dp", dp)):
        if v < 1:
            raise SpecError(f"{name} must be a positive integer, got {v}")
    m = load_model(model)
    check_pp(m, pp)
    d = load_device(hardware)
    plan, prec = build_plan(
        m, d, tp=tp, pp=pp, ep=ep, dp=dp, dtype=dtype, act_dtype=act_dtype,
        kv_dtype=kv_dtype, expert_dtype=expert_dtype, attn_dtype=attn_dtype,
    )  # fmt: skip
    for note in (*prec.notes, *m.warnings):
        typer.echo(f"note: {note}", err=True)
    return Instance(m, d, plan, engine=resolve_engine(engine, d), engine_spec=engine)


def build_workload(
    workload: str, trace: Path | None, arrival_cv: float = 1.0, trace_model: str | None = None
) -> Workload:
    from perfmodel.errors import SpecError
    from perfmodel.workload.presets import Workload, preset
    from perfmodel.workload.trace import load_trace

    if trace_model is not None and trace is None:
        raise SpecError("--trace-model needs --trace")
    if trace is not None and arrival_cv != 1.0:
        raise SpecError(
            "--arrival-cv does nothing with --trace (the trace's own arrival times set the "
            "burstiness); drop one of them"
        )
    if trace:
        return Workload.from_trace(load_trace(trace, model=trace_model))
    return preset(workload, arrival_cv=arrival_cv)


def build_slo(ttft_slo_ms: float, tpot_slo_ms: float, slo_percentile: float, goal: float) -> SLO:
    from perfmodel.units import from_ms
    from perfmodel.workload.slo import SLO

    return SLO(from_ms(ttft_slo_ms), from_ms(tpot_slo_ms), slo_percentile, goal)
