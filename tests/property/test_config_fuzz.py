"""Any config either parses or fails with one SpecError naming a field: never a traceback.

Valid configs of each family feature are mutated (a field set to a wrong type, a
negative or zero number, a list of the wrong length, null) and parsed.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from perfmodel.errors import SpecError
from perfmodel.model import model_from_config
from tests.golden.test_model_configs import DATA, DECILM, _moe_cfg

BASES: list[dict[str, Any]] = [
    json.loads((DATA / n).read_text())
    for n in (
        "qwen3-next-80b-a3b.json",
        "mistral-7b-v0.1.json",
        "gemma-3-27b.json",
        "llama-4-maverick.json",
    )
] + [DECILM, _moe_cfg(moe_layer_freq=[0, 1, 1, 0]), _moe_cfg(first_k_dense_replace=1)]

VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-3, max_value=300),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5),
    st.lists(st.integers(min_value=-1, max_value=2), max_size=6),
    st.dictionaries(st.sampled_from(["no_op", "n_heads_in_group", "ffn_mult"]), st.integers(-1, 9)),
)


def _mutate(cfg: dict[str, Any], key_index: int, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(cfg)
    target = out["text_config"] if isinstance(out.get("text_config"), dict) else out
    keys = sorted(target)
    target[keys[key_index % len(keys)]] = value
    return out


@given(
    base=st.sampled_from(range(len(BASES))),
    mutations=st.lists(st.tuples(st.integers(0, 200), VALUES), min_size=1, max_size=3),
)
def test_mutated_configs_parse_or_raise_spec_error(base: int, mutations: list[Any]) -> None:
    cfg = BASES[base]
    for k, v in mutations:
        cfg = _mutate(cfg, k, v)
    try:
        m = model_from_config(cfg, id="fuzz")
    except SpecError as e:
        assert str(e).strip() and "\n" not in str(e)
        return
    assert m.params > 0
    assert m.kv_bytes_per_sequence(4096) >= 0
