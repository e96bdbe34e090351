"""What a GPU said: the memory figures a user pastes (an OOM message, nvidia-smi, PyTorch's memory report,
an engine's startup or OOM line), read into :class:`ObservedMemory` records in bytes; and what a
measurement implies for later estimates on that GPU (:class:`Calibration`)."""

from gpumem_gui.core.observed.apply import (
    REPLACED_BY,
    apply_calibration,
    calibration_applies,
    calibration_note,
)
from gpumem_gui.core.observed.calibration import (
    Calibration,
    Measurement,
    Stack,
    calibration_for,
    calibration_from,
    gpu_identity,
)
from gpumem_gui.core.observed.model import (
    FIGURES,
    SOURCE_FORMATS,
    ObservedMemory,
    ObservedProcess,
    ObservedReport,
)

__all__ = [
    "FIGURES",
    "REPLACED_BY",
    "SOURCE_FORMATS",
    "Calibration",
    "Measurement",
    "ObservedMemory",
    "ObservedProcess",
    "ObservedReport",
    "Stack",
    "apply_calibration",
    "calibration_applies",
    "calibration_for",
    "calibration_from",
    "calibration_note",
    "gpu_identity",
]
