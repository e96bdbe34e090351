"""The event stream the replay feeds the allocator: allocations and frees of storages in program order.

An event is ``(op, key, nbytes)``: :data:`ALLOC` a storage ``key`` of ``nbytes``, :data:`FREE` it,
:data:`GROW` it by ``nbytes`` (negative: shrink; the replay resizes a storage that stands for a gathered or
resharded parameter), :data:`PHASE` a phase starts (``key`` its name), :data:`STREAM` the allocations from
here on are made on stream ``key`` (torch's current stream, as ``with torch.cuda.stream(s)`` sets it; a
stream starts on :data:`DEFAULT_STREAM`, and a stream without such an event is all on it). A block keeps the
stream it was allocated on: freed, it is cached for that stream's allocations only
(c10/cuda/CUDACachingAllocator.cpp ``get_free_block``: the pool's blocks are ordered by stream first and a
block of another stream never serves). Keys identify a storage while it lives (the replay uses ``id()``,
which Python reuses after a free); :func:`normalize` makes every allocation's key unique.
"""

from __future__ import annotations

ALLOC, FREE, GROW, PHASE, STREAM = 1, -1, 2, 0, 3
DEFAULT_STREAM = 0  # the stream every event stream starts on (the device's default stream)
Event = tuple[int, object, int]


def normalize(events: list[Event] | tuple[Event, ...]) -> list[Event]:
    """The events with each allocation's key replaced by its ordinal (frees and growths follow it); events
    on storages allocated before the log started are dropped."""
    live: dict[object, int] = {}
    out: list[Event] = []
    add = out.append
    count = 0
    for op, key, nbytes in events:
        if op == ALLOC:
            live[key] = count
            add((ALLOC, count, nbytes))
            count += 1
        elif op in (PHASE, STREAM):
            add((op, key, 0))
        else:
            handle = live.pop(key, None) if op == FREE else live.get(key)
            if handle is not None:
                add((op, handle, nbytes))
    return out
