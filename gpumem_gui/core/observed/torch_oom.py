"""PyTorch's CUDA out-of-memory message, in each form its caching allocator has printed.

Source: ``c10/cuda/CUDACachingAllocator.cpp``, ``DeviceCachingAllocator::malloc`` (the ``TORCH_CHECK_WITH(
OutOfMemoryError, ...)`` after the last ``alloc_block`` retry) and ``reportProcessMemoryInfo``; sizes by
``format_size`` ("N bytes" up to 1 KiB, then "%.2f KiB|MiB|GiB", powers of 1024). The forms, newest first:

* ``torch_oom`` (2024+): "Tried to allocate R. GPU g has a total capacity of T of which F is free.
  [Including non-PyTorch memory, this process has P memory in use. | Process pid has P memory in use. ]*
  [A allowed; ]Of the allocated memory X is allocated by PyTorch, [with V allocated in private pools (e.g.,
  CUDA Graphs), ]and U is reserved by PyTorch but unallocated." X counts the private pools; U is
  reserved - X, so reserved = X + U.
* ``torch_oom_2023``: the same sentences with "total capacty" (sic; as printed in 2023, before the typo was
  fixed) and the ``max_split_size_mb`` hint.
* ``torch_oom_legacy`` (before 2023): "Tried to allocate R (GPU g; T total capacity; X already allocated; F
  free; [A allowed; ]W reserved in total by PyTorch)".
* ``torch_oom_cached`` (the oldest, from pytorch/pytorch PR 13751, 2018): "(GPU g; T total capacity; X
  already allocated; F free; C cached)", where "cached" is "memory held by the allocator but not used by
  the program" (the PR's own definition), so reserved = X + C.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from gpumem_gui.core.observed.draft import Draft

# a size as format_size prints it (the number may be any length: an out-of-range one is named, not parsed)
_SIZE = r"(\d+(?:\.\d+)?)\s+(bytes|KiB|MiB|GiB)"
# PyTorch on ROCm prints the same message with "HIP" (the source is hipified: CUDA -> HIP)


def _p(text: str) -> str:
    """A sentence of the message as a pattern: each space may be any whitespace (a wrapped paste)."""
    return text.replace(" ", r"\s+").replace("{SIZE}", _SIZE)


_HEAD = re.compile(
    _p(
        r"(?:CUDA|HIP) out of memory\. Tried to allocate {SIZE}\. "
        r"GPU (\d+) has a total (capacity|capacty) of {SIZE} of which {SIZE} is free\."
    )
)
_PROC = re.compile(
    _p(r"\s*(?:(Including non-PyTorch memory, this process)|Process (\d+)) has {SIZE} memory in use\.")
)
_ALLOWED = re.compile(_p(r"\s*{SIZE} allowed;"))
_ALLOCATED = re.compile(_p(r"\s*Of the allocated memory {SIZE} is allocated by PyTorch,"))
_PRIVATE = re.compile(_p(r"\s*with {SIZE} allocated in private pools \(e\.g\., CUDA Graphs\),"))
_UNALLOCATED = re.compile(_p(r"\s*and {SIZE} is reserved by PyTorch but unallocated\."))

# "(GPU g; T total capacity; X already allocated; F free; [A allowed; ]W reserved in total by PyTorch)";
# a paste cut before the ")" is read to the end of its line (group 5)
_LEGACY = re.compile(
    _p(r"(?:CUDA|HIP) out of memory\. Tried to allocate {SIZE} \(GPU (\d+);")
    + r"(?:([^()]{0,400})\)|([^()\n]{0,400})(?:\n|\Z))"
)
_ITEM = re.compile(r"^\s*" + _SIZE + r"\s+(.+?)\s*$")
_LEGACY_LABELS = {
    "total capacity": "total_bytes",
    "already allocated": "allocated_bytes",
    "free": "free_bytes",
    "allowed": "allowed_bytes",
    "reserved in total by PyTorch": "reserved_bytes",
    "cached": "reserved_unallocated_bytes",
}
_ROUNDING = "each printed to 0.01 of its unit by format_size"


def find(text: str) -> Iterator[tuple[int, Draft]]:
    """Every OOM message in ``text``: (offset, record), in text order per form."""
    for m in _HEAD.finditer(text):
        yield _line_start(text, m.start()), _current(text, m)
    for m in _LEGACY.finditer(text):
        yield _line_start(text, m.start()), _legacy(text, m)


def _line_start(text: str, pos: int) -> int:
    return text.rfind("\n", 0, pos) + 1


def _current(text: str, m: re.Match[str]) -> Draft:
    form = "torch_oom" if m.group(4) == "capacity" else "torch_oom_2023"
    d = Draft(source_format=form, gpu_index=int(m.group(3)) if len(m.group(3)) < 5 else None)
    d.size("requested_bytes", m.group(1), m.group(2), "Tried to allocate")
    d.size("total_bytes", m.group(5), m.group(6), "total capacity")
    d.size("free_bytes", m.group(7), m.group(8), "free")
    pos = m.end()
    while p := _PROC.match(text, pos):
        this = p.group(1) is not None
        pid = int(p.group(2)) if p.group(2) and len(p.group(2)) < 11 else None
        d.process(p.group(3), p.group(4), pid=pid, name=None, this=this)
        if this:
            d.size("process_bytes", p.group(3), p.group(4), "this process has ... memory in use")
        pos = p.end()
    if a := _ALLOWED.match(text, pos):
        d.size("allowed_bytes", a.group(1), a.group(2), "allowed")
        pos = a.end()
    pos = _allocated(d, text, pos)
    d.excerpt = text[_line_start(text, m.start()) : pos]
    if "process_bytes" not in d.figures and not any(p.this_process for p in d.processes):
        d.unread.append(
            "this process's memory: the message has no 'Including non-PyTorch memory, this process has' "
            "sentence (NVML did not list this process's pid: another pid namespace, or no NVML)"
        )
    _drop_unknown_process(d)
    return d


def _drop_unknown_process(d: Draft) -> None:
    """ "this process has 0 bytes memory in use" beside tensors allocated by PyTorch is not a measurement:
    the figure is NVML's ``usedGpuMemory`` for this pid (``reportProcessMemoryInfo`` in
    c10/cuda/CUDACachingAllocator.cpp), which NVML leaves at 0 where it cannot account per process (WSL and
    Windows WDDM, some virtualised GPUs). A process holding PyTorch's reserve cannot hold 0 bytes, so the
    figure is left unread rather than read as "every used byte belongs to other processes"."""
    if d.figures.get("process_bytes") == 0 and d.figures.get("allocated_bytes", 0) > 0:
        del d.figures["process_bytes"]
        d.processes = [p for p in d.processes if not p.this_process]
        d.unread.append(
            "this process's memory: the message says 0 bytes while PyTorch holds tensors (NVML gave no "
            "per-process figure: WSL, Windows WDDM or a virtualised GPU); not used"
        )


def _allocated(d: Draft, text: str, pos: int) -> int:
    """The 'Of the allocated memory ...' sentence; returns where the message's figures end."""
    a = _ALLOCATED.match(text, pos)
    if a is None:
        d.unread.append(
            "allocated / reserved but unallocated: the text ends before 'Of the allocated memory'"
        )
        return pos
    d.size("allocated_bytes", a.group(1), a.group(2), "allocated by PyTorch")
    pos = a.end()
    if v := _PRIVATE.match(text, pos):
        d.unread.append(
            f"private pools (CUDA Graphs) {v.group(1)} {v.group(2)}: counted in allocated_bytes, "
            "no figure of its own"
        )
        pos = v.end()
    u = _UNALLOCATED.match(text, pos)
    if u is None:
        d.unread.append(
            "reserved but unallocated: the text ends before 'is reserved by PyTorch but unallocated'"
        )
        return pos
    d.size("reserved_unallocated_bytes", u.group(1), u.group(2), "reserved by PyTorch but unallocated")
    _derive_reserved(d)
    return u.end()


def _derive_reserved(d: Draft) -> None:
    f = d.figures
    if "allocated_bytes" in f and "reserved_unallocated_bytes" in f:
        d.derive(
            "reserved_bytes",
            f["allocated_bytes"] + f["reserved_unallocated_bytes"],
            f"allocated_bytes + reserved_unallocated_bytes ({_ROUNDING})",
        )
    elif "allocated_bytes" in f and "reserved_bytes" in f:
        d.derive(
            "reserved_unallocated_bytes",
            f["reserved_bytes"] - f["allocated_bytes"],
            f"reserved_bytes - allocated_bytes ({_ROUNDING})",
        )


def _legacy(text: str, m: re.Match[str]) -> Draft:
    items = (m.group(4) if m.group(4) is not None else m.group(5)).split(";")
    form = "torch_oom_cached" if items and items[-1].strip().endswith("cached") else "torch_oom_legacy"
    d = Draft(source_format=form, gpu_index=int(m.group(3)) if len(m.group(3)) < 5 else None)
    d.excerpt = text[_line_start(text, m.start()) : m.end()]
    d.size("requested_bytes", m.group(1), m.group(2), "Tried to allocate")
    for item in items:
        i = _ITEM.match(item)
        figure = _LEGACY_LABELS.get(i.group(3)) if i else None
        if i is None or figure is None:
            if item.strip():
                d.unread.append(f"'{item.strip()[:60]}': not a figure this form prints")
            continue
        d.size(figure, i.group(1), i.group(2), i.group(3))
    _derive_reserved(d)
    if m.group(4) is None:
        d.unread.append("the message is cut before its closing parenthesis: what follows was not read")
    d.unread.append("this process's memory: this form does not state it (non-PyTorch memory unknown)")
    return d
