"""``torch.cuda.memory_stats()``: the allocator's counters, printed as a dict, an OrderedDict or JSON.

Source: ``torch/cuda/memory.py``, ``memory_stats`` (flattened "STAT.POOL.METRIC" keys from
``memory_stats_as_nested_dict``, sorted, in an ``OrderedDict``; every size in bytes, as ints) over
``c10/cuda/CUDACachingAllocator.cpp``'s ``DeviceStats``. A paste is read key by key, whatever the printing
(``{'allocated_bytes.all.current': 1024, ...}``, ``OrderedDict([('allocated_bytes.all.current', 1024),
...])`` or ``"allocated_bytes.all.current": 1024``); a key seen again starts the next record (several
devices' stats pasted one after another).
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from gpumem_gui.core.observed.draft import Draft

# "'allocated_bytes.all.current': 1024" / "('allocated_bytes.all.current', 1024)" / JSON's double quotes
_PAIR = re.compile(r"""['"]([a-z_]+_bytes\.all\.(?:current|peak))['"]\s*[:,]\s*(-?\d+)""")
_KEYS = {
    "allocated_bytes.all.current": "allocated_bytes",
    "allocated_bytes.all.peak": "peak_allocated_bytes",
    "reserved_bytes.all.current": "reserved_bytes",
    "reserved_bytes.all.peak": "peak_reserved_bytes",
}
_MAX_GAP = 4000  # characters between two keys of one printed dict (the stats dict prints ~80 keys)


def find(text: str) -> Iterator[tuple[int, Draft]]:
    """Every memory_stats() dict in ``text``: (offset of its first key, record)."""
    current: tuple[int, Draft] | None = None
    seen: set[str] = set()
    last_end = 0
    for m in _PAIR.finditer(text):
        key = m.group(1)
        if current is not None and (key in seen or m.start() - last_end > _MAX_GAP):
            yield _done(current, text, last_end)
            current = None
        if current is None:
            current, seen = (m.start(), Draft(source_format="torch_memory_stats")), set()
        seen.add(key)
        last_end = m.end()
        if key in _KEYS:
            current[1].size(_KEYS[key], m.group(2), "bytes", key)
    if current is not None:
        yield _done(current, text, last_end)


def _done(pair: tuple[int, Draft], text: str, end: int) -> tuple[int, Draft]:
    start, d = pair
    d.excerpt = text[start:end]
    f = d.figures
    if "reserved_bytes" in f and "allocated_bytes" in f:
        d.derive(
            "reserved_unallocated_bytes",
            f["reserved_bytes"] - f["allocated_bytes"],
            "reserved_bytes - allocated_bytes (reserved_bytes.all.current - allocated_bytes.all.current)",
        )
    for key, figure in _KEYS.items():
        if figure not in f:
            d.unread.append(f"{key}: not in the pasted stats")
    return pair
