"""Unit constants: the only place prefixes and time conversions are written.

Everything inside perfmodel is in SI base units (s, B, FLOP, FLOP/s, B/s).
Convert at the edges (file loading, CLI input, CLI output) with these names.
"""

from __future__ import annotations

# Decimal prefixes (bandwidth, FLOP/s, marketed "GB" of bandwidth, ...).
KILO = 1e3
MEGA = 1e6
GIGA = 1e9
TERA = 1e12
PETA = 1e15

# Binary prefixes (memory capacity).
KiB = 2**10
MiB = 2**20
GiB = 2**30
TiB = 2**40

# Time.
MS_PER_S = 1e3
US_PER_S = 1e6
S_PER_MS = 1e-3
S_PER_US = 1e-6
S_PER_NS = 1e-9
S_PER_HOUR = 3600.0

# Bits.
BITS_PER_BYTE = 8


def ms(seconds: float) -> float:
    """Seconds -> milliseconds (for display)."""
    return seconds * MS_PER_S


def from_ms(milliseconds: float) -> float:
    """Milliseconds -> seconds (for input)."""
    return milliseconds * S_PER_MS


def gbit_per_s_to_bytes_per_s(gbit_per_s: float) -> float:
    """Network rates quoted in Gb/s -> B/s."""
    return gbit_per_s * GIGA / BITS_PER_BYTE
