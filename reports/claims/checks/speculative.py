"""Speculative decoding speedup (``perfmodel.serving.speculative``) against a claimed figure.

Parameters: ``gamma`` (draft tokens), ``alpha`` (per-token acceptance; the main
assumption, with no default: it is a property of the draft and the data),
``draft_model`` or ``draft_cost_ratio``, ``batch``, ``context_len``, and
``offloaded_bytes`` — bytes every target pass streams over the host link (weights that
do not fit in the device memory), costed by ``perfmodel.paging.link_transfer_s``.
"""

from __future__ import annotations

from perfmodel.units import MS_PER_S
from reports.claims.setup import Side
from reports.claims.verdict import Assumption, Outcome, num


def speculative(params: Side) -> Outcome:
    from perfmodel.cache.paging import link_transfer_s
    from perfmodel.model import load_model
    from perfmodel.serving.speculative import speculative_speedup
    from perfmodel.step.instance import Instance

    dev = params.device()
    extra = 0.0
    if params.get("offloaded_bytes") is not None:
        extra = link_transfer_s(params.num("offloaded_bytes"), dev.host_link)
    draft = params.get("draft_model")
    alpha_given = params.get("alpha") is not None
    r = speculative_speedup(
        params.instance(),
        gamma=params.int("gamma"),
        alpha=params.num("alpha") if alpha_given else 1.0,
        batch=params.int("batch", 1),
        context_len=params.int("context_len", 1024),
        draft=Instance(load_model(str(draft)), dev, params.plan()) if draft else None,
        draft_cost_ratio=None if draft else params.num("draft_cost_ratio", 0.0),
        extra_step_s=extra,
    )
    steps = [
        ("target decode step t_target (ms)", num(r.target_step_s * MS_PER_S)),
        (f"verify step over γ+1 = {r.gamma + 1} tokens (ms)", num(r.verify_step_s * MS_PER_S)),
        ("draft step (ms)", num(r.draft_step_s * MS_PER_S)),
        ("bound at α = 1 with a free draft", num(r.bound)),
    ]
    if extra:
        steps.insert(0, ("host-link streaming per target pass (ms)", num(extra * MS_PER_S)))
    if alpha_given:
        steps += [("tokens per pass E(α, γ)", num(r.tokens_per_pass)), ("speedup", num(r.speedup))]
    return Outcome(
        value=r.speedup if alpha_given else None,
        unit="x",
        inputs=params.describe(),
        steps=steps,
        assumptions=(
            Assumption("alpha", None, 0.3, 0.99, why="per-token acceptance rate of the draft"),
        ),
    )
