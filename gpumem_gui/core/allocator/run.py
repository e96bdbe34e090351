"""Run a replay's event stream through the allocator model and report what it reserved.

A training step is run ``steps`` times (from its first phase on; what the setup allocated stays): PyTorch's
allocator reaches its steady state, with the blocks cached by one step reused (or not, when fragmented) by the
next, after the first step, and ``max_memory_reserved`` is taken over the whole run. Storages a step leaves
alive (states created by the first optimizer step) are allocated once. Each allocation is made on the stream
in force (:data:`~.events.STREAM` events; the default stream where there are none).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from gpumem_gui.core.allocator.caching import CachingAllocator, OutOfMemory
from gpumem_gui.core.allocator.config import AllocatorConfig
from gpumem_gui.core.allocator.events import (
    ALLOC,
    DEFAULT_STREAM,
    FREE,
    GROW,
    PHASE,
    STREAM,
    Event,
    normalize,
)
from gpumem_gui.core.allocator.pool import Block
from gpumem_gui.core.spec.base import Frozen

NonNeg = Annotated[int, Field(ge=0)]


class PhaseReserve(Frozen):
    """One phase's peaks: reserved (segments), allocated (blocks in use, rounded) and live (bytes asked)."""

    name: str
    reserved_peak: NonNeg
    allocated_peak: NonNeg
    live_peak: NonNeg


class AllocatorReport(Frozen):
    """What the caching allocator held over a replayed run: the peaks are the step's (every phase but the
    setup before the first, which ``phases`` lists too; its cache stays reserved through the step)."""

    config: AllocatorConfig
    steps: Annotated[int, Field(ge=1)]
    reserved_peak: NonNeg = Field(description="max_memory_reserved: segments cudaMalloc'd (or pages mapped)")
    allocated_peak: NonNeg = Field(description="max_memory_allocated: blocks in use, sizes rounded")
    needed_peak: NonNeg = Field(
        description="the least memory the run goes through in: reserved less the whole cached segments the "
        "allocator releases when a cudaMalloc fails (release_cached_blocks); the reserved peak is what a GPU "
        "with more room shows"
    )
    live_peak: NonNeg = Field(description="the bytes the program asked for, at their most")
    reserved_end: NonNeg = Field(description="memory_reserved after the run: what nvidia-smi keeps showing")
    allocated_end: NonNeg
    largest_free_block: NonNeg = Field(description="the largest cached free block after the run")
    fragmentation: Annotated[float, Field(ge=0.0, le=1.0)] = Field(
        description="1 - allocated peak / reserved peak: the share of the reserved peak never in use at once"
    )
    device_allocs: NonNeg = Field(description="cudaMalloc calls (or page mappings)")
    retries: NonNeg = Field(description="allocations that freed every cached block and tried again")
    oom: bool = Field(False, description="a request failed even after releasing the cache")
    phases: tuple[PhaseReserve, ...] = ()

    def phase(self, name: str) -> PhaseReserve | None:
        return next((p for p in self.phases if p.name == name), None)


class _Driver:
    """Applies events to one allocator, following each storage's blocks and the peaks by phase."""

    def __init__(self, alloc: CachingAllocator) -> None:
        self.alloc = alloc
        self.pieces: dict[int, list[Block]] = {}
        self.live = 0
        self.stream = DEFAULT_STREAM  # the stream allocations are made on (STREAM events set it)
        # the current phase's peaks: reserved, allocated, live, and pinned (reserved less the whole cached
        # segments release_cached_blocks would free: what the allocator cannot give back)
        self.phase = [0, 0, 0, 0]
        self.phases: dict[str, list[int]] = {"setup": self.phase}

    def run(self, events: list[Event], offset: int = 0) -> None:
        """Apply ``events``, each storage's key moved by ``offset`` (a repeated step's storages are new ones);
        peaks can only rise on an allocation or a growth, so only those are noted (the hot loop: :meth:`_note`
        written out for allocations)."""
        a = self.alloc
        pieces, malloc, free, pools = self.pieces, a.malloc, a.free, (a.small, a.large)
        peak = self.phase
        live, stream = self.live, self.stream
        try:
            for op, key, nbytes in events:
                if op == ALLOC:
                    pieces[key + offset] = [malloc(nbytes, stream)] if nbytes > 0 else []  # type: ignore[operator]
                    live += nbytes
                    if a.reserved > peak[0]:
                        peak[0] = a.reserved
                    if a.allocated > peak[1]:
                        peak[1] = a.allocated
                    if live > peak[2]:
                        peak[2] = live
                    pinned = a.reserved - pools[0].whole - pools[1].whole
                    if pinned > peak[3]:
                        peak[3] = pinned
                elif op == FREE:
                    for block in pieces.pop(key + offset, ()):  # type: ignore[operator]
                        live -= block.requested
                        free(block)
                elif op == GROW:
                    self.live = live
                    self._grow(key + offset, nbytes)  # type: ignore[operator]
                    live = self.live
                    self._note(peak)
                elif op == STREAM:
                    stream = self.stream = key  # type: ignore[assignment]
                else:
                    peak = self.phase = self.phases.setdefault(str(key), [0, 0, 0, 0])
                    self.live = live
                    self._note(peak)
        finally:
            self.live = live

    def _note(self, peak: list[int]) -> None:
        a = self.alloc
        if a.reserved > peak[0]:
            peak[0] = a.reserved
        if a.allocated > peak[1]:
            peak[1] = a.allocated
        if self.live > peak[2]:
            peak[2] = self.live
        pinned = a.reserved - a.small.whole - a.large.whole
        if pinned > peak[3]:
            peak[3] = pinned

    def step_peaks(self) -> list[int]:
        """The peaks over the step's phases (the setup before the first phase left out, as in the
        estimate's phases), or the setup's when there is no phase."""
        step = [p for name, p in self.phases.items() if name != "setup"] or [self.phases["setup"]]
        return [max(p[i] for p in step) for i in range(4)]

    def _grow(self, handle: int, delta: int) -> None:
        """A storage resized by ``delta``: growth is a new block beside the old ones (an all-gather's
        output); a shrink frees the newest blocks when they make up ``-delta`` exactly, else the storage is
        reallocated at its new size (the new block before the old ones are freed, as a copy would). New
        blocks are made on the stream in force, as any allocation."""
        pieces = self.pieces.setdefault(handle, [])
        if delta > 0:
            pieces.append(self.alloc.malloc(delta, self.stream))
            self.live += delta
            return
        if delta == 0:
            return
        total, cut = 0, len(pieces)
        while cut > 0 and total < -delta:
            cut -= 1
            total += pieces[cut].requested
        old = pieces[cut:] if total == -delta else pieces[:]
        remaining = sum(b.requested for b in pieces) + delta
        keep = pieces[:cut] if total == -delta else []
        if total != -delta and remaining > 0:
            keep = [self.alloc.malloc(remaining, self.stream)]
            self._note(self.phase)  # the copy and the old storage exist together
        for block in old:
            self.alloc.free(block)
        self.live += delta
        self.pieces[handle] = keep


def run_events(
    events: list[Event] | tuple[Event, ...],
    config: AllocatorConfig | None = None,
    *,
    steps: int = 2,
    capacity: int | None = None,
) -> AllocatorReport:
    """Feed ``events`` (see :mod:`.events`) to a fresh allocator: the events up to the first phase once, the
    rest ``steps`` times (later times without the allocations the first left alive and the frees of what
    came before it). ``capacity``: the memory cudaMalloc may hand out (None: as much as asked).

    The setup (the events before the first phase) is taken as loaded (:func:`_as_loaded`). Without a
    capacity, ``needed_peak`` is checked on a GPU of just the first step's pinned peak: a cache
    that grew on a roomy GPU in the second step (a cached segment split by smaller requests) would have
    been released there first; when that run goes through, its own pinned peak is the answer, else the
    roomy run's."""
    cfg = config or AllocatorConfig()
    evs = normalize(events)
    start = next((i for i, e in enumerate(evs) if e[0] == PHASE), len(evs))
    body = evs[start:]
    evs = _as_loaded(evs[:start]) + body
    born = {e[1] for e in body if e[0] == ALLOC}
    freed = {e[1] for e in body if e[0] == FREE}
    again = [e for e in body if e[0] in _MARKS or (e[1] in born and (e[0] != ALLOC or e[1] in freed))]
    if any(e[0] == STREAM for e in evs):  # a repeated step starts on the stream the first one started on
        again.insert(0, (STREAM, _stream_at_end(evs[: len(evs) - len(body)]), 0))
    # fresh handles for each repeated step's storages: step s moves its keys by s x (1 + the largest key),
    # past every key of the steps before it
    span = 1 + max((e[1] for e in evs if e[0] == ALLOC), default=0)  # type: ignore[type-var]
    repeats = [(again, step * span) for step in range(1, steps)]
    drv, oom, first = _drive(cfg, capacity, evs, repeats)
    rep = _report(drv, cfg, steps, oom)
    if capacity is None and steps > 1 and first < rep.needed_peak:
        tight, tight_oom, _ = _drive(cfg, first, evs, repeats)
        if not tight_oom:
            rep = rep.model_copy(update={"needed_peak": max(tight.step_peaks()[3], rep.allocated_peak)})
    return rep


_MARKS = (PHASE, STREAM)  # events that name no storage


def _stream_at_end(events: list[Event]) -> object:
    """The stream in force after ``events``."""
    return next((e[1] for e in reversed(events) if e[0] == STREAM), DEFAULT_STREAM)


def _as_loaded(setup: list[Event]) -> list[Event]:
    """The setup as loaded: one allocation per storage alive at its end, at its final size, in the order
    they were made, each on the stream it was made on (and the stream in force at the end kept). How the
    replay builds the model (whole parameters, then sharded) is no loading history; the allocator sees the
    model and the states as they stand when the step begins."""
    sizes: dict[object, int] = {}
    made_on: dict[object, object] = {}
    stream: object = DEFAULT_STREAM
    for op, key, nbytes in setup:
        if op == ALLOC:
            sizes[key] = nbytes
            made_on[key] = stream
        elif op == GROW:
            sizes[key] += nbytes
        elif op == FREE:
            sizes.pop(key, None)
        elif op == STREAM:
            stream = key
    out: list[Event] = []
    on: object = DEFAULT_STREAM
    for key, n in sizes.items():
        if made_on[key] != on:
            on = made_on[key]
            out.append((STREAM, on, 0))
        out.append((ALLOC, key, n))
    if stream != on:
        out.append((STREAM, stream, 0))
    return out


def _drive(
    cfg: AllocatorConfig, capacity: int | None, evs: list[Event], repeats: list[tuple[list[Event], int]]
) -> tuple[_Driver, bool, int]:
    """One allocator through the first step and its repeats: (the driver, out of memory, the pinned peak
    after the first step)."""
    drv = _Driver(CachingAllocator(cfg, capacity))
    first = 0
    try:
        drv.run(evs)
        first = drv.step_peaks()[3]
        for again, offset in repeats:
            drv.run(again, offset)
    except OutOfMemory:
        return drv, True, first
    return drv, False, first


def _report(drv: _Driver, cfg: AllocatorConfig, steps: int, oom: bool) -> AllocatorReport:
    a = drv.alloc
    reserved, allocated, live, pinned = drv.step_peaks()
    return AllocatorReport(
        config=cfg,
        steps=steps,
        reserved_peak=reserved,
        allocated_peak=allocated,
        needed_peak=max(pinned, allocated),
        live_peak=live,
        reserved_end=a.reserved,
        allocated_end=a.allocated,
        largest_free_block=a.largest_free(),
        fragmentation=1 - allocated / reserved if reserved else 0.0,
        device_allocs=a.device_allocs,
        retries=a.retries,
        oom=oom,
        phases=tuple(
            PhaseReserve(name=n, reserved_peak=p[0], allocated_peak=p[1], live_peak=p[2])
            for n, p in drv.phases.items()
        ),
    )
