"""What a GPU said: the memory figures a user pastes (an OOM message, nvidia-smi, PyTorch's memory report,
an engine's startup or OOM line), read into :class:`ObservedMemory` records in bytes."""

from gpumem_gui.core.observed.model import (
    FIGURES,
    PARTS,
    SOURCE_FORMATS,
    ObservedMemory,
    ObservedProcess,
    ObservedReport,
)

__all__ = [
    "FIGURES",
    "PARTS",
    "SOURCE_FORMATS",
    "ObservedMemory",
    "ObservedProcess",
    "ObservedReport",
]
