"""The main window: model panel, run form and GPU target on the left, results in the middle, GPUs in a dock.

Layout and wiring only: the :class:`~gpumem_gui.ui.session.Session` owns the state between a form edit and the
chart and decides what to recompute; glue objects connect the forms (:mod:`~gpumem_gui.ui.form_glue`) and the
GPU panel (:mod:`~gpumem_gui.ui.gpu_glue`) to it, :mod:`~gpumem_gui.ui.presenter` draws what it hands over,
:mod:`~gpumem_gui.ui.menus` and :mod:`~gpumem_gui.ui.documents` hold the menus, files and exports.
Dependencies come in through the constructor (the settings store, the model loader); GPU snapshots through
:meth:`MainWindow.on_snapshot`, which the composition root connects to the poller's signal.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QEvent, QSettings, Qt, Signal, Slot
from PySide6.QtGui import QCloseEvent, QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import QDockWidget, QLabel, QMainWindow, QMessageBox, QSplitter, QWidget

from gpumem_gui.core import (
    Estimate,
    FitReport,
    GpumemError,
    InferenceRun,
    LoadedModel,
    SizeUnit,
    load_model,
)
from gpumem_gui.hardware.snapshot import GpuSnapshot
from gpumem_gui.ui import export
from gpumem_gui.ui.documents import Documents
from gpumem_gui.ui.form_glue import FormGlue
from gpumem_gui.ui.gpu_glue import SNAPSHOT_MIN_INTERVAL_MS, GpuGlue
from gpumem_gui.ui.gpu_panel import GpuPanel
from gpumem_gui.ui.menus import WindowMenus
from gpumem_gui.ui.messages import error_line, one_line
from gpumem_gui.ui.model_panel import Loader, ModelPanel
from gpumem_gui.ui.plan import AnyRun, Inputs
from gpumem_gui.ui.presenter import Presenter
from gpumem_gui.ui.results import ResultsView
from gpumem_gui.ui.run_form import RunForm
from gpumem_gui.ui.run_panel import RunPanel
from gpumem_gui.ui.scenario import CompareDialog, Scenario
from gpumem_gui.ui.session import Session
from gpumem_gui.ui.timing import DEBOUNCE_MS, STEP_DEBOUNCE_MS
from gpumem_gui.ui.train_form import TRAINING_PRESETS, TrainingForm

__all__ = ["DEBOUNCE_MS", "DEFAULT_MODEL", "STEP_DEBOUNCE_MS", "MainWindow"]

DEFAULT_MODEL = "meta-llama/Llama-3.1-8B"
DEFAULT_RUN = InferenceRun(seq=4096, new_tokens=512)
DEFAULT_TRAINING_RUN = TRAINING_PRESETS[0].run


class MainWindow(QMainWindow):
    """The gpumem window (see module docstring).

    Args:
        settings: where geometry, unit, recent files and the last scenario live (the app passes
            ``QSettings("gpumem", "gpumem")``; tests pass a file in a temporary folder).
        loader: ``load_model`` or a stand-in (tests).
        restore: restore geometry and the last scenario from ``settings``.
        dialogs: show message boxes (tests and the self-test turn them off; messages still go to
            :attr:`last_message` and the status bar).
        snapshot_interval_ms: draw GPU readings at most this often (every reading is still recorded);
            tests that feed readings back to back pass 0.

    Signals:
        estimate_updated(): a new estimate is on screen.
        background_done(): the fit report and the sweep for the current inputs are on screen.
    """

    estimate_updated = Signal()
    background_done = Signal()

    def __init__(
        self,
        *,
        settings: QSettings,
        loader: Loader = load_model,
        restore: bool = True,
        dialogs: bool = True,
        debounce_ms: int = DEBOUNCE_MS,
        snapshot_interval_ms: int = SNAPSHOT_MIN_INTERVAL_MS,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("gpumem")
        self.setObjectName("gpumem_main")
        self.setAcceptDrops(True)
        self.settings = settings
        self.dialogs = dialogs
        self.last_message = ""
        self.documents = Documents(self, settings)
        self.recent = self.documents.recent

        self.session = Session(self._read_inputs, debounce_ms=debounce_ms, parent=self)
        self._debounce = self.session.debounce  # tests and benchmarks/bench_ui.py tune the recompute timer
        self._build_widgets(loader)
        self._wire(snapshot_interval_ms)
        self.menus = WindowMenus(self)
        self.open_action, self.save_action = self.menus.open_action, self.menus.save_action
        self.export_action, self.recent_menu = self.menus.export_action, self.menus.recent_menu
        self.unit_actions = self.menus.unit_actions
        screen = self.screen().availableGeometry() if self.screen() else None
        self.resize(
            min(1600, screen.width()) if screen else 1600, min(1000, screen.height()) if screen else 1000
        )
        if restore:
            self.documents.restore_session()
            self.gpu_glue.cluster.restore()
        if self.model is None:
            self.run_form.set_value(DEFAULT_RUN)
            self.train_form.set_value(DEFAULT_TRAINING_RUN)
            self.model_panel.load_source(DEFAULT_MODEL)

    # ---- construction --------------------------------------------------------------------------------------

    def _build_widgets(self, loader: Loader) -> None:
        self.model_panel = ModelPanel(loader)
        self.run_panel = rp = RunPanel()
        self.run_form, self.train_form, self.target_form = rp.run_form, rp.train_form, rp.target_form
        self.presets, self.train_presets, self.mode_tabs = rp.presets, rp.train_presets, rp.mode_tabs
        self.results = ResultsView()
        self.gpu_panel = GpuPanel()

        left = QSplitter(Qt.Orientation.Vertical)
        left.addWidget(self.model_panel)
        left.addWidget(self.run_panel)
        left.setStretchFactor(0, 2)
        left.setStretchFactor(1, 3)
        left.setChildrenCollapsible(False)

        main = QSplitter(Qt.Orientation.Horizontal)
        main.setObjectName("main_splitter")
        main.addWidget(left)
        main.addWidget(self.results)
        main.setStretchFactor(0, 0)
        main.setStretchFactor(1, 1)
        main.setSizes([470, 830])
        main.setChildrenCollapsible(False)
        self.setCentralWidget(main)

        self.gpu_dock = QDockWidget("GPUs", self)
        self.gpu_dock.setObjectName("gpu_dock")
        self.gpu_dock.setWidget(self.gpu_panel)
        self.gpu_dock.setAllowedAreas(
            Qt.DockWidgetArea.LeftDockWidgetArea | Qt.DockWidgetArea.RightDockWidgetArea
        )
        self.gpu_panel.setMinimumWidth(300)
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.gpu_dock)

        self.timing = QLabel("")
        self.statusBar().addPermanentWidget(self.timing)

    def _wire(self, snapshot_interval_ms: int) -> None:
        """The glue between the panels and the session, and what the window itself listens to."""
        s, guard = self.session, self.guard
        self.gpu_glue = GpuGlue(
            self.gpu_panel,
            self.target_form,
            s,
            guard=guard,
            status=self.statusBar().showMessage,
            min_interval_ms=snapshot_interval_ms,
            settings=self.settings,
            parent=self,
        )
        self.form_glue = FormGlue(
            self.run_panel,
            self.results,
            s,
            guard=guard,
            notify=self.notify,
            show_model=self.model_panel.show_head,
            parent=self,
        )
        self.presenter = Presenter(
            s,
            self.results,
            self.target_form,
            self.gpu_glue,
            active_form=lambda: self.active_form,
            timing=self.timing,
            parent=self,
        )
        s.estimate_updated.connect(self.estimate_updated)
        s.background_done.connect(self.background_done)
        self.model_panel.model_loaded.connect(lambda m: guard(lambda: self._on_model_loaded(m)))
        self.model_panel.load_failed.connect(self.documents.model_failed)
        self.model_panel.open_requested.connect(lambda: guard(self.menus.open_dialog))

    # ---- small helpers ------------------------------------------------------------------------------------

    def guard(self, fn: Callable[[], object]) -> None:
        """Run a slot's body; an unexpected error becomes a message, never an exception out of the slot."""
        try:
            fn()
        except Exception as e:  # ours: one line; a bug: say so instead of leaving the window in a half state
            self.notify("gpumem" if isinstance(e, GpumemError) else "gpumem: unexpected error", error_line(e))

    def notify(self, title: str, text: str) -> None:
        """Tell the user (status bar, and a non-blocking message box when dialogs are on)."""
        self.last_message = text = one_line(text)  # every message the window shows is one line
        self.statusBar().showMessage(text, 10000)
        if self.dialogs:
            box = QMessageBox(QMessageBox.Icon.Warning, title, text, QMessageBox.StandardButton.Ok, self)
            box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
            box.open()

    def notify_info(self, text: str) -> None:
        self.last_message = text
        self.statusBar().showMessage(text, 8000)

    @property
    def estimate(self) -> Estimate | None:
        """The estimate on screen (the last good one)."""
        return self.session.estimate

    @property
    def report(self) -> FitReport | None:
        return self.session.report

    @property
    def run(self) -> AnyRun | None:
        return self.session.run

    @property
    def model(self) -> LoadedModel | None:
        return self.session.model

    @property
    def unit(self) -> SizeUnit:
        return self.session.unit

    @property
    def last_estimate_ms(self) -> float:
        return self.session.last_estimate_ms

    @property
    def last_background_ms(self) -> float:
        return self.session.last_background_ms

    @property
    def mode(self) -> str:
        """'train' when the Training tab is on top, else 'infer'."""
        return self.run_panel.mode

    def set_mode(self, mode: str) -> None:
        """Bring the Inference ('infer') or Training ('train') tab to the top (recomputes)."""
        self.run_panel.set_mode(mode)

    @property
    def active_form(self) -> RunForm | TrainingForm:
        return self.run_panel.active_form

    # ---- inputs -------------------------------------------------------------------------------------------

    def _read_inputs(self) -> Inputs:
        """The forms, for the session's recompute (the results name the sweep for the mode on top)."""
        self.results.set_mode(self.mode)
        return self.run_panel.inputs()

    def schedule(self, typing: bool = True) -> None:
        """Recompute after the debounce interval (restarted by every edit; short unless ``typing``)."""
        self.session.schedule(typing)

    @Slot()
    def recompute_now(self) -> None:
        """Estimate now (GUI thread), show it, then start the fit report and sweep in the worker."""
        self.session.recompute_now()

    def flush_background(self, timeout_ms: int = 10000) -> bool:
        """Start a delayed job now, wait for the worker and deliver its result (tests, export, self-test)."""
        return self.session.flush_background(timeout_ms)

    def apply_change(self, update: dict) -> None:
        """Apply one of the ranked changes to the run form (and the GPU count when it needs more GPUs)."""
        self.form_glue.apply_change(update)

    def set_unit(self, unit: SizeUnit) -> None:
        """Show every size in GiB or GB."""
        self.session.set_unit(unit)
        self.unit_actions[unit].setChecked(True)
        self.model_panel.set_unit(unit)
        self.target_form.set_unit(unit)
        self.gpu_panel.set_unit(unit)
        self.presenter.redraw()
        self.session.start_background()

    def event(self, event: QEvent) -> bool:
        if event.type() == QEvent.Type.UpdateRequest:  # a paint pass is about to run
            self.session.paint_pass()
        return super().event(event)

    # ---- GPU readings --------------------------------------------------------------------------------------

    @Slot(object)
    def on_snapshot(self, snap: GpuSnapshot) -> None:
        """A new reading from the poller (connected by the composition root); see :class:`GpuGlue`."""
        self.gpu_glue.on_snapshot(snap)

    @Slot(str)
    def on_gpu_error(self, reason: str) -> None:
        self.gpu_glue.on_gpu_error(reason)

    # ---- the model -----------------------------------------------------------------------------------------

    def load_source(self, source: str) -> bool:
        """Load a model (catalog id, local path, hub id); see :meth:`ModelPanel.load_source`."""
        return self.model_panel.load_source(source)

    def _on_model_loaded(self, m: LoadedModel) -> None:
        pending = self.documents.take_pending()
        self.form_glue.open_model(m, pending)  # its weight format and task head, or the scenario's
        self.setWindowTitle(f"{m.name} - gpumem")
        if pending is not None:
            self.results.set_mode(pending.mode)
            self.gpu_panel.set_basis(pending.gpu.basis)
            self.session.target_user_set = True
        self.run_panel.fit_to_model(m.spec if pending is None else None)
        if m.spec is None:
            self.results.show_unknown_architecture()
            return
        self.session.recompute_now()

    # ---- scenarios, export and copy (see Documents) ------------------------------------------------------

    @property
    def scenario_path(self) -> Path | None:
        """The scenario file last saved or opened (Save writes it again)."""
        return self.documents.scenario_path

    def current_scenario(self) -> Scenario | None:
        return self.documents.current_scenario()

    def save_scenario(self, path: Path | str) -> bool:
        return self.documents.save_scenario(path)

    def open_scenario(self, path: Path | str) -> bool:
        """Load a scenario file; a bad file or a model that cannot be loaded changes nothing."""
        return self.documents.open_scenario(path)

    def open_path(self, path: Path | str) -> bool:
        """Open a model file/folder, or a scenario JSON (recognised by its ``format``)."""
        return self.documents.open_path(path)

    def compare_files(self, a: Path | str | None, b: Path | str) -> CompareDialog:
        """Compare two scenario files (``a`` None: the current plan) in a dialog; raises on bad input."""
        return self.documents.compare_files(a, b)

    def export_report(self, base: Path | str) -> list[Path]:
        """Write ``base``.md (report), ``base``.png (charts) and ``base``.json (the plan as
        ``gpumem estimate --json`` prints it); returns the paths."""
        return self.documents.export_report(base)

    def command_line(self) -> str:
        """The ``gpumem estimate ...`` command that rebuilds the plan."""
        return export.command_line(self.model, self.run, self.target_form.value(), self.session.resolved)

    def runtime_flags_text(self) -> str:
        """The engine's command line, or the training arguments, this plan implies."""
        return export.runtime_flags_text(self.model, self.run, self.estimate)

    # ---- drag and drop -------------------------------------------------------------------------------------

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        urls = event.mimeData().urls() if event.mimeData().hasUrls() else []
        if urls and all(u.isLocalFile() for u in urls):
            event.acceptProposedAction()
        else:
            event.ignore()

    def dropEvent(self, event: QDropEvent) -> None:
        urls = [u for u in event.mimeData().urls() if u.isLocalFile()] if event.mimeData().hasUrls() else []
        if not urls:
            event.ignore()
            return
        event.acceptProposedAction()
        self.guard(lambda: self.open_path(urls[0].toLocalFile()))

    # ---- settings ------------------------------------------------------------------------------------------

    def save_settings(self) -> None:
        """Geometry, unit and the current scenario, for the next session."""
        self.documents.save_session()

    def shutdown(self) -> None:
        """Stop the workers (the composition root stops the poller)."""
        self.gpu_glue.shutdown()
        self.session.shutdown()
        self.model_panel.shutdown()

    def closeEvent(self, event: QCloseEvent) -> None:
        try:
            self.save_settings()
        finally:
            self.shutdown()
        super().closeEvent(event)
