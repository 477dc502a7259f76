"""Property-based fuzzing of the readers: for any bytes or any JSON-like tree, a reader
returns a valid object or raises SpecError with one line naming the file — never another
exception."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hardware.device import load_device_file
from hardware.measurements import read_measurements
from hardware.profile_io import load_profile_file
from perfmodel.datafile import read_csv
from perfmodel.errors import SpecError
from perfmodel.model import load_model_file
from perfmodel.moe.routing import load_counts_csv
from perfmodel.workload.trace import load_trace
from tests.fuzz.corpus import GOOD_CONFIG, GOOD_DEVICE

# PERFMODEL_FUZZ_EXAMPLES=1000 for a long run
FAST = settings(
    max_examples=int(os.environ.get("PERFMODEL_FUZZ_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

_cells = st.one_of(
    st.integers(-(10**25), 10**25).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(max_size=6),
    st.sampled_from(["", "nan", "inf", "1e999", "bf16", '"', "0", "1.5", "\ufeff1"]),
)


@st.composite
def csv_texts(draw, header: str) -> bytes:  # type: ignore[no-untyped-def]
    cols = header.split(",")
    rows = draw(st.lists(st.lists(_cells, min_size=len(cols) - 1, max_size=len(cols) + 1),
                         max_size=5))  # fmt: skip
    sep = draw(st.sampled_from(["\n", "\r\n"]))
    text = sep.join([header, *(",".join(r) for r in rows)]) + sep
    bom = draw(st.sampled_from([b"", b"\xef\xbb\xbf"]))
    enc = draw(st.sampled_from(["utf-8", "utf-8", "utf-16", "latin-1"]))
    try:
        return bom + text.encode(enc)
    except UnicodeEncodeError:
        return bom + text.encode("utf-8", "replace")


def _check(fn, data: bytes, suffix: str) -> None:  # type: ignore[no-untyped-def]
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / f"in{suffix}"
        p.write_bytes(data)
        try:
            fn(p)
        except SpecError as e:
            msg = str(e)
            assert "\n" not in msg and msg, msg
        # any other exception fails the property


@FAST
@given(csv_texts("m,n,k,dtype"))
def test_shapes_csv(data: bytes) -> None:
    from hardware.gemm_predict import read_gemm_shapes

    _check(read_gemm_shapes, data, ".csv")


@FAST
@given(csv_texts("input_tokens,output_tokens,arrival_s"))
def test_trace_csv(data: bytes) -> None:
    _check(load_trace, data, ".csv")


@FAST
@given(csv_texts("step,layer,e0,e1,e2,e3"))
def test_counts_csv(data: bytes) -> None:
    _check(lambda p: load_counts_csv(p, num_experts=4), data, ".csv")


@FAST
@given(csv_texts("m,n,k,latency_ms"))
def test_measurements_csv(data: bytes) -> None:
    _check(lambda p: read_measurements(str(p), time_col="latency_ms"), data, ".csv")


@FAST
@given(st.binary(max_size=300))
def test_any_bytes_as_csv(data: bytes) -> None:
    _check(lambda p: read_csv(p, what="table"), data, ".csv")


_json = st.recursive(
    st.one_of(
        st.none(), st.booleans(), st.integers(-(10**40), 10**40),
        st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=5),
    ),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                  max_size=3),
    max_leaves=10,
)  # fmt: skip


_CONFIG_KEYS = [
    *sorted(GOOD_CONFIG), "text_config", "head_dim", "num_local_experts",
    "num_experts_per_tok", "kv_lora_rank", "layer_types", "mlp_only_layers",
    "tie_word_embeddings", "first_k_dense_replace", "max_position_embeddings", "model_type",
]  # fmt: skip


@FAST
@given(st.dictionaries(st.sampled_from(_CONFIG_KEYS), _json, max_size=4))
def test_config_json(patch: dict[str, object]) -> None:
    _check(load_model_file, json.dumps({**GOOD_CONFIG, **patch}).encode(), ".json")


@FAST
@given(st.lists(st.tuples(st.integers(0, GOOD_DEVICE.count("\n") - 1),
                          st.sampled_from(["nan", "-1", '"x"', "[]", "{a=1}", "1e400", "true",
                                           "0", "1.5"])),
                min_size=1, max_size=3))  # fmt: skip
def test_device_toml(edits: list[tuple[int, str]]) -> None:
    lines = GOOD_DEVICE.splitlines()
    for i, v in edits:
        if "=" in lines[i]:
            lines[i] = lines[i].split("=")[0] + "= " + v
    text = "\n".join(lines)
    _check(load_device_file, text.encode(), ".toml")
    _check(load_profile_file, text.encode(), ".toml")
