"""Headless Debian chromium for report tests: load a file offline, dump the DOM, screenshot."""

from __future__ import annotations

import shutil
import struct
import subprocess
import tempfile
import zlib
from pathlib import Path

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--virtual-time-budget=8000",
)


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser"):
        p = shutil.which(name)
        if p:
            return p
    return None


def render(page: Path, png: Path, *, width: int = 1280, height: int = 2400) -> tuple[str, str]:
    """(DOM after scripts ran, chromium's stderr) for ``page``; writes a screenshot."""
    exe = chromium()
    if exe is None:
        raise RuntimeError("no chromium")
    with tempfile.TemporaryDirectory() as prof:
        common = [exe, *FLAGS, f"--user-data-dir={prof}", "--enable-logging=stderr", "--v=0"]
        dom = subprocess.run(
            [*common, "--dump-dom", page.resolve().as_uri()],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        subprocess.run(
            [*common, f"--window-size={width},{height}", f"--screenshot={png}",
             page.resolve().as_uri()],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    return dom.stdout, dom.stderr


def png_variety(png: Path) -> tuple[int, float]:
    """(distinct byte values, fraction of bytes not 0 or 255) of the PNG's pixel stream:
    a blank page is one color, so its filtered rows are nearly all 0 or 255."""
    data = png.read_bytes()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{png} is not a PNG")
    i, idat = 8, b""
    while i < len(data):
        (n,) = struct.unpack(">I", data[i : i + 4])
        kind = data[i + 4 : i + 8]
        if kind == b"IDAT":
            idat += data[i + 8 : i + 8 + n]
        i += 12 + n
    raw = zlib.decompress(idat)
    distinct = len(set(raw[:: max(1, len(raw) // 200000)]))
    mid = sum(1 for b in raw[:: max(1, len(raw) // 200000)] if b not in (0, 255))
    return distinct, mid / max(1, len(raw[:: max(1, len(raw) // 200000)]))
