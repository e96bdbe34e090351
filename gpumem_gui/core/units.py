"""Byte sizes: ``int`` bytes inside, GiB (2^30) or GB (10^9) on display, never mixed."""

from __future__ import annotations

from enum import StrEnum

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30
KB = 10**3
MB = 10**6
GB = 10**9


class SizeUnit(StrEnum):
    """The unit a front end shows sizes in; the whole display uses one of them at a time."""

    GIB = "GiB"
    GB = "GB"

    @property
    def factor(self) -> int:
        return GiB if self is SizeUnit.GIB else GB


def fmt_bytes(n: int, unit: SizeUnit = SizeUnit.GIB, digits: int = 2) -> str:
    """Format ``n`` bytes in the given unit, with the unit named: ``fmt_bytes(2**30) == '1.00 GiB'``."""
    return f"{n / unit.factor:.{digits}f} {unit.value}"


def fmt_count(n: int) -> str:
    """Human parameter count: ``7241732096 -> '7.24 B'``; exact below a thousand."""
    for div, suffix in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "K")):
        if abs(n) >= div:
            return f"{n / div:.2f} {suffix}"
    return str(n)
