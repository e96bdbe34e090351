"""A model of PyTorch's ``DeviceCachingAllocator`` (one GPU): blocks, pools, segments, the malloc and free
paths, expandable segments, and what a failed cudaMalloc does before it raises an out-of-memory error.

Written from ``c10/cuda/CUDACachingAllocator.cpp`` and ``c10/core/CachingDeviceAllocator.h`` (function names
in the docstrings are theirs). Addresses are modelled so that splitting and merging follow the real
neighbours: each cudaMalloc gets a fresh address range, an expandable segment one huge range it maps pages of.
What is not modelled: CUDA graph private pools, IPC, the free-memory callbacks registry, and timing (a block
used on another stream, ``record_stream``, returns to its pool only at :meth:`CachingAllocator.synchronize`).
"""

from __future__ import annotations

from bisect import bisect_left

from gpumem_gui.core.allocator.config import AllocatorConfig
from gpumem_gui.core.allocator.pool import SIZE_SHIFT, STREAM_SHIFT, Block, Pool, Segment, order_key
from gpumem_gui.core.allocator.rules import (
    K_MIN_BLOCK_SIZE,
    K_SMALL_SIZE,
    allocation_size,
    may_serve,
    page_size,
    round_size,
    should_split,
)

_ADDRESS_GAP = 1 << 30  # between two cudaMalloc ranges, so that no two segments are ever neighbours


class OutOfMemory(Exception):
    """The allocator could not serve a request even after releasing its cached blocks."""

    def __init__(self, size: int, reserved: int, allocated: int) -> None:
        self.size, self.reserved, self.allocated = size, reserved, allocated
        super().__init__(
            f"out of memory allocating {size} bytes ({reserved} reserved, {allocated} allocated)"
        )


class CachingAllocator:
    """One device's caching allocator. ``capacity``: bytes cudaMalloc may hand out in all (None: no limit,
    cudaMalloc never fails); ``config``: the ``PYTORCH_CUDA_ALLOC_CONF`` settings."""

    def __init__(self, config: AllocatorConfig | None = None, capacity: int | None = None) -> None:
        self.config = config or AllocatorConfig()
        self.capacity = capacity
        # setMemoryFraction: allowed_memory_maximum; only then does garbage collection run
        self.allowed = (
            int(capacity * self.config.memory_fraction)
            if capacity is not None and self.config.memory_fraction is not None
            else None
        )
        self.small, self.large = Pool(True), Pool(False)
        self._plain = not any(self.config.roundup_power2_divisions)  # round_size is then a 512 multiple
        self._gc = self.allowed is not None and self.config.garbage_collection_threshold > 0
        self._limited = self.config.max_split_size is not None  # else may_serve is always true
        self._plain_split = not self._limited and not self.config.expandable_segments
        self.reserved = 0  # total_allocated_memory: what cudaMalloc / cuMemMap handed out
        self.allocated = 0  # stats.allocated_bytes: sizes of the blocks in use
        self.requested = 0  # stats.requested_bytes: what the program asked for
        self.segments: list[Segment] = []  # expandable segments
        self.pending: list[Block] = []  # freed blocks waiting for another stream's work
        self.next_address = _ADDRESS_GAP
        self.device_allocs = self.device_frees = self.retries = 0

    # ---- the public API --------------------------------------------------------------------------------
    def malloc(self, orig: int, stream: int = 0) -> Block:
        """``malloc``: a block of at least ``orig`` bytes on ``stream``."""
        if self._plain:  # round_size without power-of-two divisions: a multiple of 512 bytes, at least 512
            size = (orig + K_MIN_BLOCK_SIZE - 1) // K_MIN_BLOCK_SIZE * K_MIN_BLOCK_SIZE or K_MIN_BLOCK_SIZE
        else:
            size = round_size(orig, self.config)
        pool = self.small if size <= K_SMALL_SIZE else self.large  # is_small
        block = self._free_block(pool, size, stream)
        if block is None:
            if self._gc:
                self._garbage_collect()
            block = (
                self._alloc_block(pool, size, stream)
                or (self._release_available(pool, size, stream) and self._alloc_block(pool, size, stream))
                or (self._release_cached() and self._alloc_block(pool, size, stream, retry=True))
            )
        if not block:
            raise OutOfMemory(allocation_size(size), self.reserved, self.allocated)
        if self._plain_split:  # should_split without expandable segments or max_split_size
            rest = block.size - size
            split = rest >= K_MIN_BLOCK_SIZE if pool.small else rest > K_SMALL_SIZE
        else:
            split = should_split(block.size, size, pool.small, self.config)
        return self._found(block, pool, size, orig, split)

    def free(self, block: Block, streams: tuple[int, ...] = ()) -> None:
        """``free``: ``block`` returns to its pool (merged with free neighbours), or waits for the other
        ``streams`` it was used on (``record_stream``) until :meth:`synchronize`."""
        block.allocated = False
        self.allocated -= block.size
        self.requested -= block.requested
        if streams:
            block.waiting = True
            self.pending.append(block)
        else:
            self._free_to_pool(block)

    def synchronize(self) -> None:
        """``synchronize_and_free_events``: blocks used on other streams return to their pools."""
        for block in self.pending:
            block.waiting = False
            self._free_to_pool(block)
        self.pending.clear()

    def empty_cache(self) -> None:
        """``emptyCache``: ``release_cached_blocks``."""
        self._release_cached()

    def largest_free(self) -> int:
        """``cache_info``: the largest cached free block."""
        return max((b.size for pool in (self.small, self.large) for b in pool.found), default=0)

    # ---- finding a block ------------------------------------------------------------------------------
    def _free_block(self, pool: Pool, size: int, stream: int) -> Block | None:
        """``get_free_block``: the smallest cached block of ``stream`` at least ``size`` (best fit; an
        expandable segment's block is judged by the size it could grow to), if the oversize rules let it."""
        if self._gc:
            pool.gc_calls += 1
        keys = pool.keys
        i = bisect_left(keys, (stream << STREAM_SHIFT) | (size << SIZE_SHIFT))
        if i == len(keys) or keys[i] >> STREAM_SHIFT != stream:
            return None
        blocks = pool.found
        if blocks[i].segment is not None:
            if self.config.expandable_segments:
                j = i + 1
                while (
                    blocks[i].segment is not None
                    and j < len(blocks)
                    and blocks[j].stream == stream
                    and blocks[j].expandable_size() < blocks[i].expandable_size()
                ):
                    i, j = j, j + 1
            else:  # expandable segments turned off: only ordinary blocks
                i += 1
                while i < len(blocks) and blocks[i].segment is not None and blocks[i].stream == stream:
                    i += 1
                if i == len(blocks) or blocks[i].stream != stream:
                    return None
        if self._limited and not may_serve(blocks[i].size, size, self.config):
            return None
        return pool.take(i)

    def _found(self, block: Block, pool: Pool, size: int, orig: int, split: bool) -> Block:
        """``alloc_found_block``: the front ``size`` bytes of ``block`` are handed out, the rest (if split)
        stays cached as a free block."""
        if split:
            rest = block
            block = Block(rest.address, size, rest.stream, pool.small, rest.segment)
            block.prev, block.next = rest.prev, rest
            if rest.prev is not None:
                rest.prev.next = block
            rest.prev = block
            rest.address += size
            rest.size -= size
            pool.insert(rest)
        block.allocated = True
        block.requested = orig
        self.allocated += block.size
        self.requested += orig
        return block

    # ---- freeing ---------------------------------------------------------------------------------------
    def _free_to_pool(self, block: Block) -> None:
        """``free_block``: merge with free neighbours (same mapping state) and cache the result."""
        pool = self.small if block.small else self.large
        prev, nxt = block.prev, block.next
        if prev is not None and not prev.allocated:
            self._merge(block, prev, pool)
        if nxt is not None and not nxt.allocated:
            self._merge(block, nxt, pool)
        pool.insert(block)

    @staticmethod
    def _merge(dst: Block, src: Block | None, pool: Pool) -> None:
        """``try_merge_blocks``: ``src`` (a free, mapped-alike neighbour of ``dst``) joins ``dst``."""
        if src is None or src.allocated or src.waiting or src.mapped != dst.mapped:
            return
        if dst.prev is src:
            dst.address = src.address
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        if src.mapped:
            pool.remove(src)
        else:
            pool.unmapped.remove(src)

    # ---- new memory ------------------------------------------------------------------------------------
    def _fits(self, nbytes: int) -> bool:
        """cudaMalloc succeeds (the allowed fraction first: ``alloc_block``'s set_fraction test)."""
        if self.allowed is not None and self.reserved + nbytes > self.allowed:
            return False
        return self.capacity is None or self.reserved + nbytes <= self.capacity

    def _alloc_block(self, pool: Pool, size: int, stream: int, retry: bool = False) -> Block | None:
        """``alloc_block``: a new segment (cudaMalloc of ``get_allocation_size``), or pages mapped into the
        stream's expandable segment."""
        self.retries += retry
        if self.config.expandable_segments:
            return self._expandable_block(pool, size, stream)
        nbytes = allocation_size(size)
        if not self._fits(nbytes):
            return None
        block = Block(self.next_address, nbytes, stream=stream, small=pool.small)
        self.next_address += nbytes + _ADDRESS_GAP
        self.reserved += nbytes
        self.device_allocs += 1
        return block

    def _release_block(self, block: Block, pool: Pool) -> None:
        """``release_block``: cudaFree of a whole free segment."""
        pool.remove(block)
        self.reserved -= block.size
        self.device_frees += 1

    def _release_available(self, pool: Pool, size: int, stream: int) -> bool:
        """``release_available_cached_blocks``: with a max_split_size, free the smallest oversize cached
        block that covers the request, else oversize blocks from the largest down until they do."""
        limit = self.config.max_split_size
        if limit is None:
            return False
        key = max(size, limit)
        pos = bisect_left(pool.keys, order_key(stream, key))
        at = pool.found[pos] if pos < len(pool.found) else None
        if at is not None and at.stream == stream and at.segment is None:
            self._release_block(at, pool)
            return True
        released = 0  # no single block: oversize blocks of this stream, from the largest down
        for block in reversed(pool.blocks[:pos]):
            if released >= key or block.size < limit or block.stream != stream:
                break
            if block.segment is None:
                released += block.size
                self._release_block(block, pool)
        return released >= key

    def _release_cached(self) -> bool:
        """``release_cached_blocks``: wait for every stream, then free every whole cached segment (unmap
        every free page of expandable segments)."""
        self.synchronize()
        for pool in (self.large, self.small):
            for block in [b for b in pool.blocks if b.segment is None and b.prev is None and b.next is None]:
                self._release_block(block, pool)
            for block in [b for b in pool.blocks if b.segment is not None]:
                self._unmap(block, pool)
        return True

    def _garbage_collect(self) -> None:
        """``garbage_collect_cached_blocks``: above garbage_collection_threshold x the allowed memory, free
        whole cached large segments not reused for at least the average number of searches, repeatedly,
        until the excess is reclaimed."""
        assert self.allowed is not None
        threshold = int(self.config.garbage_collection_threshold * self.allowed)
        if self.reserved <= threshold:
            return
        target, reclaimed = self.reserved - threshold, 0
        pool = self.large
        freeable = [b for b in pool.blocks if b.prev is None and b.next is None and b.segment is None]
        total_age = sum(pool.gc_calls - b.gc_base for b in freeable)
        while reclaimed < target and freeable:
            threshold_age = total_age / len(freeable)
            kept = []
            for block in freeable:
                age = pool.gc_calls - block.gc_base
                if age >= threshold_age:
                    reclaimed += block.size
                    total_age -= age
                    self._release_block(block, pool)
                else:
                    kept.append(block)
            if len(kept) == len(freeable):
                break
            freeable = kept

    # ---- expandable segments ---------------------------------------------------------------------------
    def _expandable_block(self, pool: Pool, size: int, stream: int) -> Block | None:
        """``try_allocate_expandable_block``: the lowest free-or-unmapped address range of ``size`` bytes in
        the stream's segments (a new segment if none has one), its unmapped part mapped page by page."""
        candidate = self._find_expandable(pool, size, stream)
        if not candidate.mapped and not self._map(candidate, min(candidate.size, size), pool):
            return None
        while candidate.size < size:
            nxt = candidate.next
            assert nxt is not None and not nxt.mapped
            if not self._map(nxt, min(size - candidate.size, nxt.size), pool):
                return None
            candidate = nxt
        pool.remove(candidate)
        return candidate

    def _find_expandable(self, pool: Pool, size: int, stream: int) -> Block:
        """``find_expandable_block``."""

        def room(b: Block | None) -> bool:
            total = 0
            while total < size and b is not None and not b.allocated and not b.waiting:
                total += b.size
                b = b.next
            return total >= size

        for c in pool.unmapped_of(stream):
            if c.prev is not None and not c.prev.allocated and not c.prev.waiting:
                c = c.prev
            if room(c):
                return c
        # a new segment reserves address space for 1 1/8 of the GPU's memory
        span = (self.capacity + self.capacity // 8) if self.capacity is not None else 1 << 46
        seg = Segment(self.next_address, page_size(pool.small), span)
        self.next_address += span + _ADDRESS_GAP
        self.segments.append(seg)
        block = Block(seg.base, seg.span, stream=stream, small=pool.small, segment=seg, mapped=False)
        pool.unmapped.add(block)
        return block

    def _map(self, block: Block, size: int, pool: Pool) -> bool:
        """``map_block``: physical pages for the first ``size`` bytes of unmapped ``block`` (whole pages:
        the mapped range may be larger), merged with its free neighbours."""
        seg = block.segment
        assert seg is not None
        mapped = seg.pages_covering(block.address, size)
        if not self._fits(mapped):
            return False
        pool.unmapped.remove(block)
        block.mapped = True
        if mapped < block.size:
            rest = Block(
                block.address + mapped,
                block.size - mapped,
                stream=block.stream,
                small=pool.small,
                segment=seg,
                mapped=False,
            )
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            pool.unmapped.add(rest)
            block.size = mapped
        self._merge(block, block.prev, pool)
        self._merge(block, block.next, pool)
        pool.insert(block)
        self.reserved += mapped
        self.device_allocs += 1
        return True

    def _unmap(self, block: Block, pool: Pool) -> None:
        """``unmap_block``: the whole pages inside free ``block`` go back to CUDA; what is left of the block
        at either end stays a free mapped block."""
        seg = block.segment
        assert seg is not None
        start, length = seg.pages_inside(block.address, block.size)
        if length == 0:
            return
        pool.remove(block)
        for address, nbytes, before in (
            (block.address, start - block.address, True),
            (start + length, block.address + block.size - start - length, False),
        ):
            if nbytes > 0:
                piece = Block(address, nbytes, stream=block.stream, small=pool.small, segment=seg)
                if before:
                    piece.prev, piece.next = block.prev, block
                    if block.prev is not None:
                        block.prev.next = piece
                    block.prev = piece
                else:
                    piece.prev, piece.next = block, block.next
                    if block.next is not None:
                        block.next.prev = piece
                    block.next = piece
                pool.insert(piece)
        block.address, block.size, block.mapped = start, length, False
        self._merge(block, block.prev, pool)
        self._merge(block, block.next, pool)
        pool.unmapped.add(block)
        self.reserved -= length
        self.device_frees += 1
