"""A ``torch.cuda.memory._snapshot()`` pickle, read by a restricted unpickler: one record per device.

Source: ``torch/cuda/memory.py`` ``_snapshot`` (its docstring's ``Snapshot`` / ``Segment`` / ``Block`` /
``TraceEntry``) and ``_dump_snapshot`` (``pickle.dump(s, f)``, Python's default protocol). A segment is one
``cudaMalloc``: ``total_size`` (reserved), ``allocated_size`` (in use by tensors), ``device``, ``blocks``
(``size``, ``state``). "The size of reserved memory is the sum of all Segments". A trace entry whose
``action`` is ``"oom"`` holds the request (``size``) and ``device_free`` (older releases put it in
``addr``: ``record_trace(TraceEntry::OOM, device_free, ...)`` in ``CUDACachingAllocator.cpp``).

The pickle is never given to ``pickle.load``: :class:`_PlainUnpickler` refuses every global (so no class,
no function, no ``__reduce__`` callable can be built; a malicious pickle fails before anything runs) and
persistent ids, and :func:`_check_plain` accepts only dict, list, tuple, str, int, float, bool and None,
counting each object once (a pickle's shared references cannot make the walk exponential) up to
:data:`MAX_OBJECTS`.
"""

from __future__ import annotations

import io
import pickle
from typing import Any, NoReturn

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.observed.draft import MAX_BYTES, Draft

PICKLE_PROTOCOLS = (2, 3, 4, 5)  # b"\x80" then the protocol: what pickle.dump writes since Python 3.0
MAX_OBJECTS = 5_000_000  # a snapshot of a long run with history is millions of frames; more is refused
_PLAIN = (dict, list, tuple, str, int, float, bool, type(None))


def is_snapshot_pickle(data: bytes) -> bool:
    """The pickle magic: PROTO opcode (0x80) and a protocol number (a UTF-8 text never starts with 0x80)."""
    return len(data) >= 2 and data[0] == 0x80 and data[1] in PICKLE_PROTOCOLS


class _PlainUnpickler(pickle.Unpickler):
    """An unpickler that builds only what the pickle opcodes build without a global: every class and
    function lookup (GLOBAL, STACK_GLOBAL, INST, OBJ, the copyreg extension codes) ends in find_class."""

    def find_class(self, module: str, name: str) -> NoReturn:
        raise GpumemInputError(
            f"the pickle asks for {module[:40]}.{name[:40]}: a memory snapshot holds only dicts, lists, "
            "strings and numbers; gpumem does not load anything else"
        )

    def persistent_load(self, pid: object) -> NoReturn:
        raise GpumemInputError("the pickle holds a persistent id: not a torch.cuda.memory._snapshot() pickle")


def load_plain(data: bytes) -> Any:
    """The object the pickle holds, built from plain types only; GpumemInputError on anything else."""
    try:
        obj = _PlainUnpickler(io.BytesIO(data)).load()
    except GpumemInputError:
        raise
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError, IndexError, AttributeError,
            OverflowError, MemoryError, RecursionError, UnicodeDecodeError) as e:  # fmt: skip
        raise GpumemInputError(f"the memory snapshot pickle is damaged ({type(e).__name__})") from None
    _check_plain(obj)
    return obj


def _check_plain(root: Any) -> None:
    seen: set[int] = set()
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if len(seen) > MAX_OBJECTS:
            raise GpumemInputError(
                f"the memory snapshot holds over {MAX_OBJECTS:,} objects; gpumem reads fewer"
            )
        if not isinstance(obj, _PLAIN):
            raise GpumemInputError(
                f"the pickle holds a {type(obj).__name__}: a memory snapshot holds only dicts, lists, "
                "strings and numbers"
            )
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, list | tuple):
            stack.extend(obj)


def records(snapshot: Any) -> list[tuple[int, Draft]]:
    """One record per device the snapshot's segments or OOM traces name."""
    if isinstance(snapshot, list):  # torch.cuda.memory_snapshot(): the segments alone
        snapshot = {"segments": snapshot}
    if not isinstance(snapshot, dict) or not isinstance(snapshot.get("segments"), list):
        raise GpumemInputError("the pickle is not a torch.cuda.memory._snapshot(): it has no 'segments' list")
    drafts: dict[int, Draft] = {}
    for seg in snapshot["segments"]:
        if isinstance(seg, dict):
            _segment(drafts, seg)
    traces = snapshot.get("device_traces")
    if isinstance(traces, list):
        for device, trace in enumerate(traces):
            if isinstance(trace, list):
                _last_oom(drafts, device, trace)
    if not drafts:
        drafts[0] = Draft(source_format="torch_memory_snapshot", gpu_index=None)
        drafts[0].unread.append("the snapshot has no segments: nothing was reserved")
    return [(n, _done(d)) for n, d in enumerate(drafts.values())]


def _draft(drafts: dict[int, Draft], device: int) -> Draft:
    if device not in drafts:
        drafts[device] = Draft(source_format="torch_memory_snapshot", gpu_index=device, excerpt="")
        drafts[device].figures.update(reserved_bytes=0, allocated_bytes=0)
    return drafts[device]


def _int(value: Any) -> int | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_BYTES
    return value if ok else None


def _segment(drafts: dict[int, Draft], seg: dict[str, Any]) -> None:
    device = seg.get("device", 0)
    device = device if isinstance(device, int) and 0 <= device <= 1023 else 0
    d = _draft(drafts, device)
    total = _int(seg.get("total_size"))
    allocated = _int(seg.get("allocated_size"))
    if allocated is None and isinstance(seg.get("blocks"), list):  # older snapshots: the blocks' states
        sizes = [_int(b.get("size")) for b in seg["blocks"] if isinstance(b, dict)]
        states = [b.get("state") for b in seg["blocks"] if isinstance(b, dict)]
        allocated = sum(s or 0 for s, st in zip(sizes, states, strict=True) if st == "active_allocated")
    if total is None or allocated is None:
        d.unread.append("a segment without a total_size / allocated_size in bytes")
        return
    d.figures["reserved_bytes"] = min(MAX_BYTES, d.figures["reserved_bytes"] + total)
    d.figures["allocated_bytes"] = min(MAX_BYTES, d.figures["allocated_bytes"] + allocated)


def _last_oom(drafts: dict[int, Draft], device: int, trace: list[Any]) -> None:
    ooms = [e for e in trace if isinstance(e, dict) and e.get("action") == "oom"]
    if not ooms or not 0 <= device <= 1023:
        return
    d = _draft(drafts, device)
    last = ooms[-1]
    if (size := _int(last.get("size"))) is not None:
        d.figures["requested_bytes"] = size
    free = _int(last.get("device_free", last.get("addr")))
    if free is not None:
        d.figures["free_bytes"] = free


def _done(d: Draft) -> Draft:
    f = d.figures
    d.excerpt = (
        f"torch.cuda.memory._snapshot() of device {d.gpu_index}: {f.get('reserved_bytes', 0):,} bytes in "
        f"segments, {f.get('allocated_bytes', 0):,} allocated"
    )
    if "reserved_bytes" in f and "allocated_bytes" in f:
        d.derive(
            "reserved_unallocated_bytes",
            f["reserved_bytes"] - f["allocated_bytes"],
            "reserved_bytes - allocated_bytes (the segments' total_size less their allocated_size)",
        )
    return d
