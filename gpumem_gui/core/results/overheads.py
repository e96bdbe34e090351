"""Memory a GPU holds beyond live tensors: CUDA context, library workspaces, the caching allocator's reserve.

These are what separate ``torch.cuda.max_memory_allocated()`` (our ``peak_bytes``) from what nvidia-smi
shows (our ``total_bytes``). They depend on the driver, the GPU and the runtime version, so each is a
documented default that the user can override; the validation report compares them with measurements.
"""

from __future__ import annotations

from functools import lru_cache

from gpumem_gui.core.results.estimate import Component, Explanation, GpuShare, Phase
from gpumem_gui.core.units import MiB

# CUDA context of one process with PyTorch and lazy module loading (CUDA >= 11.7, PyTorch >= 1.13 default
# CUDA_MODULE_LOADING=LAZY). Published observations range from ~300 MiB to ~2 GiB (vram.asmirnov.xyz notes
# "PyTorch ... allocates between 300 MiB and 2 GiB"; ../shared/reference/README.md: "~0.3-1 GiB per process").
# 500 MiB is the middle of the lazy-loading range; calibrate with validation/gpu_check.py on a real GPU.
CUDA_CONTEXT_BYTES = 500 * MiB

# cuBLAS workspace PyTorch reserves per handle: CUBLAS_WORKSPACE_CONFIG default ":4096:8" on Hopper and later
# (8 chunks of 4096 KiB = 32 MiB), ":4096:2:16:8" before (8.125 MiB); aten/src/ATen/cuda/CublasHandlePool.cpp,
# getChosenWorkspaceSize(). cuBLASLt shares the same size (CUBLASLT_WORKSPACE_SIZE defaults to it).
CUBLAS_WORKSPACE_BYTES = 32 * MiB

# The caching allocator keeps freed blocks reserved and rounds large blocks up to 2 MiB multiples
# (c10/cuda/CUDACachingAllocator.cpp, kLargeBuffer/kRoundLarge). ../shared/reference/README.md:
# "torch.cuda.max_memory_reserved is typically 2-15 % above max_memory_allocated from fragmentation".
# We reserve 5 % of the non-weight peak (weights are few large, long-lived blocks that do not fragment).
ALLOCATOR_FRAGMENTATION = 0.05


def overhead_components(
    peak_bytes: int,
    weight_bytes: int,
    *,
    context_bytes: int = CUDA_CONTEXT_BYTES,
    workspace_bytes: int = CUBLAS_WORKSPACE_BYTES,
) -> tuple[Component, ...]:
    """The non-tensor memory of one GPU process for a run whose live-tensor peak is ``peak_bytes``."""
    transient = max(0, peak_bytes - weight_bytes)
    reserve = round(transient * ALLOCATOR_FRAGMENTATION)
    return (
        *_fixed_components(context_bytes, workspace_bytes),
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
def _fixed_components(context_bytes: int, workspace_bytes: int) -> tuple[Component, Component]:
    """The CUDA context and the cuBLAS workspace: they depend on nothing but their sizes, so every estimate
    shares one (immutable) pair."""
    return (
        Component(
            key="cuda_context",
            label="CUDA context",
            bytes=context_bytes,
            explain=Explanation(
                formula="fixed per process: driver context, loaded kernels (lazy loading)",
                inputs={"context_bytes": context_bytes},
                source="300 MiB-2 GiB observed (vram.asmirnov.xyz); ~0.3-1 GiB (shared/reference/README.md); "
                "default 500 MiB, override with --cuda-context-mib",
            ),
        ),
        Component(
            key="workspace",
            label="cuBLAS workspace",
            bytes=workspace_bytes,
            explain=Explanation(
                formula="CUBLAS_WORKSPACE_CONFIG :4096:8 = 8 x 4096 KiB per handle",
                inputs={"workspace_bytes": workspace_bytes},
                source="PyTorch aten/src/ATen/cuda/CublasHandlePool.cpp getChosenWorkspaceSize()",
            ),
        ),
    )


def stage_share(
    stage: int, tp: int, peak_phase: Phase, weight_bytes: int, context_mib: int, replicas: str = ""
) -> GpuShare:
    """The share of TP rank 0 of pipeline stage ``stage``: its peak phase plus the process overheads
    (:func:`overhead_components`, ``weight_bytes`` being what does not fragment the allocator); ``replicas``
    is appended to the role (e.g. the data-parallel copies that hold the same)."""
    over = overhead_components(peak_phase.peak_bytes, weight_bytes, context_bytes=context_mib << 20)
    role = f"PP stage {stage}" + (f", TP rank 0 of {tp}" if tp > 1 else "") + replicas
    return GpuShare(
        index=stage * tp,
        role=role,
        peak_bytes=peak_phase.peak_bytes,
        total_bytes=peak_phase.peak_bytes + sum(c.bytes for c in over),
        components=(*peak_phase.components, *over),
    )
