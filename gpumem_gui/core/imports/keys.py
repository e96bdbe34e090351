"""Walking a config file's keys so that none is dropped silently: every key a parser reads is marked, the keys
it knows to change nothing in GPU memory are printed back as such, and every other key ends as a warning.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpumem_gui.core.errors import clip, short
from gpumem_gui.core.imports.base import Reading, to_bool, to_float, to_int

_MISSING = object()


class Keys:
    """The mapping ``data`` at ``prefix`` (``""`` for the top) of a config read into ``reading``."""

    def __init__(self, data: Mapping[str, Any], reading: Reading, prefix: str = "") -> None:
        self.data = data
        self.reading = reading
        self.prefix = prefix
        self.used: set[str] = set()

    def where(self, key: str) -> str:
        return f"key {clip(self.prefix + key)!r}"

    def written(self, key: str) -> str:
        return f"{self.prefix}{key}: {short(self.data.get(key), 60)}"

    def has(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def raw(self, key: str, default: Any = None) -> Any:
        """The value at ``key`` (marked read), or ``default`` when absent or null."""
        self.used.add(key)
        value = self.data.get(key, _MISSING)
        return default if value is _MISSING or value is None else value

    def int(self, key: str, lo: int | None = None, hi: int | None = None) -> int | None:
        value = self.raw(key)
        return None if value is None else to_int(value, self.where(key), lo=lo, hi=hi)

    def float(self, key: str, lo: float | None = None, hi: float | None = None) -> float | None:
        value = self.raw(key)
        return None if value is None else to_float(value, self.where(key), lo=lo, hi=hi)

    def bool(self, key: str) -> bool | None:
        value = self.raw(key)
        if isinstance(value, str) and value.strip().lower() == "auto":
            return None
        return None if value is None else to_bool(value, self.where(key))

    def str(self, key: str) -> str | None:
        value = self.raw(key)
        if value is None:
            return None
        if not isinstance(value, str | int | float) or isinstance(value, bool):
            raise self.reading.error(self.where(key), f"expected a text value, got {short(value)}")
        return str(value)

    def sub(self, key: str) -> Keys | None:
        """The mapping at ``key`` as its own :class:`Keys` (None when absent); anything else is an error."""
        value = self.raw(key)
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise self.reading.error(self.where(key), f"expected a mapping, got {short(value)}")
        return Keys(value, self.reading, f"{self.prefix}{key}.")

    def set(self, field: str, key: str, value: Any, shown: str | None = None) -> None:
        """Run field ``field`` read from ``key``."""
        if value is not None:
            self.reading.set(field, value, self.where(key), self.written(key), shown)

    def note(self, key: str, meaning: str) -> None:
        self.used.add(key)
        if key in self.data:
            self.reading.note(self.written(key), meaning)

    def warn(self, key: str, why: str) -> None:
        self.used.add(key)
        if key in self.data and self.data[key] not in (None, False):
            self.reading.warn(self.written(key), why)

    def no_memory(self, keys: Iterable[str], why: str = "no effect on GPU memory") -> None:
        """Keys that change nothing gpumem estimates: printed back together, in one line."""
        present = [k for k in keys if k in self.data]
        self.used.update(keys)
        if present:
            shown = ", ".join(self.prefix + k for k in present)
            self.reading.note(clip(shown, 200), why)

    def rest(self, why: str = "not modelled by gpumem; ignored") -> None:
        """Every key not read: a warning naming it (null and false values change nothing and are skipped)."""
        for key, value in self.data.items():
            if key not in self.used and value not in (None, False, "", [], {}):
                self.reading.warn(self.written(str(key)), why)
