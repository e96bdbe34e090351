"""The Training tab: every :class:`TrainingRun` field, shown only where it matters, and the training presets.

Same contract as :class:`~gpumem_gui.ui.run_form.RunForm`: ``value()`` builds a validated run (raising
:class:`GpumemInputError` naming the field), ``checked_value()`` shows the problem inline instead,
``set_value(run)`` fills the widgets under signal blockers, and one ``changed`` signal fires on any edit.

Visibility: the LoRA group for ``lora``/``qlora``, the QLoRA base for ``qlora``, offload and FSDP once there
is something to shard (``dp > 1`` or a ZeRO stage, or when they already hold a non-default value), the GPUs
per node for FSDP ``hybrid_shard``. A hidden field keeps its value, so a run always round-trips.
"""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtCore import QSignalBlocker
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QLabel,
    QVBoxLayout,
    QWidget,
)

from gpumem_gui.core import PRECISION_DOC, GpumemInputError, TrainingRun, make_training_run
from gpumem_gui.ui.run_form import (
    GpuChoice,
    _blocked,
    _combo,
    _combo_set,
    _field_from_message,
    _FieldForm,
    _spin,
)

METHODS = [
    ("full fine-tune", "full"),
    ("LoRA adapters", "lora"),
    ("QLoRA (4-bit base + LoRA)", "qlora"),
]
PRECISIONS = [
    ("mixed bf16 (fp32 master, bf16 autocast)", "amp-bf16"),
    ("mixed fp16 (fp32 master, fp16 autocast)", "amp-fp16"),
    ("pure bf16", "bf16"),
    ("fp32", "fp32"),
    ("Megatron bf16 (fp32 main grads)", "megatron-bf16"),
]
OPTIMIZERS = [
    ("AdamW (torch default: foreach)", "adamw"),
    ("AdamW fused", "adamw-fused"),
    ("AdamW foreach", "adamw-foreach"),
    ("AdamW for-loop", "adamw-for-loop"),
    ("AdamW 8-bit (bitsandbytes)", "adamw-8bit"),
    ("paged AdamW 8-bit (bitsandbytes)", "paged-adamw-8bit"),
    ("Adafactor", "adafactor"),
    ("SGD", "sgd"),
    ("SGD with momentum", "sgd-momentum"),
    ("Lion", "lion"),
]
LORA_TARGET_CHOICES = ("all-linear", "q_proj,v_proj", "q_proj,k_proj,v_proj,o_proj")
DROPOUT_DEFAULT = -0.01  # the spin box's special value: None (the architecture's default)


def _dspin(lo: float, hi: float, step: float, decimals: int, special: str | None = None) -> QDoubleSpinBox:
    s = QDoubleSpinBox()
    s.setRange(lo, hi)
    s.setSingleStep(step)
    s.setDecimals(decimals)
    s.setKeyboardTracking(False)
    if special:
        s.setSpecialValueText(special)
    return s


class TrainingForm(_FieldForm):
    """Every field of :class:`TrainingRun` (``gpus`` is derived: dp x tp x pp x cp).

    Signals:
        changed(): any field was edited by the user (not emitted by :meth:`set_value`).
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._layouts: dict[str, QFormLayout] = {}
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(self.form_error)

        # -- method and precision
        g = QGroupBox("Method")
        f = QFormLayout(g)
        self._row(
            f,
            "method",
            "Method",
            _combo(METHODS),
            "full: every weight trains (gradients and optimizer states for all of them); LoRA: frozen base "
            "+ small adapters; QLoRA: LoRA on a 4-bit bitsandbytes base.",
        )
        self._row(
            f,
            "precision",
            "Precision",
            _combo(PRECISIONS),
            "How weights, activations, gradients and optimizer states are stored:\n"
            + "\n".join(f"{k}: {v}" for k, v in PRECISION_DOC.items()),
        )
        self._row(
            f,
            "optimizer",
            "Optimizer",
            _combo(OPTIMIZERS),
            "AdamW keeps two fp32 states per trainable parameter (8-bit: one byte each, paged: in unified "
            "memory); foreach/fused/for-loop differ in their step temporaries; Adafactor factors the second "
            "moment; SGD keeps none (momentum: one).",
        )
        self._row(
            f,
            "frozen_layers",
            "Frozen layers",
            _spin(0, 4096, suffix=" layers"),
            "The first decoder layers kept frozen (0 to 4096): no gradients or optimizer states for them.",
        )
        outer.addWidget(g)

        # -- workload
        g = QGroupBox("Step")
        f = QFormLayout(g)
        self._row(
            f,
            "batch",
            "Micro-batch",
            _spin(1, 1 << 20, suffix=" seq"),
            "Sequences per micro-batch on each data-parallel rank (1 to 1,048,576).",
        )
        self._row(
            f,
            "seq",
            "Sequence",
            _spin(1, 1 << 24, step=256, suffix=" tokens"),
            "Tokens per training sequence (1 to 16,777,216).",
        )
        self._row(
            f,
            "grad_accum",
            "Grad accumulation",
            _spin(1, 1 << 16, suffix=" micro-batches"),
            "Micro-batches per optimizer step (1 to 65,536): gradients live across them; with pipeline "
            "parallelism it bounds the micro-batches in flight.",
        )
        self._row(
            f,
            "grad_ckpt",
            "Gradient checkpointing",
            QCheckBox("recompute each layer in backward"),
            "Non-reentrant activation checkpointing of every decoder layer: only the layer inputs are kept, "
            "one layer is recomputed at a time during backward.",
        )
        self._row(
            f,
            "attn",
            "Attention",
            _combo([("sdpa", "sdpa"), ("eager", "eager"), ("flash-attention 2", "flash")]),
            "attn_implementation: eager keeps the scores and probabilities for backward; sdpa and flash keep "
            "the output and the log-sum-exp.",
        )
        self._row(
            f,
            "dropout",
            "Model dropout",
            _dspin(DROPOUT_DEFAULT, 0.99, 0.01, 2, special="architecture default"),
            "Hidden/attention dropout (0 to 0.99): above 0 each dropout keeps its mask for backward. "
            "Default: the architecture's own (GPT-2/OPT: 0.1, modern LLMs: 0).",
        )
        self._row(
            f,
            "first_step",
            "First step",
            QCheckBox("optimizer states created inside step()"),
            "The first optimizer step: states do not exist yet during forward and backward (steady state: "
            "they do).",
        )
        outer.addWidget(g)

        # -- LoRA
        self._lora_group = g = QGroupBox("LoRA")
        f = QFormLayout(g)
        self._row(
            f,
            "lora_rank",
            "Rank",
            _spin(1, 1 << 16),
            "LoRA rank r (1 to 65,536): at most the smallest dimension of a targeted layer.",
        )
        self._row(
            f,
            "lora_alpha",
            "Alpha",
            _dspin(0.01, 1 << 20, 1, 2),
            "lora_alpha (scaling only): no effect on memory.",
        )
        targets = QComboBox()
        targets.setEditable(True)
        for t in LORA_TARGET_CHOICES:
            targets.addItem(t, t)
        self._row(
            f,
            "lora_targets",
            "Target modules",
            targets,
            "Module names that get adapters, comma separated (q_proj,v_proj), or all-linear (every linear "
            "layer of the decoder but the head).",
        )
        self._row(
            f,
            "lora_dropout",
            "LoRA dropout",
            _dspin(0, 0.99, 0.05, 2),
            "lora_dropout (0 to 0.99): above 0 each adapter keeps a dropped copy of its input for backward.",
        )
        self._row(
            f,
            "qlora_base",
            "QLoRA base",
            _combo([("nf4", "nf4"), ("nf4 + double quantization", "nf4-dq")]),
            "4-bit bitsandbytes format of the frozen base: nf4, or nf4 with double quantization "
            "(bnb_4bit_use_double_quant: quantized absmax, ~0.4 bit/param less).",
        )
        outer.addWidget(g)

        # -- parallelism and sharding
        g = QGroupBox("GPUs and sharding")
        f = QFormLayout(g)
        self._row(
            f,
            "dp",
            "Data parallel",
            _spin(1, 4096, suffix=" ranks"),
            "Data-parallel replicas (1 to 4096); ZeRO and FSDP shard over them.",
        )
        self._row(
            f,
            "tp",
            "Tensor parallel",
            _spin(1, 4096, suffix=" GPUs"),
            "Tensor-parallel degree (1 to 4096): must divide the attention heads.",
        )
        self._row(
            f,
            "pp",
            "Pipeline parallel",
            _spin(1, 4096, suffix=" stages"),
            "Pipeline stages (1 to 4096, at most the layers); 1F1B keeps min(pp - stage, micro-batches) "
            "micro-batches in flight on a stage.",
        )
        self._row(
            f,
            "ep",
            "Expert parallel",
            _spin(1, 4096),
            "Expert-parallel degree for MoE models (1 to 4096): divides the experts and dp x tp.",
        )
        self._row(
            f,
            "cp",
            "Context parallel",
            _spin(1, 4096),
            "Context-parallel degree (1 to 4096): each rank holds seq / cp tokens (ring attention).",
        )
        self._row(
            f,
            "zero",
            "ZeRO stage",
            _combo(
                [
                    ("off", 0),
                    ("1: optimizer states", 1),
                    ("2: + gradients", 2),
                    ("3: + parameters", 3),
                ]
            ),
            "DeepSpeed ZeRO: shard optimizer states (1), gradients too (2), parameters too (3) over the "
            "data-parallel ranks. With dp 1 it shards nothing.",
        )
        self._row(
            f,
            "offload",
            "CPU offload",
            _combo(
                [
                    ("none", "none"),
                    ("optimizer states", "optimizer"),
                    ("optimizer + parameters", "optimizer+params"),
                ]
            ),
            "DeepSpeed offload_optimizer / offload_param: states (and with ZeRO-3 or FSDP, parameters) live "
            "in CPU RAM; the estimate names the RAM they need.",
        )
        self._row(
            f,
            "fsdp",
            "FSDP",
            _combo(
                [
                    ("off", "none"),
                    ("FULL_SHARD", "full_shard"),
                    ("SHARD_GRAD_OP", "shard_grad_op"),
                    ("HYBRID_SHARD", "hybrid_shard"),
                ]
            ),
            "PyTorch FSDP sharding strategy (instead of ZeRO): FULL_SHARD gathers one unit at a time, "
            "SHARD_GRAD_OP keeps parameters gathered, HYBRID_SHARD shards within a node.",
        )
        self._row(
            f,
            "gpus_per_node",
            "GPUs per node",
            _spin(1, 4096, suffix=" GPUs"),
            "HYBRID_SHARD shards within a node of this many GPUs (1 to 4096).",
        )
        self.world_label = QLabel("")
        self.world_label.setObjectName("training_world")
        f.addRow("GPUs", self.world_label)
        outer.addWidget(g)

        # -- overheads
        g = QGroupBox("Overheads")
        f = QFormLayout(g)
        self._row(
            f,
            "cuda_context_mib",
            "CUDA context",
            _spin(0, 1 << 16, step=50, suffix=" MiB"),
            "Memory the CUDA context takes per process (0 to 65,536 MiB; ~300-600 MiB on recent drivers).",
        )
        outer.addWidget(g)
        outer.addStretch(1)

        for name, row in self._rows.items():
            if name == "lora_targets":
                assert isinstance(row.widget, QComboBox)
                row.widget.currentTextChanged.connect(lambda _t, w=row.widget: self._emit_changed(w))
            else:
                self._connect(row.widget)
        for name in ("method", "zero", "fsdp", "offload"):
            self.widget(name).currentIndexChanged.connect(self._update_visibility)  # type: ignore[attr-defined]
        for name in ("dp", "tp", "pp", "cp"):
            self.widget(name).valueChanged.connect(self._update_visibility)  # type: ignore[attr-defined]
        self.set_value(TrainingRun())

    def _row(self, layout: QFormLayout, name: str, label: str, widget: QWidget, tip: str) -> QWidget:
        self._layouts[name] = layout
        return self._add_row(layout, name, label, widget, tip)

    def _set_row_visible(self, name: str, visible: bool) -> None:
        self._layouts[name].setRowVisible(self._rows[name].label, visible)

    def row_visible(self, name: str) -> bool:
        """Whether field ``name`` is offered now (its group and its row are shown)."""
        row = self._rows[name]
        group = row.label.parentWidget()
        return not row.label.isHidden() and (group is None or not group.isHidden())

    def _update_visibility(self, *_: object) -> None:
        w = self.widget
        method = w("method").currentData()  # type: ignore[attr-defined]
        dp = w("dp").value()  # type: ignore[attr-defined]
        zero = w("zero").currentData()  # type: ignore[attr-defined]
        fsdp = w("fsdp").currentData()  # type: ignore[attr-defined]
        offload = w("offload").currentData()  # type: ignore[attr-defined]
        self._lora_group.setVisible(method in ("lora", "qlora"))
        self._set_row_visible("qlora_base", method == "qlora")
        sharding = dp > 1 or bool(zero)
        self._set_row_visible("offload", sharding or offload != "none")
        self._set_row_visible("fsdp", sharding or fsdp != "none")
        self._set_row_visible("gpus_per_node", fsdp == "hybrid_shard")
        world = dp * w("tp").value() * w("pp").value() * w("cp").value()  # type: ignore[attr-defined]
        self.world_label.setText(f"{world:,} (dp x tp x pp x cp)")

    # ---- the value contract --------------------------------------------------------------------------------

    _INTS = (
        "batch",
        "seq",
        "grad_accum",
        "lora_rank",
        "frozen_layers",
        "dp",
        "tp",
        "pp",
        "ep",
        "cp",
        "gpus_per_node",
        "cuda_context_mib",
    )
    _COMBOS = ("method", "precision", "optimizer", "attn", "qlora_base", "zero", "offload", "fsdp")

    def _fields(self) -> dict[str, object]:
        w = self.widget
        out: dict[str, object] = {}
        for name in self._INTS:
            out[name] = w(name).value()  # type: ignore[attr-defined]
        for name in self._COMBOS:
            out[name] = w(name).currentData()  # type: ignore[attr-defined]
        for name in ("grad_ckpt", "first_step"):
            out[name] = w(name).isChecked()  # type: ignore[attr-defined]
        out["lora_alpha"] = round(w("lora_alpha").value(), 4)  # type: ignore[attr-defined]
        out["lora_dropout"] = round(w("lora_dropout").value(), 4)  # type: ignore[attr-defined]
        dropout = w("dropout").value()  # type: ignore[attr-defined]
        out["dropout"] = None if dropout < 0 else round(dropout, 4)
        targets = w("lora_targets").currentText().strip()  # type: ignore[attr-defined]
        out["lora_targets"] = targets
        return out

    def value(self) -> TrainingRun:
        """The run the widgets describe. Raises :class:`GpumemInputError` (naming the field) when invalid."""
        try:
            return make_training_run(**self._fields())
        except GpumemInputError as e:
            if e.field is None or e.field not in self._rows:
                e.field = _field_from_message(e.message, list(self._rows)) or e.field
            raise

    def checked_value(self) -> TrainingRun | None:
        """:meth:`value`, with any problem shown inline instead of raised (errors cleared when valid)."""
        self.clear_errors()
        try:
            return self.value()
        except GpumemInputError as e:
            self.show_error(e.field, e.message)
            return None

    def set_value(self, run: TrainingRun) -> None:
        """Fill every widget from ``run``; emits no ``changed``."""
        w = self.widget
        with _blocked(self._all_widgets()):
            for name in self._INTS:
                w(name).setValue(getattr(run, name))  # type: ignore[attr-defined]
            for name in self._COMBOS:
                _combo_set(w(name), getattr(run, name))  # type: ignore[arg-type]
            w("grad_ckpt").setChecked(run.grad_ckpt)  # type: ignore[attr-defined]
            w("first_step").setChecked(run.first_step)  # type: ignore[attr-defined]
            w("lora_alpha").setValue(run.lora_alpha)  # type: ignore[attr-defined]
            w("lora_dropout").setValue(run.lora_dropout)  # type: ignore[attr-defined]
            w("dropout").setValue(DROPOUT_DEFAULT if run.dropout is None else run.dropout)  # type: ignore[attr-defined]
            targets = w("lora_targets")
            assert isinstance(targets, QComboBox)
            text = run.lora_targets if isinstance(run.lora_targets, str) else ",".join(run.lora_targets)
            with QSignalBlocker(targets):
                if not _combo_set(targets, text):
                    targets.setEditText(text)
        self._update_visibility()
        self.clear_errors()


# ---- presets -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainingPreset:
    name: str
    description: str
    run: TrainingRun
    gpu: GpuChoice | None = None


TRAINING_PRESETS: tuple[TrainingPreset, ...] = (
    TrainingPreset(
        "QLoRA on one 24 GB card",
        "QLoRA: nf4 + double quantization base, r 16 on all linears, paged AdamW 8-bit, gradient "
        "checkpointing, bf16, 2048-token sequences, micro-batch 1, on an RTX 4090",
        TrainingRun(
            method="qlora",
            qlora_base="nf4-dq",
            lora_rank=16,
            lora_targets="all-linear",
            optimizer="paged-adamw-8bit",
            grad_ckpt=True,
            precision="bf16",
            seq=2048,
            batch=1,
        ),
        GpuChoice(gpu_id="RTX-4090"),
    ),
    TrainingPreset(
        "full fine-tune with ZeRO-3",
        "Full fine-tune, mixed bf16, AdamW, DeepSpeed ZeRO-3 over 8 data-parallel ranks, gradient "
        "checkpointing, on 8 x H100",
        TrainingRun(
            method="full", precision="amp-bf16", optimizer="adamw", zero=3, dp=8, grad_ckpt=True, seq=2048
        ),
        GpuChoice(gpu_id="H100-SXM-80GB", count=8),
    ),
)
