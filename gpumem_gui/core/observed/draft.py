"""What every reader shares: sizes as a source prints them, turned into bytes, and one record being read.

A reader finds its report in the text and fills a :class:`Draft`: each figure from a number and the unit the
source printed next to it (or the unit the source always uses, named by the reader), a derived figure with
its formula, and a line for each part it could not read. :meth:`Draft.build` makes the frozen
:class:`ObservedMemory`; a figure the model cannot hold (over its 1 EiB bound) is named in ``unread``
instead of raising.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation

from gpumem_gui.core.observed.model import ObservedMemory, ObservedProcess
from gpumem_gui.core.units import GiB, KiB, MiB

MAX_BYTES = 1 << 60  # the model's bound (observed/model.py, Bytes)
MAX_EXCERPT = 4000  # the model's bound on ``excerpt``
_NOT_A_SIZE = "is not a size gpumem can hold (negative, or over 1 EiB)"
MAX_NUMBER_CHARS = 40
# a table's or a log's line longer than this is not one the sources print (nvidia-smi's table is ~90
# characters wide, memory_summary's 77, an engine's log line well under 2,000): skipped, which keeps every
# line pattern linear in the text (no pattern sees a line of megabytes)
MAX_LINE_CHARS = 4000  # a longer number is not a size any report prints; read as out of range, not parsed

# The units the sources print, as powers of two: PyTorch's format_size (c10/cuda/CUDACachingAllocator.cpp:
# "bytes", "KiB", "MiB", "GiB", dividing by 1024), nvidia-smi's "MiB" (NVML reports bytes; nvidia-smi prints
# them / 2^20), vLLM's "GiB" (vllm/utils GiB_bytes = 1 << 30), llama.cpp's "MiB" (size / 1024.0 / 1024.0).
UNITS: dict[str, int] = {
    "b": 1,
    "byte": 1,
    "bytes": 1,
    "kib": KiB,
    "mib": MiB,
    "gib": GiB,
    "tib": 1 << 40,
}


def to_bytes(number: str, unit: str) -> int | None:
    """``number`` ``unit`` in bytes, rounded to the byte; None when it is not a size (or over 1 EiB)."""
    factor = UNITS.get(unit.strip().lower())
    if factor is None or len(number) > MAX_NUMBER_CHARS:
        return None
    try:
        value = Decimal(number.replace(",", ""))
    except InvalidOperation:
        return None
    if not value.is_finite() or value < 0:
        return None
    n = int((value * factor).to_integral_value())
    return n if n <= MAX_BYTES else None


def clip_excerpt(text: str) -> str:
    """The record's excerpt: the lines it was read from, clipped to the model's bound."""
    text = text.strip()
    return text if len(text) <= MAX_EXCERPT else text[: MAX_EXCERPT - 1] + "…"


@dataclass
class Draft:
    """One record being read: figures in bytes, derived ones with their formulas, and what was not read."""

    source_format: str
    excerpt: str = ""
    gpu_index: int | None = None
    gpu_name: str | None = None
    figures: dict[str, int] = field(default_factory=dict)
    derived: dict[str, str] = field(default_factory=dict)
    unread: list[str] = field(default_factory=list)
    processes: list[ObservedProcess] = field(default_factory=list)
    parts: dict[str, int] = field(default_factory=dict)

    def size(self, figure: str, number: str, unit: str, what: str) -> int | None:
        """Set ``figure`` from ``number unit`` as the text states it; out of range -> a line in unread."""
        n = to_bytes(number, unit)
        if n is None:
            self.unread.append(f"{what}: {_short(number)} {_short(unit)} {_NOT_A_SIZE}")
        else:
            self.figures[figure] = n
        return n

    def part(self, name: str, number: str, unit: str, what: str) -> None:
        """Set the part ``name`` (observed/model.py PARTS) from ``number unit``; out of range -> unread."""
        n = to_bytes(number, unit)
        if n is None:
            self.unread.append(f"{what}: {_short(number)} {_short(unit)} {_NOT_A_SIZE}")
        else:
            self.parts[name] = n

    def derive(self, figure: str, value: int, formula: str) -> None:
        """Set ``figure`` computed from stated figures (kept only when in range and not stated)."""
        if figure in self.figures or not 0 <= value <= MAX_BYTES:
            return
        self.figures[figure] = value
        self.derived[figure] = formula

    def process(self, number: str, unit: str, *, pid: int | None, name: str | None, this: bool) -> None:
        """One process the report lists; a size out of range is named in unread."""
        n = to_bytes(number, unit)
        who = "this process" if this else f"process {pid if pid is not None else _short(name or '?')}"
        if n is None:
            self.unread.append(f"{who}: {_short(number)} {_short(unit)} {_NOT_A_SIZE}")
            return
        if pid is not None and not 0 <= pid < 1 << 32:
            pid = None
        self.processes.append(ObservedProcess(pid=pid, name=_name(name), bytes=n, this_process=this))

    def build(self) -> ObservedMemory:
        index = self.gpu_index if self.gpu_index is not None and 0 <= self.gpu_index <= 1023 else None
        return ObservedMemory(
            source_format=self.source_format,  # type: ignore[arg-type]  # each reader passes a SourceFormat
            gpu_index=index,
            gpu_name=_name(self.gpu_name),
            derived=dict(self.derived),
            unread=tuple(self.unread),
            excerpt=clip_excerpt(self.excerpt),
            processes=tuple(self.processes[:1024]),
            parts=dict(self.parts),  # type: ignore[arg-type]  # each reader passes PARTS names
            **self.figures,
        )


def _name(name: str | None) -> str | None:
    name = (name or "").strip()
    return name[:200] or None


def _short(text: str, limit: int = 40) -> str:
    """A value quoted in an unread line, clipped (the house rule: never echo a long value)."""
    return text if len(text) <= limit else text[: limit - 1] + "…"
