"""``nvidia-smi --query-gpu=FIELDS --format=csv[,noheader][,nounits]``: one record per GPU row.

Source: nvidia-smi's CSV output (``nvidia-smi --help-query-gpu``): a header line naming each queried field
with its unit in brackets ("memory.total [MiB]"), then one line per GPU, values separated by ", ", each
with its unit ("81920 MiB") unless ``nounits``. The memory fields are in MiB (2^20 bytes). ``noheader``
drops the header, so the columns are known only from the command: a paste that holds the command line
(``--query-gpu=gpu_name,memory.free``) is read by it; without either, the rows cannot be named and are not
read.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from gpumem_gui.core.observed.draft import MAX_LINE_CHARS, Draft

# the fields that carry a figure, and where they go (nvidia-smi --help-query-gpu)
FIELDS = {
    "memory.total": "total_bytes",
    "memory.used": "used_bytes",
    "memory.free": "free_bytes",
}
_NAMES = ("name", "gpu_name")
_INDEX = ("index",)
_HEADER_FIELD = re.compile(r"^([a-z_][a-z0-9_.]*)(?:\s*\[([^\]]{1,10})\])?$")
_COMMAND = re.compile(r"--query-gpu[= ]([a-z0-9_.,]{1,400})\s+--format[= ]csv((?:,[a-z]+){0,3})")
_VALUE = re.compile(r"^(\d+(?:\.\d+)?)(?:\s*(MiB))?$")
_MAX_COLUMNS = 64


def find(text: str) -> Iterator[tuple[int, Draft]]:
    """Every CSV row of a memory query in ``text``: (offset of the row, record)."""
    lines = text.splitlines(keepends=True)
    offset = 0
    columns: list[tuple[str, str | None]] | None = None  # (field, unit) of the table being read
    for raw in lines:
        start, offset = offset, offset + len(raw)
        if len(raw) > MAX_LINE_CHARS:
            columns = None
            continue
        line = raw.strip().lstrip(">").strip()
        command = _COMMAND.search(line)
        if command is not None:
            noheader = "noheader" in command.group(2)
            fields = command.group(1).strip(",").split(",")
            columns = [(f, None) for f in fields] if noheader and _has_memory(fields) else None
            continue
        header = _header(line)
        if header is not None:
            columns = header
            continue
        if columns is None:
            continue
        values = [v.strip() for v in line.split(",")]
        if len(values) != len(columns) or not line:
            columns = None  # the table ended
            continue
        yield start, _row(columns, values, raw)


def _has_memory(fields: list[str]) -> bool:
    return any(f.strip() in FIELDS for f in fields)


def _header(line: str) -> list[tuple[str, str | None]] | None:
    """The columns of a header line that queries at least one memory field, or None."""
    parts = [p.strip() for p in line.split(",")]
    if not 0 < len(parts) <= _MAX_COLUMNS:
        return None
    matches = [_HEADER_FIELD.match(p) for p in parts]
    if any(m is None for m in matches):
        return None
    columns = [(m.group(1), m.group(2)) for m in matches if m is not None]
    return columns if _has_memory([c for c, _ in columns]) else None


def _row(columns: list[tuple[str, str | None]], values: list[str], raw: str) -> Draft:
    d = Draft(source_format="nvidia_smi_csv", excerpt=raw)
    for (field, unit), value in zip(columns, values, strict=True):
        if field in _INDEX and value.isdigit() and len(value) < 5:
            d.gpu_index = int(value)
        elif field in _NAMES:
            d.gpu_name = value
        elif field in FIELDS:
            _figure(d, field, unit, value)
        elif field.startswith("memory."):
            d.unread.append(f"{field}: not a figure gpumem reads")
    return d


def _figure(d: Draft, field: str, unit: str | None, value: str) -> None:
    m = _VALUE.match(value)
    if m is None:
        d.unread.append(f"{field}: '{value[:40]}' is not a size in MiB")
        return
    # the value's own unit, else the header's, else MiB: nvidia-smi prints memory fields in MiB
    stated_unit = m.group(2) or unit or "MiB"
    d.size(FIELDS[field], m.group(1), stated_unit, field)
