"""What a GPU said: the memory figures a user pastes (an OOM message, nvidia-smi, PyTorch's memory report,
an engine's startup or OOM line), read into :class:`ObservedMemory` records in bytes; and what a
measurement implies for later estimates on that GPU (:class:`Calibration`, ``calibration.py``; applied by
``apply.py``).

``read.py`` (:func:`read_observed`, :func:`read_observed_bytes`) runs one reader per format family, each
following its source as that source prints the text: ``torch_oom`` (PyTorch's OOM message, four forms),
``nvidia_smi`` (the table and its processes), ``nvidia_csv`` (``--query-gpu``), ``torch_summary``
(``memory_summary()``), ``torch_stats`` (``memory_stats()``), ``snapshot`` (``_snapshot()`` pickles, by a
restricted unpickler), ``vllm``, ``sglang``, ``llamacpp`` (and Ollama's runner) and ``ollama``; ``draft``
turns a size as printed into bytes, ``engine_log`` groups an engine's log by worker or device.
"""

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
    PARTS,
    SOURCE_FORMATS,
    ObservedMemory,
    ObservedProcess,
    ObservedReport,
    latest_record,
)

__all__ = [
    "FIGURES",
    "PARTS",
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
    "latest_record",
]
