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

from gpumem_gui.core.results.estimate import Estimate
from gpumem_gui.core.results.nontorch import outside_allocator_bytes


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
