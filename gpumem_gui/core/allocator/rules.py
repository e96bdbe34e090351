"""The size rules of PyTorch's CUDA caching allocator, each a pure function of sizes and the configuration.

Written from ``c10/cuda/CUDACachingAllocator.cpp`` (``DeviceCachingAllocator``) and, where PyTorch 2.9+ moved
the device-independent part, ``c10/core/CachingDeviceAllocator.h``; the constants are theirs.
"""

from __future__ import annotations

from gpumem_gui.core.allocator.config import AllocatorConfig

# c10/cuda/CUDACachingAllocator.cpp, the constants at the top of the file
K_MIN_BLOCK_SIZE = 512  # all sizes are rounded to at least 512 bytes
K_SMALL_SIZE = 1 << 20  # largest "small" allocation is 1 MiB
K_SMALL_BUFFER = 2 << 20  # "small" allocations are packed in 2 MiB blocks
K_MIN_LARGE_ALLOC = 10 << 20  # allocations between 1 and 10 MiB may use kLargeBuffer
K_LARGE_BUFFER = 20 << 20  # "large" allocations may be packed in 20 MiB blocks
K_ROUND_LARGE = 2 << 20  # round up large allocations to 2 MiB


def roundup_power2_next_division(size: int, divisions: int) -> int:
    """``roundup_power2_next_division``: ``size`` up to the next of ``divisions`` equal steps between the
    powers of two around it (1200 with 4 divisions: steps 1024, 1280, 1536, 1792 -> 1280)."""
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)  # power2_floor >> log2(divisions)
    if step == 0:
        return floor << 1
    rounded = size & ~(step - 1)
    return size if rounded == size else rounded + step


def round_size(size: int, config: AllocatorConfig) -> int:
    """``round_size``: what a request of ``size`` bytes occupies (at least 512 bytes, a multiple of 512, or
    the next power-of-two division where ``roundup_power2_divisions`` asks for one)."""
    if size < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    divisions = config.divisions(size)
    if divisions > 1 and size > K_MIN_BLOCK_SIZE * divisions:
        return roundup_power2_next_division(size, divisions)
    return K_MIN_BLOCK_SIZE * -(-size // K_MIN_BLOCK_SIZE)


def is_small(size: int) -> bool:
    """``get_pool``: a rounded size of at most 1 MiB comes from the small pool."""
    return size <= K_SMALL_SIZE


def allocation_size(size: int) -> int:
    """``get_allocation_size``: the segment cudaMalloc'd for a rounded request no cached block serves."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return K_ROUND_LARGE * -(-size // K_ROUND_LARGE)


def should_split(block_size: int, size: int, small: bool, config: AllocatorConfig) -> bool:
    """``should_split``: whether the rest of a ``block_size`` block serving ``size`` becomes a free block of
    its own (small pool or expandable segments: any rest of 512 bytes or more; large pool: a request below
    max_split_size and a rest of more than 1 MiB)."""
    remaining = block_size - size
    if small or config.expandable_segments:
        return remaining >= K_MIN_BLOCK_SIZE
    limit = config.max_split_size
    return (limit is None or size < limit) and remaining > K_SMALL_SIZE


def may_serve(block_size: int, size: int, config: AllocatorConfig) -> bool:
    """``get_free_block``'s oversize rules for the best-fitting cached block: a request below max_split_size
    never takes an oversize block (>= max_split_size); a larger one takes it only if the block is less than
    max_non_split_rounding_mb (default kLargeBuffer, 20 MiB) bigger."""
    limit = config.max_split_size
    if limit is None:
        return True
    if size < limit:
        return block_size < limit
    return block_size < size + config.max_non_split_rounding_mb * (1 << 20)


def page_size(small: bool) -> int:
    """An expandable segment maps physical memory in pages of 2 MiB (small pool) or 20 MiB (large pool):
    ``find_expandable_block``, ``segment_size = pool->is_small ? kSmallBuffer : kLargeBuffer``."""
    return K_SMALL_BUFFER if small else K_LARGE_BUFFER
