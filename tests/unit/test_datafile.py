"""The input layer (perfmodel.datafile): every bad file is one SpecError line naming it."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfmodel.datafile import (
    MAX_NESTING,
    parse_float,
    parse_int,
    read_csv,
    read_data_file,
    read_text,
)
from perfmodel.errors import SpecError


def _w(tmp_path: Path, name: str, data: bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def test_bom_and_crlf_are_accepted(tmp_path: Path) -> None:
    p = _w(tmp_path, "s.csv", b"\xef\xbb\xbfm,n,k\r\n1,2,3\r\n\r\n4,5,6\r\n")
    tab = read_csv(p, what="shapes", required=("m", "n", "k"))
    assert tab.header == ("m", "n", "k")
    # line numbers are the file's (the blank line 3 is skipped, not renumbered)
    assert [n for n, _ in tab] == [2, 4]
    assert tab.rows[1][1] == ("4", "5", "6")


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ("m,n\n1,2\n".encode("utf-16"), "UTF-16 encoded; save it as UTF-8"),
        (b"m,n\n1,2\n\xff\xfe\x00", ":3: shapes is not UTF-8"),
        (b"m,n\n1,\x8c\n", ":2: shapes is not UTF-8 text (byte 0x8c)"),
        (b"m,n\n1,\x00\n", ":2: shapes contains a NUL byte"),
        (b"", "empty shapes"),
        (b"m,n\n", "has a header but no data rows"),
        (b"m,m\n1,2\n", "repeats column 'm'"),
        (b"m,,n\n1,2,3\n", "empty column name"),
        (b"m,n\n1,2\n1,2,3\n", ":3: expected 2 fields"),
        (b'm,n\n1,"2\n', "malformed CSV"),
    ],
)
def test_bad_csv_is_one_line_naming_the_file(tmp_path: Path, data: bytes, needle: str) -> None:
    p = _w(tmp_path, "s.csv", data)
    with pytest.raises(SpecError) as e:
        read_csv(p, what="shapes")
    msg = str(e.value)
    assert needle in msg and str(p) in msg and "\n" not in msg


def test_missing_required_column_lists_the_columns(tmp_path: Path) -> None:
    p = _w(tmp_path, "s.csv", b"\xef\xbb\xbfm,n\n1,2\n")
    with pytest.raises(SpecError, match=r"no column\(s\) k; columns are m, n$"):
        read_csv(p, what="shapes", required=("m", "n", "k"))


@pytest.mark.parametrize(
    ("name", "text", "needle"),
    [
        ("c.json", '{"a": NaN}', "NaN is not a number"),
        ("c.json", '{"a": Infinity}', "Infinity is not a number"),
        ("c.json", '{"a": 1e999}', "too large"),
        ("c.json", '{"a": ' + "9" * 5000 + "}", "too large"),
        ("c.json", "[" * 200_000, f"nested deeper than {MAX_NESTING}"),
        ("c.json", "[1, 2]", "expected a JSON object"),
        ("c.json", '{"a": 1,}', "malformed JSON at line 1"),
        ("d.toml", "a = " + "{b = " * 3000 + "1" + "}" * 3000, "nested deeper"),
        ("d.toml", "a = inf", "field a = inf is not a finite number"),
        ("d.toml", "[t]\nx = [1, nan]", "field t.x[1] = nan"),
        ("d.toml", "a = = 1", "malformed TOML"),
    ],
)
def test_bad_data_file(tmp_path: Path, name: str, text: str, needle: str) -> None:
    p = _w(tmp_path, name, text.encode())
    with pytest.raises(SpecError) as e:
        read_data_file(p, what="config")
    assert needle in str(e.value) and str(p) in str(e.value) and "\n" not in str(e.value)


def test_data_file_bom_accepted(tmp_path: Path) -> None:
    p = _w(tmp_path, "c.json", b'\xef\xbb\xbf{"a": [1, 2.5]}')
    assert read_data_file(p, what="config") == {"a": [1, 2.5]}


def test_not_a_file_and_size_limit(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="it is a directory"):
        read_text(tmp_path, what="trace")
    with pytest.raises(SpecError, match="not a regular file"):
        read_text("/dev/null", what="trace")
    with pytest.raises(SpecError, match="No such file"):
        read_text(tmp_path / "absent.csv", what="trace")
    big = _w(tmp_path, "b.csv", b"x" * 2000)
    with pytest.raises(SpecError, match="over the"):
        read_text(big, what="trace", max_bytes=1000)


@pytest.mark.parametrize(
    ("v", "kw", "out"),
    [("1024", {}, 1024), (" 1024.0 ", {}, 1024), ("0", {}, 0)],
)
def test_parse_int_accepts(v: str, kw: dict[str, int], out: int) -> None:
    assert parse_int(v, where="f:2", name="m", **kw) == out


@pytest.mark.parametrize(
    ("v", "needle"),
    [
        ("1.5", "is not an integer"),
        ("inf", "is not an integer"),
        ("nan", "is not an integer"),
        ("x", "is not an integer"),
        ("9" * 100, "is too large"),
        ("-1", "must be >= 0"),
        (str(2**60), "is too large"),
    ],
)
def test_parse_int_refuses(v: str, needle: str) -> None:
    with pytest.raises(SpecError, match=needle):
        parse_int(v, where="f:2", name="m")


def test_parse_float() -> None:
    assert parse_float("2.5e-3", where="f:2", name="t") == 2.5e-3
    for v, needle in (("nan", "not finite"), ("1e999", "not finite"), ("-1", "> 0")):
        with pytest.raises(SpecError, match=needle):
            parse_float(v, where="f:2", name="t", positive=True)
