"""The caching allocator model (gpumem_gui/core/allocator) rule by rule, at the byte, against
c10/cuda/CUDACachingAllocator.cpp and c10/core/CachingDeviceAllocator.h (each test names the function)."""

from __future__ import annotations

import pytest

from gpumem_gui.core.allocator import AllocatorConfig, CachingAllocator, OutOfMemory, parse_alloc_conf
from gpumem_gui.core.allocator.rules import (
    allocation_size,
    may_serve,
    round_size,
    roundup_power2_next_division,
    should_split,
)
from gpumem_gui.core.errors import GpumemInputError

KiB, MiB = 1 << 10, 1 << 20
DEFAULT = AllocatorConfig()


# ---- round_size / roundup_power2_next_division ----------------------------------------------------------
@pytest.mark.parametrize(
    ("size", "rounded"), [(1, 512), (511, 512), (512, 512), (513, 1024), (10**6, 1000448)]
)
def test_round_size_is_a_multiple_of_512(size: int, rounded: int) -> None:
    assert round_size(size, DEFAULT) == rounded


def test_roundup_power2_next_division_source_example() -> None:
    # the comment above roundup_power2_next_division: 1200 with 4 divisions -> 1280; powers of two stay
    assert roundup_power2_next_division(1200, 4) == 1280
    assert roundup_power2_next_division(1024, 4) == 1024
    assert roundup_power2_next_division(1280, 4) == 1280


def test_round_size_with_roundup_power2_divisions() -> None:
    cfg = parse_alloc_conf("roundup_power2_divisions:4")
    # 1.2 MiB lies in [1 MiB, 2 MiB): steps of 256 KiB -> 1.25 MiB
    assert round_size(1_258_291, cfg) == 1_310_720
    # only above kMinBlockSize x divisions (2,048 bytes) does the division apply
    assert round_size(1_500, cfg) == 1_536
    # a per-interval table: 256 MiB and below 1 division (off), from 512 MiB 2 divisions
    table = parse_alloc_conf("roundup_power2_divisions:[256:1,512:2,>:4]")
    assert round_size(300 * MiB + 1, table) == 300 * MiB + 512
    assert round_size(600 * MiB, table) == 768 * MiB
    assert round_size(1100 * MiB, table) == 1280 * MiB


# ---- get_allocation_size --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("size", "segment"),
    [
        (512, 2 * MiB),  # kSmallBuffer
        (MiB, 2 * MiB),
        (MiB + 512, 20 * MiB),  # kLargeBuffer below kMinLargeAlloc
        (10 * MiB - 512, 20 * MiB),
        (10 * MiB, 10 * MiB),  # from 10 MiB: rounded to kRoundLarge (2 MiB)
        (10 * MiB + 512, 12 * MiB),
    ],
)
def test_allocation_size(size: int, segment: int) -> None:
    assert allocation_size(size) == segment


# ---- should_split ---------------------------------------------------------------------------------------
def test_should_split_small_pool_keeps_any_rest_of_512() -> None:
    assert should_split(2 * MiB, 2 * MiB - 512, True, DEFAULT)
    assert not should_split(2 * MiB, 2 * MiB - 511, True, DEFAULT)


def test_should_split_large_pool_needs_a_rest_above_1_mib() -> None:
    assert should_split(12 * MiB, 10 * MiB, False, DEFAULT)  # rest 2 MiB
    assert not should_split(12 * MiB, 11 * MiB, False, DEFAULT)  # rest exactly 1 MiB: not > kSmallSize
    cfg = AllocatorConfig(max_split_size_mb=20)
    assert not should_split(60 * MiB, 20 * MiB, False, cfg)  # a request at max_split_size is never split
    assert should_split(60 * MiB, 20 * MiB - 512, False, cfg)


def test_should_split_expandable_segments_like_the_small_pool() -> None:
    assert should_split(40 * MiB, 40 * MiB - 512, False, AllocatorConfig(expandable_segments=True))


# ---- get_free_block's max_split_size rules -----------------------------------------------------------------
def test_oversize_blocks_serve_only_large_requests_within_the_rounding_limit() -> None:
    cfg = AllocatorConfig(max_split_size_mb=64)
    assert may_serve(100 * MiB, 50 * MiB, DEFAULT)  # no limit: best fit takes anything
    assert not may_serve(100 * MiB, 50 * MiB, cfg)  # a small request never takes an oversize block
    assert may_serve(84 * MiB - 512, 64 * MiB, cfg)  # less than max_non_split_rounding (20 MiB) bigger
    assert not may_serve(84 * MiB, 64 * MiB, cfg)
    wider = parse_alloc_conf("max_split_size_mb:64,max_non_split_rounding_mb:40")
    assert may_serve(84 * MiB, 64 * MiB, wider)


# ---- malloc / free: pools, segments, best fit, splitting, merging ------------------------------------------
def test_small_requests_pack_into_2_mib_segments() -> None:
    a = CachingAllocator()
    blocks = [a.malloc(512 * KiB) for _ in range(4)]
    assert (a.reserved, a.allocated, a.device_allocs) == (2 * MiB, 2 * MiB, 1)
    a.malloc(1)
    assert a.reserved == 4 * MiB and a.allocated == 2 * MiB + 512
    del blocks


def test_mid_sized_requests_share_a_20_mib_segment() -> None:
    a = CachingAllocator()
    x, y = a.malloc(3 * MiB), a.malloc(3 * MiB)
    assert (a.reserved, a.allocated, a.device_allocs) == (20 * MiB, 6 * MiB, 1)
    a.free(x)
    a.free(y)
    assert a.largest_free() == 20 * MiB  # both merged back with the rest into the whole segment


def test_unsplit_rest_counts_as_allocated() -> None:
    a = CachingAllocator()
    a.free(a.malloc(12 * MiB))
    b = a.malloc(11 * MiB)  # rest of 1 MiB is not split off: the block stays 12 MiB
    assert b.size == 12 * MiB and a.allocated == 12 * MiB and a.reserved == 12 * MiB


def test_best_fit_takes_the_smallest_cached_block() -> None:
    a = CachingAllocator()
    x, y = a.malloc(30 * MiB), a.malloc(40 * MiB)
    where = x.address
    a.free(x)
    a.free(y)
    b = a.malloc(25 * MiB)
    assert b.address == where and a.reserved == 70 * MiB
    assert a.largest_free() == 40 * MiB


def test_segments_never_merge_so_a_larger_request_needs_a_new_one() -> None:
    a = CachingAllocator()
    x, y = a.malloc(30 * MiB), a.malloc(30 * MiB)
    a.free(x)
    a.free(y)
    a.malloc(32 * MiB)
    assert a.reserved == 92 * MiB  # 60 MiB cached in two segments, neither holds 32 MiB


def test_max_split_size_keeps_small_requests_off_oversize_blocks() -> None:
    a = CachingAllocator(AllocatorConfig(max_split_size_mb=32))
    a.free(a.malloc(40 * MiB))
    a.malloc(10 * MiB)
    assert a.reserved == 50 * MiB  # without the limit the 40 MiB block would have been split
    b = CachingAllocator()
    b.free(b.malloc(40 * MiB))
    b.malloc(10 * MiB)
    assert b.reserved == 40 * MiB


def test_blocks_do_not_cross_streams() -> None:
    a = CachingAllocator()
    a.free(a.malloc(30 * MiB, stream=0))
    a.malloc(30 * MiB, stream=1)
    assert a.reserved == 60 * MiB
    a.malloc(30 * MiB, stream=0)
    assert a.reserved == 60 * MiB


def test_record_stream_keeps_a_freed_block_until_synchronize() -> None:
    a = CachingAllocator()
    x = a.malloc(30 * MiB)
    a.free(x, streams=(1,))
    a.malloc(30 * MiB)
    assert a.reserved == 60 * MiB
    a.synchronize()
    a.malloc(30 * MiB)
    assert a.reserved == 60 * MiB


# ---- a failed cudaMalloc ----------------------------------------------------------------------------------
def test_failed_cudamalloc_releases_the_whole_cached_segments_and_retries() -> None:
    a = CachingAllocator(capacity=50 * MiB)
    u, v = a.malloc(20 * MiB), a.malloc(20 * MiB)
    a.free(u)
    a.free(v)
    a.malloc(44 * MiB)
    assert (a.reserved, a.retries, a.device_frees) == (44 * MiB, 1, 2)


def test_split_segments_are_not_released_and_the_request_fails() -> None:
    a = CachingAllocator(capacity=40 * MiB)
    keep = a.malloc(3 * MiB)  # a 20 MiB segment, split: it can never be released while keep lives
    a.free(a.malloc(20 * MiB))
    with pytest.raises(OutOfMemory):
        a.malloc(22 * MiB)
    assert a.reserved == 20 * MiB  # the whole 20 MiB segment was released on the way
    del keep


def test_release_available_cached_blocks_frees_just_enough_oversize_blocks() -> None:
    a = CachingAllocator(AllocatorConfig(max_split_size_mb=20), capacity=100 * MiB)
    blocks = [a.malloc(30 * MiB) for _ in range(3)]
    for b in blocks:
        a.free(b)
    a.malloc(40 * MiB)  # 90 + 40 > 100; no single 40 MiB block: the largest oversize ones until 40 MiB
    assert (a.retries, a.device_frees, a.reserved) == (0, 2, 70 * MiB)


def test_garbage_collection_frees_old_whole_segments_only_with_a_memory_fraction() -> None:
    for fraction, reserved, largest in ((None, 120 * MiB, 40 * MiB), (0.5, 80 * MiB, 30 * MiB)):
        cfg = AllocatorConfig(garbage_collection_threshold=0.5, memory_fraction=fraction)
        a = CachingAllocator(cfg, capacity=200 * MiB)
        p, q = a.malloc(30 * MiB), a.malloc(40 * MiB)
        a.free(q)
        a.free(p)
        for _ in range(5):  # searches served by p's segment: it stays young, q's ages
            a.free(a.malloc(30 * MiB))
        # no cached block fits 50 MiB; with a fraction, 70 MiB > 50 % of the allowed 100 MiB: the blocks at
        # least as old as the average (q) are freed first
        a.malloc(50 * MiB)
        assert (a.reserved, a.largest_free()) == (reserved, largest), fraction


# ---- expandable segments ----------------------------------------------------------------------------------
def test_expandable_segment_maps_20_mib_pages_and_grows_in_place() -> None:
    a = CachingAllocator(AllocatorConfig(expandable_segments=True))
    x = a.malloc(30 * MiB)
    assert a.reserved == 40 * MiB  # two 20 MiB pages
    y = a.malloc(30 * MiB)  # the free 10 MiB + one more page
    assert (a.reserved, a.allocated) == (60 * MiB, 60 * MiB)
    a.free(x)
    a.free(y)
    a.malloc(32 * MiB)  # one segment: the freed 60 MiB are one block
    assert a.reserved == 60 * MiB and a.largest_free() == 28 * MiB


def test_expandable_small_pool_maps_2_mib_pages() -> None:
    a = CachingAllocator(AllocatorConfig(expandable_segments=True))
    a.malloc(100 * KiB)
    assert a.reserved == 2 * MiB


def test_expandable_release_unmaps_free_pages() -> None:
    a = CachingAllocator(AllocatorConfig(expandable_segments=True))
    x = a.malloc(30 * MiB)
    a.malloc(10 * MiB)  # the rest of the second page
    a.free(x)
    a.empty_cache()
    assert a.reserved == 40 * MiB - 20 * MiB  # the first page is whole and free; the second is in use


# ---- PYTORCH_CUDA_ALLOC_CONF ------------------------------------------------------------------------------
def test_parse_alloc_conf() -> None:
    cfg = parse_alloc_conf("expandable_segments:True, max_split_size_mb:512,garbage_collection_threshold:0.6")
    assert cfg.expandable_segments and cfg.max_split_size_mb == 512
    assert cfg.garbage_collection_threshold == 0.6
    assert parse_alloc_conf("") == DEFAULT
    assert parse_alloc_conf("pinned_use_cuda_host_register:True") == DEFAULT


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("max_split_size_mb:5", "greater than or equal to 20"),
        ("foo:1", "unknown key 'foo'"),
        ("expandable_segments:yes", "True or False"),
        ("garbage_collection_threshold:1.5", "less than 1"),
        ("roundup_power2_divisions:3", "powers of two"),
        ("max_split_size_mb", "expected key:value"),
    ],
)
def test_parse_alloc_conf_rejects_bad_input_in_one_line(text: str, says: str) -> None:
    with pytest.raises(GpumemInputError) as err:
        parse_alloc_conf(text)
    assert says in str(err.value) and "\n" not in str(err.value) and "alloc_conf" in str(err.value)
