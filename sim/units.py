"""Parsing of sizes users type: ``12GB``, ``12GiB``, ``512KiB``, ``4096``, ``50%``.

SI prefixes are powers of 1000 and IEC prefixes powers of 1024, because phone vendors
quote DRAM in GB while Linux reports GiB and the two differ by 7% at 12 GB.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sim.checks import shown
from sim.errors import SimError

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
    "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")
ALLOWED = "a byte count with an optional unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)"


def parse_bytes(text: str | int | float, *, source: str | None = None, field: str | None = None) -> int:
    """Parse a byte size; raise a one-line SimError naming the field on anything else."""
    if isinstance(text, bool):
        raise SimError(f"expected {ALLOWED}, got {shown(text)}", source=source, field=field)
    if isinstance(text, int | float):
        try:
            value, unit = float(text), ""
        except OverflowError:
            raise SimError(f"is too large for a size, got {str(text)[:20]}...", source=source, field=field) from None
    else:
        match = _SIZE.match(str(text))
        if not match:
            raise SimError(f"cannot parse {shown(text)}: expected {ALLOWED}", source=source, field=field)
        value, unit = float(match.group(1)), match.group(2).lower()
        given = match.group(2)
        if len(given) == 2 and given[0].isupper() and given[1] == "b":  # Gb, Mb: the usual spelling of bits
            raise SimError(f"{given!r} in {text!r} reads as {given[0]}bit; sizes are in bytes: write "
                           f"{given[0]}B", source=source, field=field)
    if unit not in _UNITS:
        raise SimError(f"unknown unit {match.group(2)!r} in {text!r}: expected {ALLOWED}", source=source,
                       field=field)
    result = value * _UNITS[unit]
    if result == float("inf"):
        raise SimError(f"is too large for a size, got {shown(text)}", source=source, field=field)
    if not result >= 1:  # NaN fails the comparison too
        raise SimError(f"must be at least 1 byte, got {text!r}", source=source, field=field)
    if _UNITS[unit] == 1 and not value.is_integer():  # 1.5 bytes: a typo, not a size to round
        raise SimError(f"must be a whole number of bytes, got {text!r}", source=source, field=field)
    return int(round(result))


@dataclass(frozen=True)
class SizeSpec:
    """A size given either as bytes or as a fraction of some total (``50%``)."""

    bytes: int | None = None
    fraction: float | None = None

    def resolve(self, total_bytes: int) -> int:
        if self.bytes is not None:
            return self.bytes
        assert self.fraction is not None
        return int(round(self.fraction * total_bytes))

    def __str__(self) -> str:
        return f"{self.fraction * 100:g}%" if self.fraction is not None else f"{self.bytes}B"


def parse_size_or_percent(text: str | int | float, *, source: str | None = None, field: str | None = None,
                          max_percent: float = 100.0) -> SizeSpec:
    """Parse ``50%`` (a fraction of a total known later) or a byte size."""
    if isinstance(text, str) and text.strip().endswith("%"):
        body = text.strip()[:-1]
        try:
            pct = float(body)
        except ValueError:
            raise SimError(f"cannot parse {shown(text)}: expected a percentage like 50%", source=source,
                           field=field) from None
        if not 0 < pct <= max_percent:
            raise SimError(f"percentage must be in (0, {max_percent:g}]%, got {text!r}", source=source, field=field)
        return SizeSpec(fraction=pct / 100.0)
    return SizeSpec(bytes=parse_bytes(text, source=source, field=field))


def format_bytes(n: float) -> str:
    """Human-readable bytes in SI units (GB), matching how the papers quote memory."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}" if abs(n / scale) < 1e6 else f"{n / scale:.6g} {unit}"  # no float noise
    return f"{int(n)} B"
