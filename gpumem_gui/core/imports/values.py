"""The values of an imported command or config: whole numbers, numbers, booleans and choices as a command
line or a YAML / JSON file writes them, each read strictly or refused with one line naming where."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from gpumem_gui.core.errors import GpumemInputError, short

_WHOLE = re.compile(r"[+-]?[0-9]+")  # a whole number as a command line writes it (ASCII digits)


def bad(where: str, message: str) -> GpumemInputError:
    """One error line at ``where`` (``argument 5 '--max-model-len'`` or ``key 'optimizer.lr'``)."""
    return GpumemInputError(f"{where}: {message}")


def to_int(value: object, where: str, *, lo: int | None = None, hi: int | None = None) -> int:
    """``value`` (a word, or a YAML/JSON number) as a whole number in [lo, hi], or an error at ``where``."""
    if isinstance(value, bool):
        raise bad(where, f"expected a whole number, got {short(value)}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
        n = int(value)
    elif isinstance(value, str) and _WHOLE.fullmatch(value.strip()) and len(value) < 40:
        n = int(value.strip())  # ASCII digits only: str.isdigit() also takes '²' or '٣', which int() refuses
    else:
        raise bad(where, f"expected a whole number, got {short(value)}")
    if (lo is not None and n < lo) or (hi is not None and n > hi):
        span = f"{lo if lo is not None else '-inf'} to {hi if hi is not None else 'inf'}"
        raise bad(where, f"{n} is out of range ({span})")
    return n


def to_float(value: object, where: str, *, lo: float | None = None, hi: float | None = None) -> float:
    """``value`` as a finite number in [lo, hi], or an error at ``where``."""
    x: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        x = float(value)
    elif isinstance(value, str) and len(value) < 60:
        try:
            x = float(value)
        except ValueError:
            x = None
    if x is None or not math.isfinite(x):
        raise bad(where, f"expected a number, got {short(value)}")
    if (lo is not None and x < lo) or (hi is not None and x > hi):
        raise bad(where, f"{x:g} is out of range ({lo} to {hi})")
    return x


_TRUE = ("1", "true", "yes", "on", "y", "t")
_FALSE = ("0", "false", "no", "off", "n", "f", "none", "null")


def to_bool(value: object, where: str) -> bool:
    """``value`` as a boolean (true/false, yes/no, on/off, 1/0), or an error at ``where``."""
    if isinstance(value, bool):
        return value
    if value is None:
        return False
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise bad(where, f"expected true or false, got {short(value)}")


def to_choice(value: object, where: str, choices: Mapping[str, Any]) -> Any:
    """``value`` (case-insensitive) looked up in ``choices``, or an error listing them."""
    key = str(value).strip().lower() if isinstance(value, str | int | float) else None
    if key is None or key not in choices:
        raise bad(where, f"{short(value)} is not one of {', '.join(sorted(choices))}")
    return choices[key]
