"""A corpus of bad inputs for every reader and every command, and the one check they share.

``refused(args)`` runs one case in-process and asserts what every bad input must give:
exit code 2, exactly one line on stderr starting with ``error:``, no traceback, no
"internal error", nothing on stdout that looks like a result, nothing written, within
the per-case time limit.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()

#: Wall-clock limit of one case, s (the command's own limit is set below it).
CASE_LIMIT_S = 30.0


def refused(args: list[str], *, out: Path | None = None) -> str:
    """Run one case; assert it is refused properly; return its error line."""
    before = sorted(p.name for p in out.parent.iterdir()) if out is not None else []
    old = os.environ.get("PERFMODEL_TIME_LIMIT_S")
    os.environ["PERFMODEL_TIME_LIMIT_S"] = str(CASE_LIMIT_S - 5)
    t0 = time.monotonic()
    try:
        r = runner.invoke(app, args)
    finally:
        if old is None:
            os.environ.pop("PERFMODEL_TIME_LIMIT_S", None)
        else:
            os.environ["PERFMODEL_TIME_LIMIT_S"] = old
    dt = time.monotonic() - t0
    err = r.stderr
    what = f"{' '.join(args)!r} -> exit {r.exit_code}, stderr {err!r}, stdout {r.stdout[:200]!r}"
    assert r.exception is None or isinstance(r.exception, SystemExit), (
        f"{what}: raised {r.exception!r}"
    )
    assert r.exit_code == 2, what
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), what
    assert "Traceback" not in err + r.stdout and "internal error" not in err, what
    assert dt < CASE_LIMIT_S, f"{what}: took {dt:.1f} s"
    if out is not None:
        assert not out.exists() or out.is_dir(), f"{what}: wrote {out}"
        after = sorted(p.name for p in out.parent.iterdir())
        assert after == before, f"{what}: left {set(after) - set(before)}"
    return lines[0]


# ---- bad files ---------------------------------------------------------------------------

# Each: (name, bytes). Encodings, structure and values that no reader may accept.
ENCODING_CASES: list[tuple[str, bytes]] = [
    ("binary", bytes(range(256)) * 4),
    ("utf16", "a,b\n1,2\n".encode("utf-16")),
    ("utf16be-nobom", "a,b\n1,2\n".encode("utf-16-be")),
    ("latin1", "m,n,k\n1,2,3\ncaf\xe9,1,1\n".encode("latin-1")),
    ("nul", b"m,n,k\n1,2,3\x00\n"),
    ("empty", b""),
    ("bom-only", b"\xef\xbb\xbf"),
    ("whitespace", b"   \n\n  \n"),
]


def csv_cases(header: str, good_row: str) -> list[tuple[str, bytes]]:
    """Bad variants of a CSV whose header and one valid row are given."""
    n = header.count(",") + 1
    cells = good_row.split(",")
    out = list(ENCODING_CASES)
    out += [
        ("header-only", f"{header}\n".encode()),
        ("ragged-short", f"{header}\n{','.join(cells[:-1])}\n".encode()),
        ("ragged-long", f"{header}\n{good_row},9\n".encode()),
        ("dup-header", f"{header},{header.split(',')[0]}\n{good_row},1\n".encode()),
        ("empty-colname", f"{header},\n{good_row},1\n".encode()),
        ("unterminated-quote", f'{header}\n"{good_row}\n'.encode()),
        ("wrong-header", ("x," * n).rstrip(",").encode() + b"\n" + good_row.encode() + b"\n"),
    ]
    for i in range(n):
        for bad in ("nan", "inf", "-inf", "abc", "1e999", "9" * 400, "-1", ""):
            row = list(cells)
            if row[i] in ("bfloat16", "bf16"):
                continue  # a text column (dtype): no number to break
            row[i] = bad
            out.append((f"col{i}={bad[:8]}", f"{header}\n{','.join(row)}\n".encode()))
    return out


def json_cases(good: dict[str, object]) -> list[tuple[str, bytes]]:
    """Bad variants of a config.json (``good`` is a valid one)."""
    out = list(ENCODING_CASES)
    out += [
        ("deep", b"[" * 200_000),
        ("deep-obj", b'{"a":' * 5000 + b"1" + b"}" * 5000),
        ("array-top", b"[1, 2, 3]"),
        ("trailing-comma", b'{"a": 1,}'),
        ("truncated", json.dumps(good)[:-5].encode()),
        ("huge-int", b'{"hidden_size": ' + b"9" * 5000 + b"}"),
    ]
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"):
        for name, val in (
            ("nan", "NaN"), ("inf", "Infinity"), ("neg", "-4096"), ("str", '"abc"'),
            ("list", "[1]"), ("obj", "{}"), ("bool", "true"), ("big", "1e30"), ("float", "1.5"),
            ("zero", "0"), ("null-all", "null"),
        ):  # fmt: skip
            text = json.dumps({**good, key: "@@"}).replace('"@@"', val)
            if name == "null-all" and key != "hidden_size":
                continue
            out.append((f"{key}={name}", text.encode()))
    for name, extra in (
        ("bert", {"model_type": "bert", "architectures": ["BertForMaskedLM"]}),
        ("t5", {"model_type": "t5", "is_encoder_decoder": True}),
        ("mamba", {"model_type": "mamba"}),
        ("jamba", {"model_type": "jamba", "attn_layer_period": 8}),
        ("linear-attn", {"layer_types": ["linear_attention", "full_attention"]}),
        ("moe-bad-topk", {"num_local_experts": 8, "num_experts_per_tok": "two"}),
        ("mlp-only-bad", {"num_experts": 8, "num_experts_per_tok": 2, "mlp_only_layers": [{}]}),
        ("published-bad", {"published_params": "7B"}),
    ):
        out.append((name, json.dumps({**good, **extra}).encode()))
    return out


def toml_cases(good: str) -> list[tuple[str, bytes]]:
    """Bad variants of a device TOML (``good`` is a valid one)."""
    out = list(ENCODING_CASES)
    out += [
        ("deep-inline", ("a = " + "{b = " * 3000 + "1" + "}" * 3000).encode()),
        ("deep-array", ("a = " + "[" * 3000 + "]" * 3000).encode()),
        ("malformed", b"id = = 1"),
        ("no-compute", "\n".join(
            ln for ln in good.splitlines() if not ln.startswith(("bf16", "fp16", "fp8"))
        ).replace("[compute]", "").encode()),
    ]  # fmt: skip
    for old, new, name in (
        ("peers = 7", "peers = -1", "peers-neg"),
        ("peers = 7", "peers = 7.5", "peers-frac"),
        ("peers = 7", 'peers = "seven"', "peers-str"),
        ("peers = 7", "peers = 1e30", "peers-huge"),
        ("bf16 = 989.4e12", "bf16 = nan", "peak-nan"),
        ("bf16 = 989.4e12", "bf16 = inf", "peak-inf"),
        ("bf16 = 989.4e12", "bf16 = -1.0", "peak-neg"),
        ("bf16 = 989.4e12", 'bf16 = "fast"', "peak-str"),
        ("bf16 = 989.4e12", "bf17 = 989.4e12", "peak-key"),
        ("capacity_bytes = 85899345920", "capacity_bytes = 0", "cap-zero"),
        ("capacity_bytes = 85899345920", "capacity_bytes = [1]", "cap-list"),
        ('id = "fuzz-dev"', "id = 3", "id-int"),
    ):
        if old in good:
            out.append((name, good.replace(old, new).encode()))
    return out


GOOD_CONFIG: dict[str, object] = {
    "model_type": "llama",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128256,
}

GOOD_DEVICE = """id = "fuzz-dev"
name = "fuzz device"
kind = "gpu"

[compute]
bf16 = 989.4e12
fp16 = 989.4e12
fp8 = 1978.9e12

[memory]
capacity_bytes = 85899345920
bandwidth_bytes_per_s = 3.35e12

[scale_up]
bw_per_direction_bytes_per_s = 450e9
latency_s = 1e-6
topology = "switched"
peers = 7
"""


def write_cases(d: Path, cases: list[tuple[str, bytes]], suffix: str) -> Iterator[Path]:
    d.mkdir(parents=True, exist_ok=True)
    for i, (name, data) in enumerate(cases):
        safe = "".join(c if c.isalnum() or c in "-=" else "_" for c in name)
        p = d / f"{i:03d}-{safe}{suffix}"
        p.write_bytes(data)
        yield p
