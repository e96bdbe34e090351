"""The run side of the window: the GPU target above the Inference and Training tabs, each tab a preset picker
over its form.

It reads the forms into the session's :class:`~gpumem_gui.ui.plan.Inputs` (and a :class:`Scenario`), and
writes presets, ranked changes and scenarios back into them. It decides nothing about the plan: the window
tells the session when to recompute.
"""

from __future__ import annotations

from PySide6.QtCore import QSignalBlocker, Qt
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QScrollArea, QTabWidget, QVBoxLayout, QWidget

from gpumem_gui.core import (
    GpumemInputError,
    InferenceRun,
    LoadedModel,
    ModelSpec,
    TaskHead,
    TrainingRun,
    make_task_head,
    model_kinds,
)
from gpumem_gui.ui.calibration_row import CalibrationRow
from gpumem_gui.ui.field_form import RunFieldsForm
from gpumem_gui.ui.plan import AnyRun, Inputs, run_gpus
from gpumem_gui.ui.run_form import FILE_WEIGHTS, PRESETS, RunForm
from gpumem_gui.ui.scenario import ModelRef, Scenario
from gpumem_gui.ui.target_form import GpuChoice, TargetForm
from gpumem_gui.ui.train_form import TRAINING_PRESETS, TrainingForm


def preset_combo(presets: tuple) -> QComboBox:
    """A list of named starting points, its first entry a prompt."""
    combo = QComboBox()
    combo.addItem("Start from a preset…", None)
    for p in presets:
        combo.addItem(p.name, p.name)
        combo.setItemData(combo.count() - 1, p.description, Qt.ItemDataRole.ToolTipRole)
    combo.setToolTip("Named starting points; they replace the run settings (and a catalog GPU target)")
    return combo


def _tab(presets: QComboBox, form: QWidget) -> QScrollArea:
    page = QWidget()
    v = QVBoxLayout(page)
    v.setContentsMargins(4, 4, 4, 4)
    row = QHBoxLayout()
    row.addWidget(QLabel("Preset:"))
    row.addWidget(presets, 1)
    v.addLayout(row)
    v.addWidget(form)
    scroll = QScrollArea()
    scroll.setWidgetResizable(True)
    scroll.setWidget(page)
    scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
    return scroll


class RunPanel(QWidget):
    """The target form and the mode tabs (see module docstring); the window connects their signals."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.run_form = RunForm()
        self.train_form = TrainingForm()
        self.target_form = TargetForm()
        self.calibration_row = CalibrationRow()  # the saved calibration the target's GPU gets, if any
        self.task_form = RunFieldsForm(TaskHead, make_task_head)  # an encoder's head: shown for encoders
        self.task_form.setVisible(False)
        self.presets = preset_combo(PRESETS)
        self.train_presets = preset_combo(TRAINING_PRESETS)
        self.mode_tabs = QTabWidget()
        self.mode_tabs.addTab(_tab(self.presets, self.run_form), "Inference")
        self.mode_tabs.addTab(_tab(self.train_presets, self.train_form), "Training")
        self.mode_tabs.setTabToolTip(0, "Serving / generation memory: weights, KV cache, activations")
        self.mode_tabs.setTabToolTip(
            1, "Training memory: parameters, gradients, optimizer states, activations, per phase"
        )
        self._file_weights = False
        self._encoder = False  # the model opened is an encoder: its task head form is shown
        self._chosen_weights: str | None = None  # what the user picked, for the next model it applies to
        # the lengths an encoder capped (the user's, before) and what it capped them to: given back to the
        # next model that takes them, unless the user changed the capped values meanwhile
        self._uncapped: tuple[tuple[int, int, int], tuple[int, int, int]] | None = None
        v = QVBoxLayout(self)
        v.setContentsMargins(0, 0, 0, 0)
        v.addWidget(self.target_form)
        v.addWidget(self.calibration_row)
        v.addWidget(self.task_form)
        v.addWidget(self.mode_tabs, 1)

    # ---- reading -------------------------------------------------------------------------------------------

    @property
    def mode(self) -> str:
        """'train' when the Training tab is on top, else 'infer'."""
        return "train" if self.mode_tabs.currentIndex() == 1 else "infer"

    def set_mode(self, mode: str) -> None:
        self.mode_tabs.setCurrentIndex(1 if mode == "train" else 0)

    @property
    def active_form(self) -> RunForm | TrainingForm:
        return self.train_form if self.mode == "train" else self.run_form

    def inputs(self) -> Inputs:
        """The active form's run (None when invalid: the form shows why) and the target choice."""
        run, choice = self.active_form.checked_value(), self.target_form.value()
        return Inputs(self.mode, run, choice, self.calibration_row.calibrations)

    def task_head(self) -> TaskHead | None:
        """The encoder task head the form names (every field given: the model's own head when opened), or
        None when a field is bad (the form shows why); a model that is no encoder gets the empty head."""
        return self.task_form.checked_value() if self._encoder else TaskHead()

    def scenario(self, source: str, last_run: AnyRun | None) -> Scenario | None:
        """The forms as a scenario for the model ``source``; a form with an error gives ``last_run`` when that
        is its kind (None when the active one has neither)."""
        try:
            run = self.run_form.value()
        except GpumemInputError:
            run = last_run if isinstance(last_run, InferenceRun) else None
        try:
            training = self.train_form.value()
        except GpumemInputError:
            training = last_run if isinstance(last_run, TrainingRun) else None
        if run is None and self.mode == "infer":
            return None
        if training is None and self.mode == "train":
            return None
        task = self.task_head() if self._encoder else None
        return Scenario(
            model=ModelRef(source=source, task=task),
            mode=self.mode,  # type: ignore[arg-type]
            run=run or InferenceRun(),
            training=training,
            gpu=self.target_form.value(),
        )

    # ---- writing -------------------------------------------------------------------------------------------

    def show_task_head(self, spec: ModelSpec | None) -> None:
        """Offer the task head form for an encoder only, filled with the head and labels its config names."""
        self._encoder = spec is not None and spec.encoder is not None
        self.task_form.setVisible(self._encoder)
        self.task_form.set_value(TaskHead.of(spec) if spec is not None else TaskHead())

    def offer_fields_of(self, spec: ModelSpec | None) -> None:
        """The run forms offer the fields the model opened can use, as their declarations say (images and
        their size: a model whose vision tower or cross-attention layers take them)."""
        self.run_form.set_model(spec)
        self.train_form.set_model(spec)

    def set_file_weights_available(self, available: bool) -> None:
        """The model was (not) opened from weight files: offer them as a weight format."""
        self._file_weights = available
        self.run_form.set_file_weights_available(available)

    def note_chosen_weights(self, previous: LoadedModel | None) -> None:
        """Before the next model is opened: remember the format the user chose for the ``previous`` one (the
        form's format when it is not that model's own). A form holding a plain model's own bf16 chose nothing;
        one holding a published format (the files, a quantized checkpoint) keeps the choice made before it."""
        weights = self.run_form.raw_values()["weights"]
        if previous is None or weights is None:
            return
        if weights != previous.default_weights:
            self._chosen_weights = weights
        elif previous.published_weights is None:
            self._chosen_weights = None

    def adopt_weights(self, model: LoadedModel) -> None:
        """A model was opened: its own published format (its files, its quantization_config) if it has one,
        else the format the user chose (it applies to any checkpoint published unquantized), else bf16."""
        chosen = self._chosen_weights if self._chosen_weights != FILE_WEIGHTS else None
        weights = model.published_weights or chosen or model.default_weights
        run = self.run_form.value() if not self.run_form.has_errors() else InferenceRun()
        if run.weights != weights:
            self.run_form.set_value(run.model_copy(update={"weights": weights}))

    def fit_to_model(self, spec: ModelSpec | None) -> None:
        """An encoder (BERT, RoBERTa, ...) generates nothing and reads at most its position table: new tokens
        0 and sequences capped at ``max_position_embeddings``, so that opening one from a decoder's settings
        (a 4,096-token prompt and 512 new tokens) shows its estimate instead of an error. BART's encoder and
        decoder each stop at their learned position table too: both lengths are capped at it."""
        if spec is None:
            return
        learned = (
            spec.seq2seq is not None and spec.seq2seq.block == "bart"
        )  # BART: learned positions per stack
        run = self.run_form.value() if not self.run_form.has_errors() else InferenceRun()
        train = self.train_form.value() if not self.train_form.has_errors() else TrainingRun()
        now = (run.seq, run.new_tokens, train.seq)
        if model_kinds(spec).model != "encoder" and not learned:
            # a model that takes any length: the lengths an encoder capped come back, as the user had them
            if self._uncapped is not None and self._uncapped[1] == now:
                seq, new_tokens, train_seq = self._uncapped[0]
                self.run_form.set_value(run.model_copy(update={"seq": seq, "new_tokens": new_tokens}))
                self.train_form.set_value(train.model_copy(update={"seq": train_seq}))
            self._uncapped = None
            return
        cap = spec.max_position_embeddings
        capped = (min(run.seq, cap), min(run.new_tokens, cap) if learned else 0, min(train.seq, cap))
        self.run_form.set_value(run.model_copy(update={"seq": capped[0], "new_tokens": capped[1]}))
        self.train_form.set_value(train.model_copy(update={"seq": capped[2]}))
        if capped != now:  # the user's lengths before the first cap are the ones to give back
            before = self._uncapped[0] if self._uncapped is not None and self._uncapped[1] == now else now
            self._uncapped = (before, capped)

    def apply_preset(self, index: int) -> bool:
        """Fill the Inference form from the preset at ``index`` of its list; False when it is none."""
        name = self.presets.itemData(index)
        self.presets.setCurrentIndex(0)
        preset = next((p for p in PRESETS if p.name == name), None)
        if preset is None:
            return False
        run = preset.run
        if run.weights == FILE_WEIGHTS and not self._file_weights:
            run = run.model_copy(update={"weights": "bf16"})
        self.run_form.set_value(run)
        self._preset_target(preset.gpu)
        return True

    def apply_training_preset(self, index: int) -> bool:
        """Fill the Training form from the preset at ``index`` of its list; False when it is none."""
        name = self.train_presets.itemData(index)
        self.train_presets.setCurrentIndex(0)
        preset = next((p for p in TRAINING_PRESETS if p.name == name), None)
        if preset is None:
            return False
        self.train_form.set_value(preset.run)
        self._preset_target(preset.gpu)
        return True

    def _preset_target(self, gpu: GpuChoice | None) -> None:
        """A preset's GPU replaces a catalog target (keeping its margin), never a local one."""
        current = self.target_form.value()
        if gpu is not None and current.kind == "catalog":
            self.target_form.set_value(gpu.model_copy(update={"margin_mib": current.margin_mib}))

    def apply_run(self, run: AnyRun) -> None:
        """Put ``run`` in its form, and raise the GPU count when it needs more GPUs (local GPUs: an error says
        so when there are not that many)."""
        if isinstance(run, TrainingRun):
            self.train_form.set_value(run)
        else:
            self.run_form.set_value(run)
        choice = self.target_form.value()
        if run_gpus(run) > choice.count:
            self.target_form.set_value(choice.model_copy(update={"count": run_gpus(run)}))

    def apply_scenario(self, sc: Scenario) -> None:
        """The scenario's runs, mode (without the tab-change signal) and GPU target; its weight format
        replaces any chosen before (the next model reads the choice from the form)."""
        self._chosen_weights = None
        self._uncapped = None  # the scenario's lengths are the user's
        if sc.model.task is not None and self._encoder:
            self.task_form.set_value(sc.model.task)
        self.run_form.set_value(sc.run)
        if sc.training is not None:
            self.train_form.set_value(sc.training)
        with QSignalBlocker(self.mode_tabs):
            self.set_mode(sc.mode)
        self.target_form.set_value(sc.gpu)
