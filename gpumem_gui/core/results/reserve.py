"""The caching allocator's reserve: what PyTorch holds beyond the live tensors (cached free blocks, block and
segment rounding, fragmentation). A flat share of the transient peak by default; the model of the caching
allocator (:mod:`gpumem_gui.core.allocator`) fed by the replayed step where the run asks for it."""

from __future__ import annotations

from gpumem_gui.core.allocator import AllocatorReport
from gpumem_gui.core.results.estimate import Component, Explanation, InputValue

# The caching allocator keeps freed blocks reserved and rounds large blocks up to 2 MiB multiples
# (c10/cuda/CUDACachingAllocator.cpp, kLargeBuffer/kRoundLarge). ../shared/reference/README.md:
# "torch.cuda.max_memory_reserved is typically 2-15 % above max_memory_allocated from fragmentation".
# We reserve 5 % of the non-weight peak (weights are few large, long-lived blocks that do not fragment).
ALLOCATOR_FRAGMENTATION = 0.05


def flat_reserve(peak_bytes: int, weight_bytes: int) -> Component:
    """5 % of the peak's transient part."""
    transient = max(0, peak_bytes - weight_bytes)
    return Component(
        key="allocator_reserve",
        label="allocator reserve",
        bytes=round(transient * ALLOCATOR_FRAGMENTATION),
        explain=Explanation(
            formula="reserve = 5 % x (peak - weights): cached free blocks and 2 MiB rounding",
            inputs={
                "peak_bytes": peak_bytes,
                "weight_bytes": weight_bytes,
                "fraction": ALLOCATOR_FRAGMENTATION,
            },
            source="reserved is 2-15 % above allocated (shared/reference/README.md); "
            "c10/cuda/CUDACachingAllocator.cpp rounding",
        ),
    )


def allocator_component(rep: AllocatorReport) -> Component:
    """The reserve from the allocator model fed by the replay: the least memory the run goes through in (what
    the allocator cannot give back) beyond the live tensors at their peak."""
    inputs: dict[str, InputValue] = {
        "needed_peak_bytes": rep.needed_peak,
        "live_peak_bytes": rep.live_peak,
        "allocated_peak_bytes": rep.allocated_peak,
        "reserved_peak_bytes": rep.reserved_peak,
        "reserved_after_bytes": rep.reserved_end,
        "largest_free_block_bytes": rep.largest_free_block,
        "fragmentation": round(rep.fragmentation, 4),
        "segments_allocated": rep.device_allocs,
        "steps": rep.steps,
        "expandable_segments": rep.config.expandable_segments,
        "max_split_size_mb": rep.config.max_split_size_mb,
    }
    for ph in rep.phases:
        inputs[f"reserved_peak_{ph.name}_bytes"] = ph.reserved_peak
    return Component(
        key="allocator_reserve",
        label="allocator reserve (model)",
        bytes=max(0, rep.needed_peak - rep.live_peak),
        explain=Explanation(
            formula="reserve = needed - live: every allocation and free of the replayed step "
            f"(x{rep.steps}, the steady state) through PyTorch's caching allocator: sizes rounded up to "
            "512 B, small requests packed in 2 MiB segments, 1-10 MiB ones in 20 MiB, larger ones rounded to "
            "2 MiB, freed blocks cached and reused best-fit by the stream that made them (FSDP2's all-gather "
            "and reduce-scatter streams keep their own), split and merged, segments never merged; "
            "needed = the most it held that it cannot give back (reserved less its whole cached segments, "
            "which it frees before an out-of-memory error). A GPU with more room keeps the cache: "
            "reserved_peak_bytes is then what torch.cuda.max_memory_reserved shows",
            inputs=inputs,
            source="c10/cuda/CUDACachingAllocator.cpp (round_size, get_allocation_size, get_free_block, "
            "should_split, free_block, release_cached_blocks); c10/core/CachingDeviceAllocator.h",
        ),
    )


def reserve_component(peak_bytes: int, weight_bytes: int, rep: AllocatorReport | None) -> Component:
    """The model's reserve where the run has an allocator report, else the flat share."""
    return allocator_component(rep) if rep is not None else flat_reserve(peak_bytes, weight_bytes)


def allocator_facts(rep: AllocatorReport | None) -> dict[str, int | float]:
    """The allocator model's figures for the estimate's facts (JSON, CLI): reserved beside allocated."""
    if rep is None:
        return {}
    return {
        "reserved_peak_bytes": rep.reserved_peak,  # torch.cuda.max_memory_reserved on a GPU with room
        "allocator_needed_bytes": rep.needed_peak,  # the least the run goes through in
        "allocated_peak_bytes": rep.allocated_peak,  # torch.cuda.max_memory_allocated (512 B blocks)
        "reserved_after_step_bytes": rep.reserved_end,  # what stays cached (nvidia-smi after the step)
        "fragmentation": round(rep.fragmentation, 4),
    }
