"""Memory a GPU holds beyond live tensors: CUDA context, cuBLAS workspaces and NCCL buffers (modelled in
:mod:`.nontorch`), the caching allocator's reserve.

These are what separate ``torch.cuda.max_memory_allocated()`` (our ``peak_bytes``) from what nvidia-smi
shows (our ``total_bytes``). They depend on the driver, the GPU and the runtime version, so each is a
documented default that the user can override; the validation report compares them with measurements.
"""

from __future__ import annotations

from functools import lru_cache

from gpumem_gui.core.results.estimate import Component, Explanation, GpuShare, Phase
from gpumem_gui.core.results.nontorch import NonTorch, nontorch_components

# The caching allocator keeps freed blocks reserved and rounds large blocks up to 2 MiB multiples
# (c10/cuda/CUDACachingAllocator.cpp, kLargeBuffer/kRoundLarge). ../shared/reference/README.md:
# "torch.cuda.max_memory_reserved is typically 2-15 % above max_memory_allocated from fragmentation".
# We reserve 5 % of the non-weight peak (weights are few large, long-lived blocks that do not fragment).
ALLOCATOR_FRAGMENTATION = 0.05


def overhead_components(peak_bytes: int, weight_bytes: int, nontorch: NonTorch) -> tuple[Component, ...]:
    """The non-tensor memory of one GPU process for a run whose live-tensor peak is ``peak_bytes``: the
    CUDA context, cuBLAS workspaces and NCCL buffers of ``nontorch`` (:mod:`.nontorch`) and the allocator's
    reserve."""
    transient = max(0, peak_bytes - weight_bytes)
    reserve = round(transient * ALLOCATOR_FRAGMENTATION)
    return (
        *_fixed_components(nontorch),
        Component(
            key="allocator_reserve",
            label="allocator reserve",
            bytes=reserve,
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
        ),
    )


@lru_cache(maxsize=64)
def _fixed_components(nontorch: NonTorch) -> tuple[Component, ...]:
    """They depend on nothing but ``nontorch``, so estimates with the same one share one (immutable) tuple."""
    return nontorch_components(nontorch)


def stage_share(
    stage: int, tp: int, peak_phase: Phase, weight_bytes: int, nontorch: NonTorch, replicas: str = ""
) -> GpuShare:
    """The share of TP rank 0 of pipeline stage ``stage``: its peak phase plus the process overheads
    (:func:`overhead_components`, ``weight_bytes`` being what does not fragment the allocator, ``nontorch``
    what the stage's process holds beside torch); ``replicas`` is appended to the role (e.g. the
    data-parallel copies that hold the same)."""
    over = overhead_components(peak_phase.peak_bytes, weight_bytes, nontorch)
    role = f"PP stage {stage}" + (f", TP rank 0 of {tp}" if tp > 1 else "") + replicas
    return GpuShare(
        index=stage * tp,
        role=role,
        peak_bytes=peak_phase.peak_bytes,
        total_bytes=peak_phase.peak_bytes + sum(c.bytes for c in over),
        components=(*peak_phase.components, *over),
    )
