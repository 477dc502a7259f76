"""read_toml_header: a TOML file's root keys without its tables (the engine lookup)."""

from __future__ import annotations

from pathlib import Path

from hardware.engine import engine_files, load_engine
from perfmodel.datafile import read_data_file, read_toml_header


def _root(d: dict) -> dict:
    return {k: v for k, v in d.items() if not isinstance(v, dict)}


def test_engine_headers_are_their_root_keys() -> None:
    """Every engine file states family/versions/default before its first table."""
    for f in engine_files():
        h = read_toml_header(f, what="engine")
        assert h == _root(read_data_file(f, what="engine")), f.name
        assert {"family", "default"} <= h.keys(), f.name


def test_header_stops_at_the_first_table_and_falls_back(tmp_path: Path) -> None:
    p = tmp_path / "a.toml"
    p.write_text('family = "x"\nv = [1, 2]\n[t]\nfamily = "inner"\n')
    assert read_toml_header(p, what="engine") == {"family": "x", "v": [1, 2]}
    # a multi-line array whose line opens with "[": the prefix does not parse, the file does
    p.write_text('family = "x"\nv = [\n[1, 2],\n]\n[t]\nk = 1\n')
    assert read_toml_header(p, what="engine") == {"family": "x", "v": [[1, 2]], "t": {"k": 1}}


def test_load_engine_picks_the_same_files() -> None:
    assert load_engine("trtllm").id == "trtllm"
    assert (
        load_engine("vllm").id
        == read_data_file(next(f for f in engine_files() if f.name == "vllm.toml"), what="engine")[
            "id"
        ]
    )
