"""What the engines' log readers share: a log read line by line into one record per process and startup.

An engine's log interleaves its workers ("(VllmWorkerProcess pid=521) INFO ...", "[... TP3] ...",
"(Worker_TP0 pid=41699) ..."): each worker's lines go to its own record, keyed by that prefix. A figure or
part a worker states again starts its next record (a restart, or the same log pasted twice). A reader
gives :func:`read_log` a function that reads one line into the current record.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

from gpumem_gui.core.observed.draft import MAX_LINE_CHARS, Draft

# the worker a line belongs to: "(VllmWorkerProcess pid=521)", "(Worker_TP0 pid=41699)", "(EngineCore_DP0
# pid=49825)", SGLang's "[2025-03-25 16:37:06 TP0]" / "[... DP1 TP3]"
_WORKER = re.compile(r"\(([A-Za-z_]+\w*\s+pid=\d+)\)|\[[^\]]*?\b((?:DP\d+\s+)?(?:PP\d+\s+)?TP\d+)\]")
MAX_EXCERPT_LINES = 40

LineReader = Callable[[Draft, str], list[str]]  # reads a line into a record; returns the keys it set


def worker_of(line: str) -> str:
    m = _WORKER.search(line)
    return (m.group(1) or m.group(2)) if m else ""


def read_log(
    text: str,
    source_format: str,
    read_line: LineReader,
    markers: tuple[str, ...],
    key_of: Callable[[str], str] = worker_of,
) -> Iterator[tuple[int, Draft]]:
    """Every record of one engine's log in ``text``; every line the reader reads holds one of ``markers``
    (the cheap test that skips the rest of a long log); ``key_of`` says whose record a line is (the worker,
    by default)."""
    open_records: dict[str, tuple[int, Draft, set[str], list[str]]] = {}
    offset = 0
    for raw in text.splitlines(keepends=True):
        start, offset = offset, offset + len(raw)
        if len(raw) > MAX_LINE_CHARS or not any(m in raw for m in markers):
            continue
        worker = key_of(raw)
        rec = open_records.get(worker)
        probe = Draft(source_format=source_format)
        keys = read_line(probe, raw)
        if not keys:
            continue
        if rec is not None and rec[2] & set(keys):  # stated again: the worker's next startup
            yield _close(rec)
            rec = None
        if rec is None:
            rec = (start, Draft(source_format=source_format), set(), [])
            open_records[worker] = rec
        _merge(rec[1], probe)
        rec[2].update(keys)
        if len(rec[3]) < MAX_EXCERPT_LINES:
            rec[3].append(raw.rstrip("\r\n"))
    for rec in open_records.values():
        yield _close(rec)


def _merge(into: Draft, probe: Draft) -> None:
    into.figures.update(probe.figures)
    into.parts.update(probe.parts)
    into.unread.extend(probe.unread)
    into.derived.update(probe.derived)
    if probe.gpu_index is not None:
        into.gpu_index = probe.gpu_index


def _close(rec: tuple[int, Draft, set[str], list[str]]) -> tuple[int, Draft]:
    start, d, _, lines = rec
    d.excerpt = "\n".join(lines)
    return start, d
