"""The Inference tab: the run form (every :class:`InferenceRun` field), the GPU target picker and presets.

Both forms follow one contract: ``value()`` builds a new validated model, ``set_value(model)`` fills the
widgets under :class:`QSignalBlocker` (so it emits nothing), and one ``changed`` signal fires on any edit.
A bad value never raises out of a slot: :meth:`RunForm.checked_value` shows the message next to the field in
a red label and returns ``None``, and the window keeps the last good estimate.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from PySide6.QtCore import QSignalBlocker, Qt, Signal
from PySide6.QtGui import QFont, QStandardItem, QStandardItemModel
from PySide6.QtWidgets import (
    QAbstractSpinBox,
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QLabel,
    QLineEdit,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from gpumem_gui.core import (
    DEFAULT_MARGIN_BYTES,
    KV_DTYPE_INFO,
    GpumemInputError,
    GpuTarget,
    InferenceRun,
    MiB,
    SizeUnit,
    engine_kv_dtypes,
    find_gpu,
    fmt_bytes,
    list_weight_formats,
    load_gpu_catalog,
    make_run,
)
from gpumem_gui.hardware.snapshot import GpuDevice, GpuSnapshot
from gpumem_gui.ui.theme import ErrorLabel

ENGINES = ("transformers", "vllm", "llama.cpp")
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


def _combo_set(combo: QComboBox, data: object) -> bool:
    i = combo.findData(data)
    if i >= 0:
        combo.setCurrentIndex(i)
    return i >= 0


def _blocked(widgets: Sequence[QWidget]) -> contextlib.ExitStack:
    stack = contextlib.ExitStack()
    for w in widgets:
        stack.enter_context(QSignalBlocker(w))
    return stack


def _field_from_message(message: str, names: Sequence[str]) -> str | None:
    """A model-level validation error names no field; find the first field name its message mentions."""
    hits = [(message.find(n), n) for n in names if n in message]
    return min(hits)[1] if hits else None


@dataclass
class _Row:
    widget: QWidget
    error: ErrorLabel
    label: QLabel


def typed(widget: QWidget | None) -> bool:
    """Whether ``widget``'s value just changed because the user typed into its text field, as opposed to a
    step (arrow buttons or keys, the wheel), a pick from a list, a click or :meth:`setValue`: only typing
    leaves the text field marked modified (Qt clears the mark whenever it rewrites the text itself)."""
    edit: QLineEdit | None = None
    if isinstance(widget, QAbstractSpinBox):
        edit = widget.findChild(QLineEdit)
    elif isinstance(widget, QComboBox) and widget.isEditable():
        edit = widget.lineEdit()
    return edit is not None and edit.isModified()


class _FieldForm(QWidget):
    """Shared plumbing: rows of (label, widget, inline error label) and the error display."""

    changed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._rows: dict[str, _Row] = {}
        self.form_error = ErrorLabel()
        self.typing = False  # the last change was typed into a text field (the window waits for more keys)

    def _add_row(self, layout: QFormLayout, name: str, label: str, widget: QWidget, tip: str) -> QWidget:
        box = QWidget()
        v = QVBoxLayout(box)
        v.setContentsMargins(0, 0, 0, 0)
        v.setSpacing(2)
        v.addWidget(widget)
        err = ErrorLabel()
        err.setObjectName(f"error_{name}")
        v.addWidget(err)
        lab = QLabel(label)
        lab.setBuddy(widget)
        lab.setToolTip(tip)
        widget.setToolTip(tip)
        widget.setObjectName(name)
        layout.addRow(lab, box)
        self._rows[name] = _Row(widget, err, lab)
        return widget

    def _connect(self, widget: QWidget) -> None:
        if isinstance(widget, QSpinBox | QDoubleSpinBox):
            widget.valueChanged.connect(lambda *_, w=widget: self._emit_changed(w))
        elif isinstance(widget, QComboBox):
            widget.currentIndexChanged.connect(lambda *_, w=widget: self._emit_changed(w))
        elif isinstance(widget, QCheckBox):
            widget.toggled.connect(lambda *_, w=widget: self._emit_changed(w))

    def _emit_changed(self, widget: QWidget | None = None) -> None:
        """Emit ``changed``; :attr:`typing` says whether ``widget`` changed because its text was typed."""
        self.typing = typed(widget)
        self.changed.emit()

    def widget(self, name: str) -> QWidget:
        """The input widget of field ``name`` (tests and the window drive the form through these)."""
        return self._rows[name].widget

    def error_text(self, name: str | None = None) -> str:
        """The inline error shown for field ``name`` (or the form-level one), '' when none."""
        label = self.form_error if name is None else self._rows[name].error
        return "" if label.isHidden() else label.text()

    def show_error(self, field: str | None, message: str) -> None:
        """Show ``message`` next to ``field``'s widget, or above the form when no such field is here."""
        message = message.replace("Value error, ", "")
        row = self._rows.get(field or "")
        if row is not None:
            row.error.show_message(message)
        else:
            self.form_error.show_message(message)

    def clear_errors(self) -> None:
        self.form_error.show_message(None)
        for row in self._rows.values():
            row.error.show_message(None)

    def has_errors(self) -> bool:
        return not self.form_error.isHidden() or any(not r.error.isHidden() for r in self._rows.values())

    def _all_widgets(self) -> list[QWidget]:
        return [r.widget for r in self._rows.values()]


def _spin(lo: int, hi: int, step: int = 1, suffix: str = "", special: str | None = None) -> QSpinBox:
    s = QSpinBox()
    s.setRange(lo, hi)
    s.setSingleStep(step)
    s.setSuffix(suffix)
    s.setGroupSeparatorShown(True)
    s.setKeyboardTracking(False)
    s.setAccelerated(True)
    if special:
        s.setSpecialValueText(special)
    return s


def _combo(items: Sequence[tuple[str, object]]) -> QComboBox:
    c = QComboBox()
    for text, data in items:
        c.addItem(text, data)
    return c


class RunForm(_FieldForm):
    """Every field of :class:`InferenceRun`, with units, ranges and tooltips.

    Signals:
        changed(): any field was edited by the user (not emitted by :meth:`set_value`).
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._has_file_weights = False
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(self.form_error)

        # -- workload
        g = QGroupBox("Workload")
        f = QFormLayout(g)
        self._add_row(
            f,
            "batch",
            "Batch",
            _spin(1, 1 << 20, suffix=" seq"),
            "Sequences processed together (1 to 1,048,576).",
        )
        self._add_row(
            f,
            "seq",
            "Prompt",
            _spin(1, 1 << 24, step=256, suffix=" tokens"),
            "Prompt tokens per sequence (1 to 16,777,216). The context is prompt + new tokens.",
        )
        self._add_row(
            f,
            "new_tokens",
            "New tokens",
            _spin(0, 1 << 24, step=64, suffix=" tokens"),
            "Tokens generated per sequence (0 to 16,777,216); 0 = one forward over the prompt only.",
        )
        self._add_row(
            f,
            "engine",
            "Engine",
            _combo(
                [("transformers (PyTorch)", "transformers"), ("vLLM", "vllm"), ("llama.cpp", "llama.cpp")]
            ),
            "The runtime: each allocates memory its own way (transformers: op by op; vLLM: a paged KV pool "
            "sized from gpu_memory_utilization; llama.cpp: model, KV and compute buffers).",
        )
        outer.addWidget(g)

        # -- precision
        g = QGroupBox("Precision")
        f = QFormLayout(g)
        self._weights = self._add_row(
            f,
            "weights",
            "Weights",
            self._weights_combo(),
            "How the weights are stored: float, FP8, bitsandbytes, GPTQ/AWQ, MX/NV FP4 or a GGUF type. "
            "Quantized formats count their scales and zero-points too.",
        )
        self._add_row(
            f,
            "compute_dtype",
            "Compute dtype",
            _combo([("bf16", "bf16"), ("fp16", "fp16"), ("fp32", "fp32")]),
            "Activation dtype, and the dtype of every tensor the weight format leaves unquantized.",
        )
        self._kv = self._add_row(
            f,
            "kv_dtype",
            "KV cache",
            QComboBox(),
            "KV-cache element type; the list holds what the chosen engine accepts. auto = the compute dtype.",
        )
        outer.addWidget(g)

        # -- transformers only
        self._hf_group = g = QGroupBox("transformers")
        f = QFormLayout(g)
        self._add_row(
            f,
            "attn",
            "Attention",
            _combo([("sdpa", "sdpa"), ("eager", "eager"), ("flash-attention 2", "flash")]),
            "attn_implementation: eager materialises the full score matrix; sdpa and flash do not.",
        )
        self._add_row(
            f,
            "logits",
            "Logits",
            _combo([("last position (generate)", "last"), ("all positions (eval forward)", "all")]),
            "generate() keeps logits of the last position only; an evaluation forward keeps all of them.",
        )
        outer.addWidget(g)

        # -- parallelism
        g = QGroupBox("Parallelism")
        f = QFormLayout(g)
        self._add_row(
            f,
            "tp",
            "Tensor parallel",
            _spin(1, 4096, suffix=" GPUs"),
            "Tensor-parallel degree (1 to 4096): must divide the attention heads.",
        )
        self._add_row(
            f,
            "pp",
            "Pipeline parallel",
            _spin(1, 4096, suffix=" stages"),
            "Pipeline stages (1 to 4096): at most the number of layers.",
        )
        self._add_row(
            f,
            "ep",
            "Expert parallel",
            _spin(1, 4096),
            "Expert-parallel degree for MoE models (1 to 4096): must divide the experts and be at most "
            "tp x pp.",
        )
        outer.addWidget(g)

        # -- vLLM only
        self._vllm_group = g = QGroupBox("vLLM")
        f = QFormLayout(g)
        util = QDoubleSpinBox()
        util.setRange(0.01, 1.0)
        util.setSingleStep(0.01)
        util.setDecimals(2)
        util.setKeyboardTracking(False)
        self._add_row(
            f,
            "gpu_memory_utilization",
            "GPU memory utilization",
            util,
            "--gpu-memory-utilization (0.01 to 1): the share of each GPU's memory vLLM may take; the KV pool "
            "gets what is left of it after weights, activations and CUDA graphs.",
        )
        self._add_row(
            f,
            "max_num_seqs",
            "Max sequences",
            _spin(1, 1 << 16),
            "--max-num-seqs (1 to 65,536): concurrent sequences; sizes the sampler's buffers.",
        )
        self._add_row(
            f,
            "max_model_len",
            "Max model length",
            _spin(0, 1 << 24, step=1024, suffix=" tokens", special="auto (prompt + new)"),
            "--max-model-len (1 to 16,777,216): the longest request; one such request must fit in the "
            "KV pool.",
        )
        self._add_row(
            f,
            "max_num_batched_tokens",
            "Max batched tokens",
            _spin(0, 1 << 24, step=1024, suffix=" tokens", special="auto (8192)"),
            "--max-num-batched-tokens (1 to 16,777,216): tokens in the profiling forward.",
        )
        self._add_row(
            f,
            "enforce_eager",
            "Enforce eager",
            QCheckBox("no CUDA graphs"),
            "--enforce-eager: skip CUDA-graph capture (saves its memory pool, runs slower).",
        )
        outer.addWidget(g)

        # -- llama.cpp only
        self._llama_group = g = QGroupBox("llama.cpp")
        f = QFormLayout(g)
        self._add_row(
            f,
            "n_gpu_layers",
            "GPU layers (-ngl)",
            _spin(-1, 4096, special="all layers"),
            "-ngl (-1 = all, 0 to 4096): layers offloaded to the GPU; the rest stay in host memory.",
        )
        self._add_row(
            f,
            "n_batch",
            "Logical batch (-b)",
            _spin(1, 1 << 20, step=256, suffix=" tokens"),
            "-b (1 to 1,048,576): logical batch size; must be at least the physical batch.",
        )
        self._add_row(
            f,
            "n_ubatch",
            "Physical batch (-ub)",
            _spin(1, 1 << 20, step=128, suffix=" tokens"),
            "-ub (1 to 1,048,576): physical micro-batch; sizes the compute buffer.",
        )
        self._add_row(
            f,
            "flash_attn",
            "Flash attention",
            QCheckBox("-fa on"),
            "-fa: without it the KQ matrix is materialised.",
        )
        outer.addWidget(g)

        # -- overheads
        g = QGroupBox("Overheads")
        f = QFormLayout(g)
        self._add_row(
            f,
            "cuda_context_mib",
            "CUDA context",
            _spin(0, 1 << 16, step=50, suffix=" MiB"),
            "Memory the CUDA context takes per process (0 to 65,536 MiB; ~300-600 MiB on recent drivers).",
        )
        outer.addWidget(g)
        outer.addStretch(1)

        for w in self._all_widgets():
            self._connect(w)
        self.widget("engine").currentIndexChanged.connect(self._on_engine_changed)
        self.widget("compute_dtype").currentIndexChanged.connect(self._fill_kv)
        self.set_value(InferenceRun())

    # ---- combos --------------------------------------------------------------------------------------------

    def _weights_combo(self) -> QComboBox:
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
        return combo

    def set_file_weights_available(self, available: bool) -> None:
        """Offer 'the model's own files' as a weight format when the model was opened from weight files."""
        combo = self._weights
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
                    _combo_set(combo, "bf16")
        self._has_file_weights = available

    def _fill_kv(self, *_: object) -> None:
        combo = self._kv
        assert isinstance(combo, QComboBox)
        engine = self.widget("engine").currentData()  # type: ignore[attr-defined]
        compute = self.widget("compute_dtype").currentData()  # type: ignore[attr-defined]
        current = combo.currentData()
        with QSignalBlocker(combo):
            combo.clear()
            combo.addItem(f"auto (= compute dtype, {compute})", "auto")
            for k in engine_kv_dtypes(engine):
                info = KV_DTYPE_INFO[k]
                combo.addItem(f"{info.label}  ({info.bytes_per_element:.3g} B/elem)", k)
                combo.setItemData(combo.count() - 1, info.source, Qt.ItemDataRole.ToolTipRole)
            if current is None or not _combo_set(combo, current):
                _combo_set(combo, "auto")
        if current is not None and combo.currentData() != current:
            self._emit_changed()

    def _on_engine_changed(self, *_: object) -> None:
        self._fill_kv()
        self._show_engine_groups()

    def _show_engine_groups(self) -> None:
        engine = self.widget("engine").currentData()  # type: ignore[attr-defined]
        self._hf_group.setVisible(engine == "transformers")
        self._vllm_group.setVisible(engine == "vllm")
        self._llama_group.setVisible(engine == "llama.cpp")

    # ---- the value contract --------------------------------------------------------------------------------

    def _fields(self) -> dict[str, object]:
        w = self.widget
        out: dict[str, object] = {}
        for name in ("batch", "seq", "new_tokens", "tp", "pp", "ep", "max_num_seqs", "n_gpu_layers"):
            out[name] = w(name).value()  # type: ignore[attr-defined]
        for name in ("n_batch", "n_ubatch", "cuda_context_mib"):
            out[name] = w(name).value()  # type: ignore[attr-defined]
        for name in ("weights", "compute_dtype", "kv_dtype", "attn", "logits", "engine"):
            out[name] = w(name).currentData()  # type: ignore[attr-defined]
        out["gpu_memory_utilization"] = round(w("gpu_memory_utilization").value(), 4)  # type: ignore[attr-defined]
        for name in ("max_model_len", "max_num_batched_tokens"):
            out[name] = w(name).value() or None  # type: ignore[attr-defined]
        out["enforce_eager"] = w("enforce_eager").isChecked()  # type: ignore[attr-defined]
        out["flash_attn"] = w("flash_attn").isChecked()  # type: ignore[attr-defined]
        return out

    def value(self) -> InferenceRun:
        """The run the widgets describe. Raises :class:`GpumemInputError` (naming the field) when invalid."""
        fields = self._fields()
        try:
            return make_run(**fields)
        except GpumemInputError as e:
            if e.field is None or e.field not in self._rows:
                e.field = _field_from_message(e.message, list(self._rows)) or e.field
            raise

    def checked_value(self) -> InferenceRun | None:
        """:meth:`value`, with any problem shown inline instead of raised (errors cleared when valid)."""
        self.clear_errors()
        try:
            return self.value()
        except GpumemInputError as e:
            self.show_error(e.field, e.message)
            return None

    def set_value(self, run: InferenceRun) -> None:
        """Fill every widget from ``run``; emits no ``changed``."""
        w = self.widget
        with _blocked(self._all_widgets()):
            _combo_set(w("engine"), run.engine)  # type: ignore[arg-type]
            _combo_set(w("compute_dtype"), run.compute_dtype)  # type: ignore[arg-type]
            self._fill_kv()
            if run.weights == FILE_WEIGHTS and not self._has_file_weights:
                self.set_file_weights_available(True)
            _combo_set(w("weights"), run.weights)  # type: ignore[arg-type]
            _combo_set(w("kv_dtype"), run.kv_dtype)  # type: ignore[arg-type]
            _combo_set(w("attn"), run.attn)  # type: ignore[arg-type]
            _combo_set(w("logits"), run.logits)  # type: ignore[arg-type]
            for name in ("batch", "seq", "new_tokens", "tp", "pp", "ep", "max_num_seqs", "n_gpu_layers"):
                w(name).setValue(getattr(run, name))  # type: ignore[attr-defined]
            for name in ("n_batch", "n_ubatch", "cuda_context_mib"):
                w(name).setValue(getattr(run, name))  # type: ignore[attr-defined]
            w("gpu_memory_utilization").setValue(run.gpu_memory_utilization)  # type: ignore[attr-defined]
            w("max_model_len").setValue(run.max_model_len or 0)  # type: ignore[attr-defined]
            w("max_num_batched_tokens").setValue(run.max_num_batched_tokens or 0)  # type: ignore[attr-defined]
            w("enforce_eager").setChecked(run.enforce_eager)  # type: ignore[attr-defined]
            w("flash_attn").setChecked(run.flash_attn)  # type: ignore[attr-defined]
        self._show_engine_groups()
        self.clear_errors()


# ---- the GPU target ----------------------------------------------------------------------------------------


class GpuChoice(BaseModel):
    """Which GPUs the plan must fit on: ``count`` catalog GPUs, or local GPUs from ``device`` on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["catalog", "local"] = "catalog"
    gpu_id: str = Field("RTX-4090", min_length=1, max_length=100, description="catalog id (kind 'catalog')")
    device: str | None = Field(None, max_length=20, description="local device key, e.g. '0' or '0:1'")
    count: int = Field(1, ge=1, le=4096)
    margin_mib: int = Field(DEFAULT_MARGIN_BYTES // MiB, ge=0, le=1 << 20)
    basis: Literal["free", "total"] = Field("free", description="local GPUs: check against free or total")

    @property
    def margin_bytes(self) -> int:
        return self.margin_mib * MiB


@dataclass(frozen=True)
class ResolvedTarget:
    """A :class:`GpuChoice` made concrete: the core's target, and what the charts draw."""

    target: GpuTarget
    text: str
    free_now: tuple[int, ...] | None = None  # local GPUs: free memory now, whatever the basis
    devices: tuple[str, ...] = ()  # local device keys, in target order


def _local_devices(choice: GpuChoice, snapshot: GpuSnapshot | None) -> list[GpuDevice]:
    key = choice.device or "0"
    if snapshot is None:
        raise GpumemInputError("no reading of the local GPUs yet", field="gpu")
    if not snapshot.available:
        raise GpumemInputError(f"no local GPU: {snapshot.unavailable_reason}", field="gpu")
    dev = snapshot.device(key)
    if dev is None:
        raise GpumemInputError(f"local GPU {key} is not there now; pick a catalog GPU", field="gpu")
    instances = snapshot.mig_instances(dev.index) if dev.mig_mode else ()
    if instances:
        keys = ", ".join(m.key for m in instances)
        raise GpumemInputError(
            f"GPU {key} is in MIG mode: pick one of its MIG instances ({keys})", field="gpu"
        )
    if dev.is_mig_instance:
        if choice.count != 1:
            raise GpumemInputError("a MIG instance is one device: set the count to 1", field="gpu")
        chosen = [dev]
    else:
        # the picked GPU and the count - 1 freest others (most free memory first, ties by index),
        # in index order
        phys = [d for d in snapshot.physical_devices if not (d.mig_mode and snapshot.mig_instances(d.index))]
        if len(phys) < choice.count:
            raise GpumemInputError(
                f"only {len(phys)} local GPU(s) on this machine, not {choice.count}", field="gpu"
            )
        others = sorted(
            (d for d in phys if d.key != dev.key and d.ok),
            key=lambda d: (-(d.free_bytes or 0), d.index),
        )
        chosen = sorted([dev, *others[: choice.count - 1]], key=lambda d: d.index)
        if len(chosen) < choice.count:
            raise GpumemInputError(
                f"only {len(chosen)} usable local GPU(s) on this machine, not {choice.count}", field="gpu"
            )
    for d in chosen:
        if d.error:
            raise GpumemInputError(f"local GPU {d.key}: {d.error}", field="gpu")
        if d.total_bytes is None or d.free_bytes is None:
            raise GpumemInputError(f"local GPU {d.key} does not report its memory", field="gpu")
    return chosen


def resolve_target(choice: GpuChoice, snapshot: GpuSnapshot | None, unit: SizeUnit) -> ResolvedTarget:
    """The core's :class:`GpuTarget` for ``choice``; local GPUs need the latest ``snapshot``.

    Raises :class:`GpumemInputError` (field ``gpu``) when the choice cannot be met.
    """
    if choice.kind == "catalog":
        g = find_gpu(choice.gpu_id)
        target = GpuTarget(name=g.id, capacity_bytes=g.memory_bytes, count=choice.count)
        text = f"{choice.count} x {g.name} ({fmt_bytes(g.memory_bytes, unit)} each)"
        return ResolvedTarget(target=target, text=text)
    chosen = _local_devices(choice, snapshot)
    capacity = min(d.total_bytes or 0 for d in chosen)
    free = tuple(d.free_bytes or 0 for d in chosen)
    target = GpuTarget(
        name=chosen[0].name,
        capacity_bytes=capacity,
        count=len(chosen),
        free_bytes=free if choice.basis == "free" else None,
    )
    keys = ", ".join(d.key for d in chosen)
    basis = "free memory now" if choice.basis == "free" else "total memory"
    text = f"local GPU {keys}: {chosen[0].name} ({fmt_bytes(capacity, unit)} each; checked against {basis})"
    return ResolvedTarget(target=target, text=text, free_now=free, devices=tuple(d.key for d in chosen))


class TargetForm(_FieldForm):
    """GPU target picker: a catalog GPU or a local GPU, how many, and the safety margin.

    Signals:
        changed(): the target was edited by the user.
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._unit = SizeUnit.GIB
        self._local: list[tuple[str, str, int | None]] = []  # (key, name, total)
        self._basis: Literal["free", "total"] = "free"
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        g = QGroupBox("GPU target")
        f = QFormLayout(g)
        f.addRow(self.form_error)
        self._gpu = self._add_row(
            f,
            "gpu",
            "GPU",
            QComboBox(),
            "The GPU the plan must fit on: one of your GPUs (checked against its free memory now) or any GPU "
            "of the built-in catalog.",
        )
        assert isinstance(self._gpu, QComboBox)
        self._gpu.setMaxVisibleItems(24)
        self._add_row(
            f,
            "count",
            "Count",
            _spin(1, 4096, suffix=" GPUs"),
            "How many such GPUs (1 to 4096). Local GPUs: the picked one and the freest others.",
        )
        self._add_row(
            f,
            "margin_mib",
            "Safety margin",
            _spin(0, 1 << 20, step=256, suffix=" MiB"),
            "Memory to keep free on every GPU (0 to 1,048,576 MiB; llama.cpp's --fit keeps 1024 MiB).",
        )
        outer.addWidget(g)
        for w in self._all_widgets():
            self._connect(w)
        self._fill_gpus()
        self.set_value(GpuChoice())

    def _fill_gpus(self) -> None:
        combo = self._gpu
        assert isinstance(combo, QComboBox)
        current = combo.currentData()
        model = QStandardItemModel(combo)
        bold = QFont()
        bold.setBold(True)

        def header(text: str) -> None:
            item = QStandardItem(text)
            item.setFlags(Qt.ItemFlag.NoItemFlags)
            item.setFont(bold)
            model.appendRow(item)

        def entry(text: str, data: str, tip: str = "") -> None:
            item = QStandardItem(text)
            item.setData(data, Qt.ItemDataRole.UserRole)
            if tip:
                item.setToolTip(tip)
            model.appendRow(item)

        if self._local:
            header("This machine")
            for key, name, total in self._local:
                size = f" ({fmt_bytes(total, self._unit, 1)})" if total else ""
                entry(f"    GPU {key}: {name.removeprefix('NVIDIA ')}{size}", f"local:{key}")
        by_vendor: dict[str, list] = {}
        for g in load_gpu_catalog():
            by_vendor.setdefault(g.vendor, []).append(g)
        for vendor, gpus in by_vendor.items():
            header({"nvidia": "Catalog: NVIDIA", "amd": "Catalog: AMD"}.get(vendor, vendor))
            for g in gpus:
                entry(
                    f"    {g.name}  ({fmt_bytes(g.memory_bytes, self._unit, 1)})",
                    f"catalog:{g.id}",
                    f"{g.id}: {g.memory_nominal}; {g.memory_kind} figure from {g.memory_source}",
                )
        with QSignalBlocker(combo):
            combo.setModel(model)
            if current is not None:
                self._select(current)

    def _select(self, data: str) -> None:
        combo = self._gpu
        assert isinstance(combo, QComboBox)
        if _combo_set(combo, data):
            return
        if data.startswith("local:"):  # keep a choice whose GPU has not been seen (yet)
            model = combo.model()
            assert isinstance(model, QStandardItemModel)
            item = QStandardItem(f"    local GPU {data.partition(':')[2]} (not seen now)")
            item.setData(data, Qt.ItemDataRole.UserRole)
            model.insertRow(0, item)
            combo.setCurrentIndex(0)
        else:
            _combo_set(combo, f"catalog:{GpuChoice().gpu_id}")

    def set_local_devices(self, devices: Sequence[GpuDevice]) -> None:
        """Offer these local GPUs (rebuilt only when the set of devices changes)."""
        local = [(d.key, d.name, d.total_bytes) for d in devices]
        if local == self._local:
            return
        self._local = local
        self._fill_gpus()

    def set_unit(self, unit: SizeUnit) -> None:
        if unit != self._unit:
            self._unit = unit
            self._fill_gpus()

    def set_basis(self, basis: Literal["free", "total"]) -> None:
        self._basis = basis

    def value(self) -> GpuChoice:
        data = self._gpu.currentData() or f"catalog:{GpuChoice().gpu_id}"  # type: ignore[attr-defined]
        kind, _, ident = str(data).partition(":")
        return GpuChoice(
            kind=kind,
            gpu_id=ident if kind == "catalog" else GpuChoice().gpu_id,
            device=ident if kind == "local" else None,
            count=self.widget("count").value(),  # type: ignore[attr-defined]
            margin_mib=self.widget("margin_mib").value(),  # type: ignore[attr-defined]
            basis=self._basis,
        )

    def set_value(self, choice: GpuChoice) -> None:
        with _blocked(self._all_widgets()):
            data = f"local:{choice.device or '0'}" if choice.kind == "local" else f"catalog:{choice.gpu_id}"
            self._select(data)
            self.widget("count").setValue(choice.count)  # type: ignore[attr-defined]
            self.widget("margin_mib").setValue(choice.margin_mib)  # type: ignore[attr-defined]
        self._basis = choice.basis
        self.clear_errors()


# ---- presets -----------------------------------------------------------------------------------------------


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
