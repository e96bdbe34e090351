"""The Inference tab: the run form, generated from :class:`InferenceRun`'s field declarations, and presets.

The builder (:class:`~gpumem_gui.ui.field_form.RunFieldsForm`) makes every row; this form adds the two
lists no declaration can hold: the weight formats grouped by family (plus the model's own files when it was
opened from them) and the KV dtypes the chosen engine accepts. The engine's own groups (transformers, vLLM,
llama.cpp) show only for that engine. A bad value never raises out of a slot: :meth:`checked_value` shows the
message next to the field in a red label and returns ``None``, and the window keeps the last good estimate.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from PySide6.QtCore import QSignalBlocker, Qt
from PySide6.QtGui import QFont, QStandardItem, QStandardItemModel
from PySide6.QtWidgets import QComboBox, QWidget

from gpumem_gui.core import (
    KV_DTYPE_INFO,
    GpumemInputError,
    InferenceRun,
    RunField,
    engine_kv_dtypes,
    list_weight_formats,
    make_run,
)
from gpumem_gui.ui.field_form import Input, RunFieldsForm, combo_set
from gpumem_gui.ui.target_form import GpuChoice

FAMILY_TITLES = {
    "float": "Float",
    "fp8": "FP8",
    "bitsandbytes": "bitsandbytes",
    "gptq": "GPTQ",
    "awq": "AWQ",
    "microscaling": "Microscaling (MXFP4 / NVFP4)",
    "gguf-mix": "GGUF: llama-quantize mixes",
    "gguf": "GGUF: one type everywhere",
}
FILE_WEIGHTS = "file"


def _weights_input(_f: RunField) -> Input:
    combo = QComboBox()
    combo.setMaxVisibleItems(24)
    model = QStandardItemModel(combo)
    bold = QFont()
    bold.setBold(True)
    seen: dict[str, list] = {}
    for fmt in list_weight_formats():
        seen.setdefault(fmt.family, []).append(fmt)
    for family, fmts in seen.items():
        head = QStandardItem(FAMILY_TITLES.get(family, family))
        head.setFlags(Qt.ItemFlag.NoItemFlags)
        head.setFont(bold)
        model.appendRow(head)
        for fmt in fmts:
            item = QStandardItem(f"    {fmt.label}  ({fmt.bits:.3g} bit)")
            item.setData(fmt.id, Qt.ItemDataRole.UserRole)
            item.setToolTip(f"{fmt.id}: {fmt.description}")
            model.appendRow(item)
    combo.setModel(model)
    return Input(combo, combo.currentData, lambda v: combo_set(combo, v))


def _kv_input(_f: RunField) -> Input:
    combo = QComboBox()  # filled per engine by RunForm._fill_kv
    return Input(combo, combo.currentData, lambda v: combo_set(combo, v))


class RunForm(RunFieldsForm):
    """Every field of :class:`InferenceRun`, with units, ranges and tooltips.

    Signals:
        changed(): any field was edited by the user (not emitted by :meth:`set_value`).
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(InferenceRun, make_run, {"weights": _weights_input, "kv_dtype": _kv_input}, parent)
        self._has_file_weights = False
        self.widget("engine").currentIndexChanged.connect(self._fill_kv)  # type: ignore[attr-defined]
        self.widget("compute_dtype").currentIndexChanged.connect(self._fill_kv)  # type: ignore[attr-defined]
        self.set_value(InferenceRun())

    def set_file_weights_available(self, available: bool) -> None:
        """Offer 'the model's own files' as a weight format when the model was opened from weight files."""
        combo = self.widget("weights")
        assert isinstance(combo, QComboBox)
        present = combo.findData(FILE_WEIGHTS) >= 0
        if available == present:
            self._has_file_weights = available
            return
        with QSignalBlocker(combo):
            model = combo.model()
            assert isinstance(model, QStandardItemModel)
            if available:
                item = QStandardItem("the model's files (exact header bytes)")
                item.setData(FILE_WEIGHTS, Qt.ItemDataRole.UserRole)
                item.setToolTip("file: the bytes of every tensor in the model's safetensors/GGUF headers")
                model.insertRow(0, item)
            else:
                was_file = combo.currentData() == FILE_WEIGHTS
                model.removeRow(combo.findData(FILE_WEIGHTS))
                if was_file:
                    combo_set(combo, "bf16")
        self._has_file_weights = available

    def _fill_kv(self, *_: object) -> None:
        """The KV dtypes the chosen engine accepts; a choice it cannot take falls back to auto."""
        combo = self.widget("kv_dtype")
        assert isinstance(combo, QComboBox)
        engine = self.widget("engine").currentData()  # type: ignore[attr-defined]
        compute = self.widget("compute_dtype").currentData()  # type: ignore[attr-defined]
        current = combo.currentData()
        try:
            kv_ids = engine_kv_dtypes(engine)
        except GpumemInputError:  # no engine picked (a combo emptied by code; the form fuzz found it raising
            kv_ids = ()  # out of this slot): auto only, and reading the form says the engine is missing
        with QSignalBlocker(combo):
            combo.clear()
            combo.addItem(f"auto (= compute dtype, {compute})", "auto")
            for k in kv_ids:
                info = KV_DTYPE_INFO[k]
                combo.addItem(f"{info.label}  ({info.bytes_per_element:.3g} B/elem)", k)
                combo.setItemData(combo.count() - 1, info.source, Qt.ItemDataRole.ToolTipRole)
            if current is None or not combo_set(combo, current):
                combo_set(combo, "auto")
        if current is not None and combo.currentData() != current:
            self._emit_changed()

    def _fill(self, run: InferenceRun) -> None:  # type: ignore[override]
        combo_set(self.widget("engine"), run.engine)  # type: ignore[arg-type]
        combo_set(self.widget("compute_dtype"), run.compute_dtype)  # type: ignore[arg-type]
        self._fill_kv()
        if run.weights == FILE_WEIGHTS and not self._has_file_weights:
            self.set_file_weights_available(True)
        super()._fill(run)


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    run: InferenceRun
    gpu: GpuChoice | None = None


PRESETS: tuple[Preset, ...] = (
    Preset(
        "serve with vLLM",
        "vLLM server: 90 % of the GPU, 32k max model length, 16 concurrent requests of 2k + 512 tokens",
        InferenceRun(
            engine="vllm",
            batch=16,
            seq=2048,
            new_tokens=512,
            weights="bf16",
            gpu_memory_utilization=0.9,
            max_model_len=32768,
        ),
        GpuChoice(gpu_id="H100-SXM-80GB"),
    ),
    Preset(
        "chat on one 24 GB card (llama.cpp Q4_K_M)",
        "llama.cpp, Q4_K_M weights, all layers on the GPU, an 8k chat with 512 new tokens",
        InferenceRun(
            engine="llama.cpp",
            batch=1,
            seq=8192,
            new_tokens=512,
            weights="gguf-Q4_K_M",
            kv_dtype="fp16",
            n_gpu_layers=-1,
        ),
        GpuChoice(gpu_id="RTX-4090"),
    ),
    Preset(
        "long-context transformers",
        "transformers generate() over a 128k prompt with sdpa attention, bf16",
        InferenceRun(engine="transformers", batch=1, seq=131072, new_tokens=256, weights="bf16", attn="sdpa"),
        GpuChoice(gpu_id="H100-SXM-80GB"),
    ),
)


def iter_presets() -> Iterator[Preset]:
    yield from PRESETS
