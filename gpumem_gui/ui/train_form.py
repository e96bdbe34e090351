"""The Training tab: the training form, generated from :class:`TrainingRun`'s field declarations, and the
training presets.

Same contract as every run form (:mod:`gpumem_gui.ui.field_form`). Visibility comes from the declarations:
the LoRA group for ``lora``/``qlora``, the QLoRA base for ``qlora``, offload and FSDP once there is something
to shard (``dp > 1`` or a ZeRO stage, or when they already hold a non-default value), the GPUs per node for
FSDP ``hybrid_shard``. A hidden field keeps its value, so a run always round-trips. ``gpus`` is derived
(dp x tp x pp x cp) and shown as a label.
"""

from __future__ import annotations

from dataclasses import dataclass

from PySide6.QtWidgets import QLabel, QWidget

from gpumem_gui.core import TrainingRun, make_training_run
from gpumem_gui.ui.field_form import RunFieldsForm
from gpumem_gui.ui.target_form import GpuChoice


class TrainingForm(RunFieldsForm):
    """Every field of :class:`TrainingRun` but ``gpus`` (derived: dp x tp x pp x cp).

    Signals:
        changed(): any field was edited by the user (not emitted by :meth:`set_value`).
    """

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(TrainingRun, make_training_run, parent=parent)
        self.world_label = QLabel("")
        self.world_label.setObjectName("training_world")
        self._rows["dp"].layout.addRow("GPUs", self.world_label)
        self.set_value(TrainingRun())

    def _update_visibility(self) -> None:
        super()._update_visibility()
        if hasattr(self, "world_label"):
            v = self.raw_values()
            world = v["dp"] * v["tp"] * v["pp"] * v["cp"]
            self.world_label.setText(f"{world:,} (dp x tp x pp x cp)")


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
