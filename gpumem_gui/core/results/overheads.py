"""Memory a GPU holds beyond live tensors: CUDA context, cuBLAS workspaces and NCCL buffers (modelled in
:mod:`.nontorch`), the caching allocator's reserve (:mod:`.reserve`).

These are what separate ``torch.cuda.max_memory_allocated()`` (our ``peak_bytes``) from what nvidia-smi
shows (our ``total_bytes``). They depend on the driver, the GPU and the runtime version, so each is a
documented default that the user can override; the validation report compares them with measurements.
"""

from __future__ import annotations

from functools import lru_cache

from gpumem_gui.core.allocator import AllocatorReport
from gpumem_gui.core.results.estimate import Component, GpuShare, Phase
from gpumem_gui.core.results.nontorch import NonTorch, nontorch_components
from gpumem_gui.core.results.reserve import reserve_component


def overhead_components(
    peak_bytes: int, weight_bytes: int, nontorch: NonTorch, allocator: AllocatorReport | None = None
) -> tuple[Component, ...]:
    """The non-tensor memory of one GPU process for a run whose live-tensor peak is ``peak_bytes``: the
    CUDA context, cuBLAS workspaces and NCCL buffers of ``nontorch`` (:mod:`.nontorch`) and the allocator's
    reserve (:mod:`.reserve`: the model's where ``allocator`` is its report, else the flat share)."""
    return (*_fixed_components(nontorch), reserve_component(peak_bytes, weight_bytes, allocator))


@lru_cache(maxsize=64)
def _fixed_components(nontorch: NonTorch) -> tuple[Component, ...]:
    """They depend on nothing but ``nontorch``, so estimates with the same one share one (immutable) tuple."""
    return nontorch_components(nontorch)


def stage_share(
    stage: int,
    tp: int,
    peak_phase: Phase,
    weight_bytes: int,
    nontorch: NonTorch,
    replicas: str = "",
    allocator: AllocatorReport | None = None,
) -> GpuShare:
    """The share of TP rank 0 of pipeline stage ``stage``: its peak phase plus the process overheads
    (:func:`overhead_components`, ``weight_bytes`` being what does not fragment the allocator, ``nontorch``
    what the stage's process holds beside torch); ``replicas`` is appended to the role (e.g. the
    data-parallel copies that hold the same); ``allocator``: the allocator model's report, where the run has
    one."""
    over = overhead_components(peak_phase.peak_bytes, weight_bytes, nontorch, allocator)
    role = f"PP stage {stage}" + (f", TP rank 0 of {tp}" if tp > 1 else "") + replicas
    return GpuShare(
        index=stage * tp,
        role=role,
        peak_bytes=peak_phase.peak_bytes,
        total_bytes=peak_phase.peak_bytes + sum(c.bytes for c in over),
        components=(*peak_phase.components, *over),
    )
