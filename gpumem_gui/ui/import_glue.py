"""Bring your own command or config, in the window: Edit > Paste command… (a runtime's launch command), a
YAML/JSON/TOML training config dropped or opened, and Edit > Copy as (each runtime's own command for the run
on screen).

An import becomes a scenario (the model it names, or the one on screen when it names none, and the run) and
loads like a scenario file; how it was read (``read as`` lines, then the warnings) is kept in
:attr:`ImportGlue.last_lines`, shown in the status bar and, with dialogs on, in a window of its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Qt
from PySide6.QtGui import QAction
from PySide6.QtWidgets import (
    QApplication,
    QDialog,
    QDialogButtonBox,
    QLabel,
    QMenu,
    QPlainTextEdit,
    QVBoxLayout,
    QWidget,
)

from gpumem_gui.core import (
    RUNTIMES,
    GpumemError,
    GpumemInputError,
    ImportedRun,
    InferenceRun,
    TrainingRun,
    engine_kv_dtypes,
    estimate_inference,
    file_parsers,
    import_command,
    import_file,
    make_run,
    read_config,
)
from gpumem_gui.ui.messages import error_line
from gpumem_gui.ui.scenario import ModelRef, Scenario, looks_like_scenario

if TYPE_CHECKING:
    from gpumem_gui.ui.main_window import MainWindow

CONFIG_SUFFIXES = (".yaml", ".yml", ".toml", ".json")
PASTE_HINT = (
    "vllm serve Qwen/Qwen3-8B -tp 2 --max-model-len 32768\n"
    "llama-server -m model.gguf -c 8192 -ngl 99 -np 4\n"
    "python -m sglang.launch_server --model-path ... / OLLAMA_NUM_PARALLEL=4 ollama run llama3.1:8b"
)


def is_training_config(path: Path | str) -> bool:
    """A file one of the config readers takes (a model's own config.json and scenarios are not)."""
    p = Path(path)
    if p.suffix.lower() not in CONFIG_SUFFIXES or not p.is_file() or looks_like_scenario(p):
        return False
    if p.suffix.lower() != ".json":
        return True
    try:
        data = read_config(str(p))
    except GpumemError:
        return False
    return any(parser.matches(data, str(p)) for parser in file_parsers())


class PasteDialog(QDialog):
    """A text box for a launch command; ``accepted`` with :attr:`text`."""

    def __init__(self, parent: QWidget) -> None:
        super().__init__(parent)
        self.setWindowTitle("Paste a launch command")
        layout = QVBoxLayout(self)
        layout.addWidget(
            QLabel("A runtime's launch command (vLLM, SGLang, llama.cpp, Ollama), as you run it:")
        )
        self.edit = QPlainTextEdit()
        self.edit.setPlaceholderText(PASTE_HINT)
        self.edit.setMinimumSize(640, 140)
        layout.addWidget(self.edit)
        buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
        )
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)

    @property
    def text(self) -> str:
        return self.edit.toPlainText()


class ImportGlue(QObject):
    """The window's imports and its Copy as menu."""

    def __init__(self, window: MainWindow) -> None:
        super().__init__(window)
        self.window = window
        self.last_import: ImportedRun | None = None
        self.last_lines: list[str] = []

    # ---- importing ------------------------------------------------------------------------------------

    def paste_dialog(self) -> None:
        dialog = PasteDialog(self.window)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.accepted.connect(lambda: self.window.guard(lambda: self.apply_command(dialog.text)))
        dialog.open()

    def apply_command(self, text: str) -> bool:
        """Read a launch command and put its model and run on screen; a bad command changes nothing."""
        return self._apply(import_command(text))

    def apply_file(self, path: Path | str) -> bool:
        """Read a training config (torchtune, Axolotl, LLaMA-Factory, DeepSpeed, accelerate, Trainer/TRL,
        torchtitan) and put its run on screen."""
        return self._apply(import_file(str(path)))

    def _apply(self, imp: ImportedRun) -> bool:
        w = self.window
        source = imp.model or (w.model.source if w.model is not None else None)
        if source is None:
            why = "".join(f" ({w})" for w in imp.no_model)
            raise GpumemInputError(
                f"the {imp.source} names no model{why}: pick a model first, then import it again"
            )
        run = imp.run
        panel = w.model_panel
        if panel.is_local_or_catalog(source):
            loaded = panel.try_load(source)
            if loaded.spec is not None:
                imp = imp.with_model(loaded.spec, loaded.checkpoint_quantization)
                run = imp.run
            if isinstance(run, InferenceRun) and "weights" not in run.model_fields_set:
                # as the CLI: the files' own bytes, else the checkpoint's format as published
                run = make_run(**_set_fields(run), weights=loaded.default_weights)
        current = w.current_scenario()
        gpu = current.gpu if current is not None else Scenario.model_fields["gpu"].default
        gpus = run.world if isinstance(run, TrainingRun) else run.gpus
        extra = [] if imp.model else [f"model: {source} (the one on screen)"]
        if gpu.kind != "local" and gpus > gpu.count:  # the target takes the GPUs the run spans
            gpu = gpu.model_copy(update={"count": gpus})
            extra.append(f"GPU count: {gpus} (the run's GPUs)")
        if isinstance(run, TrainingRun):
            infer = current.run if current is not None else InferenceRun()
            sc = Scenario(model=ModelRef(source=source), mode="train", run=infer, training=run, gpu=gpu)
        else:
            training = current.training if current is not None else None
            sc = Scenario(model=ModelRef(source=source), mode="infer", run=run, training=training, gpu=gpu)
        self.last_import = imp
        self.last_lines = imp.lines() + extra
        if not w.documents.apply_scenario(sc):
            return False
        n = len(imp.warnings)
        w.notify_info(f"Imported the {imp.source}: {len(imp.read_as)} settings read, {n} warning(s)")
        if w.dialogs:
            self._show_lines(imp.source)
        return True

    def _show_lines(self, title: str) -> None:
        dialog = QDialog(self.window)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.setWindowTitle(f"Read as: {title}")
        layout = QVBoxLayout(dialog)
        text = QPlainTextEdit("\n".join(self.last_lines))
        text.setReadOnly(True)
        text.setMinimumSize(760, 320)
        layout.addWidget(text)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(dialog.close)
        layout.addWidget(buttons)
        dialog.open()

    # ---- Copy as -------------------------------------------------------------------------------------------

    def commands(self) -> list[tuple[str, str | None, str]]:
        """(label, command or None, why not) for each runtime, for the run on screen; a training run has its
        Trainer arguments only."""
        w = self.window
        if w.model is None or w.run is None or w.estimate is None:
            return []
        if isinstance(w.run, TrainingRun):
            return [("Hugging Face TrainingArguments", w.runtime_flags_text(), "")]
        out: list[tuple[str, str | None, str]] = []
        m = w.model
        resolved = w.session.resolved
        capacity = resolved.target.capacity_bytes if resolved is not None else None
        for name, rt in RUNTIMES.items():
            label = f"{rt.label or name} command"
            try:
                run = make_run(**{**_set_fields(w.run), "engine": name})
                if run.kv_dtype != "auto" and run.kv_dtype not in engine_kv_dtypes(name):
                    raise GpumemInputError(f"{rt.label or name} has no {run.kv_dtype} KV cache")
                why = None if m.spec is None else rt.expresses(m.spec, run, m.source, m.checkpoint_weights)
                if why is not None:  # the engine cannot load this model in this format
                    out.append((label, None, why))
                    continue
                # the command's defaults (vLLM's max_model_len, SGLang's fraction, Ollama's context) are that
                # engine's, from its own estimate of the run, on the same GPU
                est = w.estimate
                if m.spec is not None and name != w.run.engine:
                    est = estimate_inference(m.spec, run, capacity, m.weights)
                out.append((label, rt.command(m.source, run, est), ""))
            except (GpumemError, ValueError) as e:
                out.append((label, None, error_line(e)))
        return out

    def fill_copy_menu(self, menu: QMenu) -> None:
        """Rebuild Edit > Copy as for the run on screen (when the menu opens)."""
        menu.clear()
        entries = self.commands()
        if not entries:
            menu.addAction("(no plan yet)").setEnabled(False)
        for label, text, why in entries:
            action: QAction = menu.addAction(label)
            if text is None:
                action.setEnabled(False)
                action.setToolTip(why)
            else:
                action.triggered.connect(lambda _c=False, t=text, lb=label: self.copy(t, lb))
        menu.setToolTipsVisible(True)

    def copy(self, text: str, label: str) -> None:
        QApplication.clipboard().setText(text)
        self.window.statusBar().showMessage(f"Copied the {label}", 4000)


def _set_fields(run: Any) -> dict[str, Any]:
    return {k: getattr(run, k) for k in run.model_fields_set}
