"""Model specs: golden KV bytes, parameter counts vs published sizes, config parsing."""

import json
from pathlib import Path

import pytest

from perfmodel.errors import SpecError
from perfmodel.model import load_model, model_ids
from tests.conftest import SHARED_DATA

REQUIRED = {
    "llama-3.1-8b",
    "llama-3.1-70b",
    "llama-3.1-405b",
    "llama-2-7b",
    "llama-2-70b",
    "codellama-34b",
    "opt-13b",
    "qwen2.5-7b",
    "qwen3-32b",
    "qwen3-235b-a22b",
    "mixtral-8x7b",
    "deepseek-v3",
}


def test_catalog_has_required_models() -> None:
    assert set(model_ids()) >= REQUIRED


@pytest.mark.parametrize(
    ("mid", "kv"),
    [
        ("llama-3.1-70b", 327_680),  # 2 · 80 layers · 8 KV heads · 128 · 2 B
        ("llama-3.1-8b", 131_072),  # 2 · 32 · 8 · 128 · 2
        ("deepseek-v3", 70_272),  # MLA: 61 · (512 + 64) · 2 (DeepSeek ISCA'25 Table 1)
        ("llama-3.1-405b", 516_096),  # 2 · 126 · 8 · 128 · 2 (ibid.)
        ("llama-2-7b", 524_288),  # MHA: 2 · 32 · 32 · 128 · 2
        ("opt-13b", 819_200),  # 2 · 40 · 40 · 128 · 2
    ],
)
def test_kv_bytes_per_token_bf16(mid: str, kv: int) -> None:
    assert load_model(mid).kv_bytes_per_token("bf16") == kv


def test_kv_bytes_scale_with_dtype() -> None:
    m = load_model("llama-3.1-70b")
    assert m.kv_bytes_per_token("fp8") == 163_840


# Where the published figure is rounded or counts something we do not, the tolerance
# says so; every other model must be within 1 %.
TOLERANCE = {
    "llama-4-scout": 0.015,  # 109B includes the vision encoder; we count the text model
    "kimi-k2": 0.03,  # the model card says "1T" (one significant figure)
}


@pytest.mark.parametrize("mid", model_ids())
def test_parameter_count_matches_published(mid: str) -> None:
    m = load_model(mid)
    assert m.published_params, f"{mid}: catalog entry lacks published_params"
    assert m.params == pytest.approx(m.published_params, rel=TOLERANCE.get(mid, 0.01))
    if m.moe and m.published_active_params:
        # Active counts are published rounded (37B, 22B, 3.3B): 3 %.
        assert m.active_params == pytest.approx(m.published_active_params, rel=0.03)
    if not m.moe:
        assert m.active_params == m.params


def test_moe_structure() -> None:
    ds = load_model("deepseek-v3")
    assert ds.moe is not None
    assert ds.n_moe_layers == 58 and ds.n_dense_layers == 3  # first_k_dense_replace = 3
    assert ds.moe.shared_intermediate == 2048
    mx = load_model("mixtral-8x7b")
    assert mx.moe is not None and mx.n_moe_layers == 32 and mx.moe.top_k == 2


def _hf_config(name: str) -> Path:
    p = SHARED_DATA / "hf-configs" / name
    if not p.exists():
        pytest.skip("../shared/data/hf-configs not present")
    return p


@pytest.mark.parametrize(
    ("file", "mid"),
    [
        ("deepseek-ai--DeepSeek-V3.json", "deepseek-v3"),
        ("Qwen--Qwen3-235B-A22B.json", "qwen3-235b-a22b"),
        ("meta-llama--Meta-Llama-3.1-70B.json", "llama-3.1-70b"),
        ("mistralai--Mixtral-8x7B-v0.1.json", "mixtral-8x7b"),
        ("meta-llama--Llama-4-Scout-17B-16E-Instruct.json", "llama-4-scout"),
    ],
)
def test_real_config_json_gives_catalog_numbers(file: str, mid: str) -> None:
    from_file = load_model(str(_hf_config(file)))
    cat = load_model(mid)
    assert from_file.params == cat.params
    assert from_file.active_params == cat.active_params
    assert from_file.kv_bytes_per_token() == cat.kv_bytes_per_token()


def test_malformed_config_json(tmp_path: Path) -> None:
    p = tmp_path / "config.json"
    p.write_text("{not json")
    with pytest.raises(SpecError, match=r"config\.json: malformed JSON"):
        load_model(str(p))
    p.write_text(json.dumps({"hidden_size": 4096, "num_hidden_layers": 32}))
    with pytest.raises(SpecError, match="missing field 'num_attention_heads'"):
        load_model(str(p))
    p.write_text(
        json.dumps(
            {
                "hidden_size": 4096,
                "num_hidden_layers": -2,
                "num_attention_heads": 32,
                "vocab_size": 10,
            }
        )
    )
    with pytest.raises(SpecError, match="num_hidden_layers"):
        load_model(str(p))


def test_tp_must_divide_heads() -> None:
    m = load_model("llama-3.1-70b")
    with pytest.raises(SpecError, match="tp=3 does not divide the 64 attention heads"):
        m.check_tp(3)
    m.check_tp(8)
    assert m.kv_shards(16) == 8  # KV heads replicated past 8
    assert load_model("deepseek-v3").kv_shards(8) == 1  # MLA latent replicated


def test_unknown_model_lists_ids() -> None:
    with pytest.raises(SpecError, match=r"unknown model id 'gpt-5'.*llama-3.1-70b"):
        load_model("gpt-5")
