"""The allocator's data: blocks (a range of a segment, in use or cached), expandable segments, and pools of
cached blocks kept in ``BlockComparatorSize`` order (stream, size, address), as ``std::set`` keeps them in
c10/cuda/CUDACachingAllocator.cpp ``BlockPool``."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator


class Segment:
    """An expandable segment (``ExpandableSegment``): ``span`` bytes of address space from ``base``, mapped
    in pages of ``page`` bytes."""

    __slots__ = ("base", "page", "span")

    def __init__(self, base: int, page: int, span: int) -> None:
        self.base, self.page, self.span = base, page, span

    def pages_covering(self, address: int, size: int) -> int:
        """``map``: bytes of the whole pages from ``address`` (page-aligned) covering ``size`` bytes."""
        return -(-(address + size - self.base) // self.page) * self.page - (address - self.base)

    def pages_inside(self, address: int, size: int) -> tuple[int, int]:
        """``unmap``: (start, bytes) of the whole pages inside ``[address, address + size)``."""
        first = -(-(address - self.base) // self.page)
        last = (address + size - self.base) // self.page
        if first >= last:
            return address, 0
        return self.base + first * self.page, (last - first) * self.page


class Block:
    """``Block``: ``size`` bytes at ``address`` of one segment; ``prev``/``next`` are its neighbours in the
    segment (split blocks), ``waiting`` a freed block whose other streams' work is not known done."""

    __slots__ = (
        "address",
        "allocated",
        "gc_base",
        "mapped",
        "next",
        "prev",
        "requested",
        "segment",
        "size",
        "small",
        "stream",
        "waiting",
    )

    def __init__(
        self,
        address: int,
        size: int,
        stream: int,
        small: bool,
        segment: Segment | None = None,
        mapped: bool = True,
    ) -> None:
        self.address, self.size, self.stream, self.small = address, size, stream, small
        self.segment, self.mapped = segment, mapped
        self.allocated = self.waiting = False
        self.requested = 0
        self.gc_base = 0
        self.prev: Block | None = None
        self.next: Block | None = None

    @property
    def split(self) -> bool:
        return self.prev is not None or self.next is not None

    def expandable_size(self) -> int:
        """``get_free_block``'s ``expandable_size``: its size plus the unmapped range after it."""
        nxt = self.next
        return self.size + (nxt.size if nxt is not None and not nxt.mapped else 0)


# A cached block's place in its pool as one integer, ordered as ``BlockComparatorSize`` orders blocks (stream,
# then size, then address): comparing one integer is what makes the best-fit search cheap. Sizes and addresses
# stay below 2**64 (a definition: the modelled address space, caching.py, is far smaller).
STREAM_SHIFT, SIZE_SHIFT = 128, 64


def order_key(stream: int, size: int, address: int = 0) -> int:
    """The block's (stream, size, address) as one integer of the same order."""
    return (stream << STREAM_SHIFT) | (size << SIZE_SHIFT) | address


class Pool:
    """``BlockPool``: cached free blocks in (stream, size, address) order, and an expandable segment's
    unmapped ranges. ``keys`` are the blocks' :func:`order_key`, sorted, and ``found`` the blocks in the same
    order: one sorted list of integers, searched with ``bisect``."""

    __slots__ = ("found", "gc_calls", "keys", "small", "unmapped", "whole")

    def __init__(self, small: bool) -> None:
        self.small = small
        self.keys: list[int] = []
        self.found: list[Block] = []
        self.unmapped: set[Block] = set()
        self.gc_calls = 0  # get_free_blocks_call_count
        self.whole = 0  # bytes of cached blocks that are a whole ordinary segment (release_blocks frees them)

    @property
    def blocks(self) -> list[Block]:
        """The cached blocks in order (a copy)."""
        return self.found[:]

    def insert(self, block: Block) -> None:
        """``insert_into_blocks``."""
        key = (block.stream << STREAM_SHIFT) | (block.size << SIZE_SHIFT) | block.address
        i = bisect_left(self.keys, key)
        self.keys.insert(i, key)
        self.found.insert(i, block)
        block.gc_base = self.gc_calls
        if block.prev is None and block.next is None and block.segment is None:
            self.whole += block.size

    def remove(self, block: Block) -> None:
        self.take(
            bisect_left(
                self.keys, (block.stream << STREAM_SHIFT) | (block.size << SIZE_SHIFT) | block.address
            )
        )

    def take(self, i: int) -> Block:
        """The ``i``-th cached block, out of the pool."""
        del self.keys[i]
        block = self.found.pop(i)
        if block.prev is None and block.next is None and block.segment is None:
            self.whole -= block.size
        return block

    def unmapped_of(self, stream: int) -> Iterator[Block]:
        """The stream's unmapped ranges, lowest address first (``BlockComparatorAddress``)."""
        return iter(sorted((b for b in self.unmapped if b.stream == stream), key=lambda b: b.address))
