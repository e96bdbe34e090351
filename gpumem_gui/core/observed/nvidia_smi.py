"""``nvidia-smi``'s default table: one record per GPU row, with the processes table's rows for that GPU.

Source: the table nvidia-smi prints (NVIDIA's System Management Interface; the layout of drivers 418 .. 570
in the published fixtures): a GPU row "|   0  NVIDIA GeForce RTX 4090   Off | 00000000:4E:00.0 Off | ..."
followed by a line whose Memory-Usage cell is "USEDMiB / TOTALMiB" (MiB = 2^20 bytes: NVML reports bytes,
nvidia-smi prints them / 1024 / 1024); the processes table "|  GPU  GI  CI  PID  Type  Process name  GPU
Memory Usage |" rows end in "NMiB" (older drivers print no GI / CI columns). The table prints no free
memory (total - used - the driver's reserved memory, which only ``-q`` shows), so free is named unread.
A paste with several tables (one ``nvidia-smi`` after another) gives each table's GPUs their own records.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from gpumem_gui.core.observed.draft import MAX_LINE_CHARS, Draft

_QUOTE = re.compile(r"^[\s>]*")  # a table quoted in markdown ("> | ...") or indented in a log
_MODES = ("On", "Off", "WDDM", "TCC")  # the Persistence-M (Linux) or TCC/WDDM (Windows) column
_PROC_TYPES = ("C", "G", "C+G", "M", "M+C")  # the processes table's Type column
_MEMORY_CELL = re.compile(r"^\s*(\d+)MiB\s*/\s*(\d+)MiB\s*$")
_SMI_HEADER = re.compile(r"NVIDIA-SMI\s+\d")
_MIB = "MiB"


def find(text: str) -> Iterator[tuple[int, Draft]]:
    """Every GPU of every nvidia-smi table in ``text``: (offset of its row, record)."""
    table: dict[int, tuple[int, Draft]] = {}
    in_processes = False
    lines = text.splitlines(keepends=True)
    offset = 0
    for n, raw in enumerate(lines):
        start, offset = offset, offset + len(raw)
        if len(raw) > MAX_LINE_CHARS:
            continue
        line = _QUOTE.sub("", raw).rstrip()
        if _SMI_HEADER.search(line):  # a new table: the GPUs before it are done
            yield from table.values()
            table, in_processes = {}, False
            continue
        if line.startswith("| Processes:") or line.startswith("|  Processes:"):
            in_processes = True
            continue
        if not line.startswith("|"):
            continue
        if in_processes:
            _process_row(line, start, raw, table)
            continue
        cells = line.split("|")
        gpu = _gpu_cell(cells)
        if gpu is None:
            continue
        index, name = gpu
        if index in table:  # the same GPU again without a header: a second table
            yield from table.values()
            table = {}
        table[index] = (start, _gpu(index, name, lines[n : n + 4], raw))
    yield from table.values()


def _digits(word: str) -> bool:
    return word.isascii() and word.isdigit()


def _gpu_cell(cells: list[str]) -> tuple[int, str] | None:
    """(index, name) of a GPU row's first cell "   0  NVIDIA GeForce RTX 4090        Off ", else None
    (split into words, not matched by a pattern: linear in the cell, whatever it holds)."""
    words = cells[1].split() if len(cells) > 2 else []
    if len(words) < 3 or words[-1] not in _MODES or not _digits(words[0]) or len(words[0]) > 4:
        return None
    return int(words[0]), " ".join(words[1:-1])


def _gpu(index: int, name: str, rows: list[str], raw: str) -> Draft:
    """The GPU row and the line after it that holds the Memory-Usage cell."""
    d = Draft(source_format="nvidia_smi_table", gpu_index=index, gpu_name=name)
    for row in rows[1:]:
        if len(row) > MAX_LINE_CHARS:
            break
        cells = _QUOTE.sub("", row).rstrip().split("|")
        memory = next((m for c in cells if (m := _MEMORY_CELL.match(c))), None)
        if memory is not None:
            d.size("used_bytes", memory.group(1), _MIB, "Memory-Usage used")
            d.size("total_bytes", memory.group(2), _MIB, "Memory-Usage total")
            d.excerpt = raw + row
            break
        if _gpu_cell(cells) is not None:
            break
    else:
        d.excerpt = raw
    if "total_bytes" not in d.figures:
        d.excerpt = d.excerpt or raw
        d.unread.append(f"GPU {index}: the table ends before its Memory-Usage line")
    d.unread.append("free: the table does not print it (total - used - the driver's reserved memory)")
    return d


def _process_row(line: str, start: int, raw: str, table: dict[int, tuple[int, Draft]]) -> None:
    """One row of the processes table, added to its GPU's record (a record of its own if the GPU rows
    were not pasted)."""
    # "|    0   N/A  N/A     10734      C   ...foo_bar         160MiB |" (GI / CI columns since driver ~450),
    # "|    0      1234      C   python                            1000MiB |" (older drivers)
    words = line.strip("| \t").split()
    if len(words) >= 7 and words[4] in _PROC_TYPES:
        index, pid, name, amount = words[0], words[3], words[5:-1], words[-1]
    elif len(words) >= 5 and words[2] in _PROC_TYPES:
        index, pid, name, amount = words[0], words[1], words[3:-1], words[-1]
    else:
        return
    amount = amount.removesuffix(_MIB)
    if not (_digits(index) and len(index) <= 4 and _digits(pid) and (_digits(amount) or amount == "N/A")):
        return
    gpu = int(index)
    if gpu not in table:
        table[gpu] = (start, Draft(source_format="nvidia_smi_table", gpu_index=gpu, excerpt=""))
    d = table[gpu][1]
    if len(d.excerpt) < 3000:
        d.excerpt += raw
    if amount == "N/A":  # WDDM (Windows) drivers cannot attribute memory to a process
        d.unread.append(f"process {pid}: its GPU memory is N/A (the driver does not attribute it)")
        return
    d.process(amount, _MIB, pid=int(pid) if len(pid) < 11 else None, name=" ".join(name), this=False)
