"""A model of PyTorch's CUDA caching allocator (``c10/cuda/CUDACachingAllocator.cpp``), fed by the replay's
allocations and frees: what ``torch.cuda.max_memory_reserved`` and nvidia-smi show beside the live tensors.

:mod:`.rules` the size rules, :mod:`.pool` blocks and pools, :mod:`.caching` the allocator, :mod:`.config`
the ``PYTORCH_CUDA_ALLOC_CONF`` settings, :mod:`.events` and :mod:`.run` the replay's event stream through it.
"""

from gpumem_gui.core.allocator.caching import CachingAllocator, OutOfMemory
from gpumem_gui.core.allocator.config import AllocatorConfig, parse_alloc_conf
from gpumem_gui.core.allocator.events import ALLOC, FREE, GROW, PHASE, Event
from gpumem_gui.core.allocator.run import AllocatorReport, PhaseReserve, run_events

__all__ = [
    "ALLOC",
    "FREE",
    "GROW",
    "PHASE",
    "AllocatorConfig",
    "AllocatorReport",
    "CachingAllocator",
    "Event",
    "OutOfMemory",
    "PhaseReserve",
    "parse_alloc_conf",
    "run_events",
]
