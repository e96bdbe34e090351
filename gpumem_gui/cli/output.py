"""Plain-text and JSON output shared by the commands."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from gpumem_gui.core import GiB


def print_table(rows: Sequence[Sequence[str]], headers: Sequence[str], right: set[int] | None = None) -> None:
    right = right or set()
    widths = [max(len(str(r[i])) for r in [headers, *rows]) for i in range(len(headers))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            str(c).rjust(w) if i in right else str(c).ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    print(line(headers))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print(line(r))


def dump(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")


# how much of a user's value an error line repeats (the house rule: at most ~80 characters)
ECHO_CHARS = 60


def clip(text: str, n: int = ECHO_CHARS) -> str:
    """``repr(text)`` as an error line may repeat it: at most ``n`` characters of it, then its length."""
    if len(text) <= n:
        return repr(text)
    return f"{text[:n]!r}... ({len(text):,} characters)"


def gib(n: int) -> str:
    return f"{n / GiB:,.2f}"
