"""``torch.cuda.memory_summary()``: the caching allocator's table, one record per printed summary.

Source: ``torch/cuda/memory.py``, ``memory_summary`` (rows "Allocated memory", "Active memory", "Requested
memory", "GPU reserved memory", "Non-releasable memory" and the counts; columns Cur Usage | Peak Usage | Tot
Alloc | Tot Freed) and ``_format_size``: the bytes divided by 1024 with ``//`` while the row's largest
value is over 768 KiB, printed as an integer with its prefix, so a printed value is the figure rounded
*down* to its unit (the true figure is less than one unit more). Current releases print "B", "KiB", "MiB",
"GiB", "TiB"; releases of 2020 printed the same powers of 1024 labelled "B", "KB", "MB", "GB", "TB". The
header "PyTorch CUDA memory summary, device ID N" names the GPU; a paste cut before it is read from its
first metric row.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from gpumem_gui.core.observed.draft import MAX_LINE_CHARS, Draft

_HEADER = re.compile(r"PyTorch CUDA memory summary, device ID (\d+)")
# a value cell of a row "| Allocated memory      |  14324 MiB |  14324 MiB |  14324 MiB |      0 B   |"
_VALUE = re.compile(r"^\s*(\d+)\s*([KMGTP]i?B|B)\s*$")
# _format_size's prefixes, in the 1024 steps it divides by (old labels KB, MB ... are the same powers)
_UNIT = {"B": "B", "KB": "KiB", "MB": "MiB", "GB": "GiB", "TB": "TiB", "PB": "PiB"}
_ROWS = {
    "Allocated memory": ("allocated_bytes", "peak_allocated_bytes"),
    "GPU reserved memory": ("reserved_bytes", "peak_reserved_bytes"),
}
_NOT_FIGURES = ("Active memory", "Requested memory", "Non-releasable memory")
_FLOOR = "printed rounded down to its unit by _format_size"


def find(text: str) -> Iterator[tuple[int, Draft]]:
    """Every memory summary in ``text``: (offset of its header or first row, record)."""
    current: tuple[int, Draft] | None = None
    offset = 0
    for raw in text.splitlines(keepends=True):
        start, offset = offset, offset + len(raw)
        if len(raw) > MAX_LINE_CHARS:
            continue
        line = raw.strip().lstrip(">").strip()
        header = _HEADER.search(line)
        if header is not None:
            if current is not None:
                yield _done(current)
            index = int(header.group(1)) if len(header.group(1)) < 5 else None
            current = (start, Draft(source_format="torch_memory_summary", gpu_index=index, excerpt=raw))
            continue
        row = _row_of(line)
        if row is None:
            continue
        name = row[0]
        if current is None and name not in _ROWS and name not in _NOT_FIGURES:
            continue  # a table that is not a memory summary
        if current is None or (name in _ROWS and _ROWS[name][0] in current[1].figures):
            if current is not None:  # the same row again: a second summary pasted without its header
                yield _done(current)
            current = (start, Draft(source_format="torch_memory_summary"))
        _row(current[1], row, raw)
    if current is not None:
        yield _done(current)


def _row_of(line: str) -> tuple[str, re.Match[str], re.Match[str]] | None:
    """(metric, Cur Usage, Peak Usage) of a size row, else None (split into cells, not one pattern)."""
    cells = line.split("|")
    if len(cells) < 4 or cells[0].strip():
        return None
    name = " ".join(cells[1].split())
    cur, peak = _VALUE.match(cells[2]), _VALUE.match(cells[3])
    if not name or cur is None or peak is None:
        return None
    return name, cur, peak


def _row(d: Draft, row: tuple[str, re.Match[str], re.Match[str]], raw: str) -> None:
    name, cur_m, peak_m = row
    if len(d.excerpt) < 3500:
        d.excerpt += raw
    if name in _ROWS:
        cur, peak = _ROWS[name]
        d.size(cur, cur_m.group(1), _UNIT.get(cur_m.group(2), cur_m.group(2)), f"{name} Cur Usage")
        d.size(peak, peak_m.group(1), _UNIT.get(peak_m.group(2), peak_m.group(2)), f"{name} Peak Usage")
    elif name in _NOT_FIGURES and not any(line.startswith(name) for line in d.unread):
        d.unread.append(f"{name}: printed, but not one of the figures gpumem compares")


def _done(pair: tuple[int, Draft]) -> tuple[int, Draft]:
    d = pair[1]
    f = d.figures
    if "reserved_bytes" in f and "allocated_bytes" in f:
        d.derive(
            "reserved_unallocated_bytes",
            f["reserved_bytes"] - f["allocated_bytes"],
            f"reserved_bytes - allocated_bytes (each {_FLOOR})",
        )
    for figure, row in (("allocated_bytes", "Allocated memory"), ("reserved_bytes", "GPU reserved memory")):
        if figure not in f:
            d.unread.append(f"{row}: the pasted summary has no such row")
    return pair
