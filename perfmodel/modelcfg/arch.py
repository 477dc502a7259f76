"""Architectures perfmodel refuses rather than models wrongly (encoders, unmodelled SSMs)."""

from __future__ import annotations

from typing import Any

from perfmodel.errors import SpecError

# Pure or hybrid state-space stacks the config parser does not model (it models Nemotron-H
# patterns and Gated-DeltaNet / linear-attention layer_types): refused, not guessed.
_SSM = {"mamba", "mamba2", "falcon_mamba", "jamba", "zamba", "zamba2", "bamba"}
_SSM_KEYS = ("ssm_cfg", "mamba_d_state", "attn_layer_period", "mamba_expand")
_ENCODER_ONLY = {
    "bert", "roberta", "xlm-roberta", "distilbert", "albert", "electra", "deberta",
    "deberta-v2", "modernbert", "camembert", "mpnet", "ernie", "nomic_bert",
}  # fmt: skip


def check_architecture(cfg: dict[str, Any], *, where: str) -> None:
    """Refuse what the model would get wrong: it models decoder-only LLMs.

    Encoder-only and encoder-decoder models (no autoregressive decode, no KV cache growth)
    are refused with the reason, and so are state-space families the config parser does
    not model (Mamba, Jamba, Zamba, Bamba); Nemotron-H and linear-attention stacks are
    modelled by ``perfmodel.modelcfg`` (recurrent state instead of a KV cache).
    """
    family = str(cfg.get("model_type", "")).lower()
    archs = cfg.get("architectures") or []
    archs = [str(a) for a in archs] if isinstance(archs, list) else [str(archs)]
    if family in _ENCODER_ONLY or any(a.endswith("ForMaskedLM") for a in archs):
        raise SpecError(
            f"{where}: model_type {family!r} is encoder-only; perfmodel models decoder-only "
            "LLMs (autoregressive decode with a KV cache), not encoders"
        )
    if cfg.get("is_encoder_decoder") is True or family in ("t5", "mt5", "bart", "mbart", "umt5"):
        raise SpecError(
            f"{where}: {family or 'this model'} is an encoder-decoder; perfmodel models "
            "decoder-only LLMs"
        )
    ssm_keys = [k for k in _SSM_KEYS if k in cfg]
    if family in _SSM or ssm_keys:
        raise SpecError(
            f"{where}: {family or 'this model'} has state-space (Mamba) layers"
            f"{' (' + ', '.join(ssm_keys) + ')' if ssm_keys else ''} that perfmodel does not "
            "model (it models Nemotron-H and linear-attention hybrids); it would be wrong"
        )
