"""One serving instance — model × device × plan (× a calibrated iteration profile).

:class:`Instance` is built once per command and is the one place every layer above it
asks for an iteration time, the memory fit and the KV capacity:

* :meth:`Instance.iteration_s` — seconds of one engine iteration of a :class:`Batch`:
  the calibrated ``profile`` when the instance carries one (a
  :class:`hardware.maxaffine.MaxAffine` over :data:`PHASE_FEATURES`, e.g. DistServe's
  measured prefill ``a + b·Σl + c·Σl²``), else the roofline step time of
  :func:`perfmodel.step.time.step_time`. The queueing models, the simulator's step
  table, the PD phase models, the cache and offload models and ``estimate`` all cost
  their iterations here, so a calibrated profile applies to every one of them.
* :meth:`Instance.step` — the per-operator breakdown (compute / memory / communication
  and what bounds each) of the roofline path, for reports.
* :meth:`Instance.memory_fit`, :meth:`Instance.kv_capacity_tokens` — the memory model
  (:func:`perfmodel.memory.memory_fit`) of this instance.
* ``engine`` (:class:`hardware.engine.Engine`, optional): the serving engine. Its kernel
  efficiencies, decode K/V reads, collective and host overheads enter every roofline
  iteration; its KV memory fraction, block size and token budget the memory fit
  (``None``: the engine-less model, unchanged).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np
from numpy.typing import NDArray

from hardware.device import Device
from hardware.engine import Engine
from hardware.engine_note import describe_engine
from hardware.maxaffine import MaxAffine
from perfmodel.errors import InfeasibleError, SpecError
from perfmodel.memory import (
    DEFAULT_GPU_MEMORY_UTILIZATION,
    DEFAULT_MAX_BATCHED_TOKENS,
    MemoryFit,
    describe_shortfall,
    memory_fit,
)
from perfmodel.model import ModelSpec
from perfmodel.plan import ParallelPlan
from perfmodel.step.batch import Batch
from perfmodel.step.time import StepTime, step_time

Arr = NDArray[np.float64]

#: Features a calibrated iteration profile may use, each a sum over the iteration's
#: sequences: ``prefill_tokens`` Σl, ``prefill_tokens_sq`` Σ(l² + 2·l·c) (= Σl² for fresh
#: prompts), ``prefill_seqs`` the prompts, ``decode_seqs`` the decoding requests,
#: ``decode_tokens`` Σ(context + 1) over them (DistServe's ``Σ(context_len + 1)``).
PHASE_FEATURES = (
    "prefill_tokens",
    "prefill_tokens_sq",
    "prefill_seqs",
    "decode_seqs",
    "decode_tokens",
)


def phase_features(batch: Batch) -> dict[str, Arr]:
    """The :data:`PHASE_FEATURES` of a batch (``prefill_tokens_sq = 2·pairs − tokens``)."""
    return {
        "prefill_tokens": batch.prefill_tokens,
        "prefill_tokens_sq": 2.0 * batch.prefill_pairs - batch.prefill_tokens,
        "prefill_seqs": batch.prefill_seqs,
        "decode_seqs": batch.decode_seqs,
        "decode_tokens": batch.decode_context + batch.decode_seqs,
    }


def check_profile_features(profile: MaxAffine | None, what: str = "iteration") -> None:
    """A calibrated iteration profile may use only :data:`PHASE_FEATURES`."""
    if profile is None:
        return
    bad = [f for f in profile.features if f not in PHASE_FEATURES]
    if bad:
        raise SpecError(
            f"{what} profile feature(s) {', '.join(bad)} unknown; a {what} profile uses "
            f"{', '.join(PHASE_FEATURES)}"
        )


#: iteration-time results an instance keeps (:meth:`Instance.iteration_s`)
ITERATIONS_KEPT = 256
_BATCH_FIELDS = tuple(f.name for f in fields(Batch))


def _batch_key(batch: Batch) -> bytes:
    """The batch's contents, every field's dtype, shape and bytes (equal keys: equal
    inputs, so the same iteration times bit for bit)."""
    parts = []
    for name in _BATCH_FIELDS:
        a = np.asarray(getattr(batch, name))
        parts.append(f"{a.dtype.str}{a.shape}".encode())
        parts.append(np.ascontiguousarray(a).tobytes())
    return b"|".join(parts)


@dataclass(frozen=True)
class Instance:
    """A model served on ``plan.devices`` devices of one type, as one engine instance."""

    model: ModelSpec
    device: Device
    plan: ParallelPlan = field(default_factory=ParallelPlan)
    profile: MaxAffine | None = field(default=None, compare=False)
    engine: Engine | None = field(default=None, compare=False)
    #: the ``--engine`` spec the engine came from (``auto`` says it is the device's default)
    engine_spec: str = field(default="", compare=False)
    #: iteration times already computed, by the batch's bytes (see :meth:`iteration_s`)
    _iterations: dict[bytes, Arr] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        self.model.check_tp(self.plan.tp)
        check_profile_features(self.profile)

    @property
    def devices(self) -> int:
        return self.plan.devices

    @property
    def calibrated(self) -> bool:
        return self.profile is not None

    def step(self, batch: Batch) -> StepTime:
        """Roofline step time of ``batch`` with its per-operator breakdown."""
        return step_time(self.model, self.device, batch, plan=self.plan, engine=self.engine)

    def iteration_s(self, batch: Batch) -> Arr:
        """Seconds of one iteration of ``batch`` (vectorized over the batch's arrays).

        Kept by the batch's contents (at most :data:`ITERATIONS_KEPT`, then cleared): a
        goodput search asks the same batch again (the one-decode iteration of every
        operating point, a chain solved again at the same decode count — 94 of the 691
        iterations of a five-device plan). Returns a copy, so a caller may change it."""
        key = _batch_key(batch)
        hit = self._iterations.get(key)
        if hit is None:
            hit = self._iteration_s(batch)
            if len(self._iterations) >= ITERATIONS_KEPT:
                self._iterations.clear()
            self._iterations[key] = hit
        return hit.copy()

    def _iteration_s(self, batch: Batch) -> Arr:
        if self.profile is not None:
            feats = phase_features(batch)
            return np.asarray(self.profile(**{f: feats[f] for f in self.profile.features}))
        return np.asarray(self.step(batch).total_s, dtype=np.float64)

    def memory_fit(
        self,
        *,
        batch: int = 1,
        context_len: int = 1,
        gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
        max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS,
        search_tp: bool = True,
    ) -> MemoryFit:
        """:func:`perfmodel.memory.memory_fit` of this instance, computed once per (model,
        device, plan, engine) objects and arguments (a planner asks it of the same
        configuration dozens of times; devices and engines are identity-checked)."""
        args = (batch, context_len, gpu_memory_utilization, max_batched_tokens, search_tp)
        key = (id(self.model), id(self.device), self.plan, id(self.engine), args)
        hit = _FITS.get(key)
        if (
            hit is not None
            and hit[0] is self.model
            and hit[1] is self.device
            and hit[2] is self.engine
        ):
            return hit[3]
        fit = memory_fit(
            self.model,
            self.device,
            self.plan,
            batch=batch,
            context_len=context_len,
            gpu_memory_utilization=gpu_memory_utilization,
            max_batched_tokens=max_batched_tokens,
            search_tp=search_tp,
            engine=self.engine,
        )
        if len(_FITS) >= _FITS_KEPT:
            _FITS.pop(next(iter(_FITS)))
        _FITS[key] = (self.model, self.device, self.engine, fit)
        return fit

    def kv_capacity_tokens(self, max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS) -> int:
        """KV tokens the instance caches; an error that says what to change if none fit."""
        fit = self.memory_fit(max_batched_tokens=max_batched_tokens)
        if fit.kv_capacity_tokens < 1:
            raise InfeasibleError(
                describe_shortfall(fit, self.model, self.device, self.plan.tp).replace(
                    "needs", "weights need"
                )
                + "; no room for a KV cache"
            )
        return fit.kv_capacity_tokens

    def ids(self) -> dict[str, object]:
        """Model, hardware, TP and PP: what a result's JSON names the instance by."""
        return {
            "model": self.model.id,
            "hardware": self.device.id,
            "tp": self.plan.tp,
            "pp": self.plan.pp,
        }

    @property
    def engine_accuracy(self) -> str:
        """The engine the answers are modelled with, and the error to expect from validation."""
        return describe_engine(self.engine, self.device, self.plan.act_dtype, self.engine_spec)

    def engine_keys(self) -> dict[str, str | None]:
        """The ``engine`` and ``engine_accuracy`` keys every JSON answer carries."""
        return {
            "engine": self.engine.id if self.engine else None,
            "engine_accuracy": self.engine_accuracy,
        }

    def with_plan(self, plan: ParallelPlan) -> Instance:
        return Instance(self.model, self.device, plan, self.profile, self.engine, self.engine_spec)


#: memory fits by instance objects and arguments (see :meth:`Instance.memory_fit`)
_FITS: dict[tuple[object, ...], tuple[ModelSpec, Device, Engine | None, MemoryFit]] = {}
_FITS_KEPT = 256


class OnInstance:
    """Mixin for results that carry an ``instance``: its model, device and plan."""

    instance: Instance

    @property
    def model(self) -> ModelSpec:
        return self.instance.model

    @property
    def device(self) -> Device:
        return self.instance.device

    @property
    def plan(self) -> ParallelPlan:
        return self.instance.plan
