"""What a GPU would report for an estimate: ``torch.cuda.max_memory_reserved`` and nvidia-smi's used memory.

* **reserved**: with the caching allocator model on (run field ``allocator_model``), its reserved peak over
  the phases (``Phase.reserved_bytes``) plus what else the allocator holds beside the tensors of the peak
  (the cuBLAS workspaces, which ``setWorkspaceForHandle`` takes from the caching allocator:
  aten/src/ATen/cuda/CublasHandlePool.cpp); with it off, ``total_bytes`` less what lies outside the
  allocator (= peak + workspaces + the flat allocator reserve).
* **nvidia-smi**: reserved plus the CUDA context and NCCL's buffers, which the driver counts for the process
  but the caching allocator never sees (:func:`~gpumem_gui.core.results.nontorch.outside_allocator_bytes`).

The validation reports compare every published reserved / nvidia-smi figure with these, and only these.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from gpumem_gui.core.results.estimate import Estimate, Explanation
from gpumem_gui.core.results.nontorch import outside_allocator_bytes
from gpumem_gui.core.results.reserve import ALLOCATOR_FRAGMENTATION
from gpumem_gui.core.spec.model import Frozen

NonNeg = Annotated[int, Field(ge=0)]


def reserved_prediction(est: Estimate) -> int:
    """Our ``torch.cuda.max_memory_reserved`` on the most-loaded GPU of ``est`` (the module docstring)."""
    outside = outside_allocator_bytes(est.components)
    levels = [ph.reserved_bytes for ph in est.phases.values() if ph.reserved_bytes is not None]
    if not levels:
        return est.total_bytes - outside
    reserve = sum(c.bytes for c in est.components if c.key == "allocator_reserve")
    # total = peak + workspaces + reserve + outside: the workspaces are what is left of it
    return max(levels) + est.total_bytes - outside - est.peak_bytes - reserve


def nvidia_smi_prediction(est: Estimate) -> int:
    """Our nvidia-smi used memory of the process on the most-loaded GPU: reserved + context + NCCL buffers."""
    return reserved_prediction(est) + outside_allocator_bytes(est.components)


class Reported(Frozen):
    """What a GPU with room would report for an estimate's most-loaded GPU, each figure on the statistic a
    user reads: ``torch.cuda.max_memory_allocated``, ``torch.cuda.max_memory_reserved`` and nvidia-smi's
    used memory of the process. ``total_bytes`` of the estimate is the least memory the run goes through in
    (the fit's figure); with the allocator model on it can be below the reserved peak a roomier GPU shows:
    the caching allocator releases its whole cached segments before an out-of-memory error
    (``release_cached_blocks`` in c10/cuda/CUDACachingAllocator.cpp)."""

    allocated_bytes: NonNeg = Field(description="torch.cuda.max_memory_allocated: the peak of live tensors")
    reserved_bytes: NonNeg = Field(description="torch.cuda.max_memory_reserved (module docstring)")
    nvidia_smi_bytes: NonNeg = Field(description="nvidia-smi used memory of the process (module docstring)")
    basis: Literal["allocator model", "flat reserve"]
    explain: Explanation


def reported(est: Estimate) -> Reported:
    """:class:`Reported` of ``est``: the two predictions above, their basis and their formula."""
    modelled = any(ph.reserved_bytes is not None for ph in est.phases.values())
    reserved, outside = reserved_prediction(est), outside_allocator_bytes(est.components)
    basis = "allocator model" if modelled else "flat reserve"
    cached = (
        "the caching allocator model's reserved peak over the phases (its segments, blocks rounded and "
        "cached) + the cuBLAS workspaces"
        if modelled
        else "peak + cuBLAS workspaces + the flat allocator reserve "
        f"({ALLOCATOR_FRAGMENTATION:.0%} of the peak above the weights; the allocator model, "
        "--allocator-model, replays the caching allocator instead)"
    )
    return Reported(
        allocated_bytes=est.peak_bytes,
        reserved_bytes=reserved,
        nvidia_smi_bytes=reserved + outside,
        basis=basis,
        explain=Explanation(
            formula=f"allocated = peak of live tensors; reserved = {cached}; nvidia-smi = reserved + CUDA "
            "context + NCCL buffers (the driver counts them for the process; the caching allocator never "
            "sees them)",
            inputs={
                "peak_bytes": est.peak_bytes,
                "reserved_bytes": reserved,
                "outside_allocator_bytes": outside,
            },
            source="c10/cuda/CUDACachingAllocator.cpp (what max_memory_reserved counts); "
            "aten/src/ATen/cuda/CublasHandlePool.cpp (workspaces from the caching allocator)",
        ),
    )
