"""The main window: model panel, run form and GPU target on the left, results in the middle, GPUs in a dock.

It wires the panels to each other and to the core, and nothing more: every number comes from
``estimate_inference`` / ``estimate_training``, ``verdicts`` and ``fit_report`` / ``fit_training``. The
Inference and Training tabs each hold a form; the tab on top decides which estimate is shown. Dependencies
come in through the constructor (the settings store, the model loader); GPU snapshots come in through
:meth:`MainWindow.on_snapshot`, which the composition root connects to the poller's signal.

Every edit restarts a single-shot timer: 120 ms while typing into a text field, 20 ms for a step, a number
entered with Enter, a pick from a list or a click (so a burst of wheel steps still makes one estimate). When
it fires, one estimate runs in the GUI thread (a few ms for inference; 1-200 ms for training, which replays
one step) and the charts, table and verdicts update; once that is painted, the fit report and the sweep
(inference: 48 points, ~50-300 ms; training: 16 points and the training solvers, 1-5 s) run in a worker
thread and only the newest answer is shown (the worker holds the GIL while it runs: started before the paint,
it would slow the paint down, the first one at start-up included). Invalid input shows inline and the last
good estimate stays.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from PySide6.QtCore import (
    QBuffer,
    QByteArray,
    QEvent,
    QIODevice,
    QSettings,
    QSignalBlocker,
    Qt,
    QTimer,
    Signal,
    Slot,
)
from PySide6.QtGui import QAction, QActionGroup, QCloseEvent, QDragEnterEvent, QDropEvent, QKeySequence
from PySide6.QtWidgets import (
    QApplication,
    QComboBox,
    QDockWidget,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QMessageBox,
    QScrollArea,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from gpumem_gui import __version__
from gpumem_gui.core import (
    Estimate,
    FitReport,
    GpumemError,
    GpumemInputError,
    GpuTarget,
    InferenceRun,
    LoadedModel,
    ModelSpec,
    SizeUnit,
    SweepPoint,
    TrainingRun,
    Verdict,
    estimate_any,
    estimate_inference,
    find_gpu,
    fit_report,
    fit_training,
    fmt_bytes,
    load_model,
    sweep,
    verdicts,
)
from gpumem_gui.hardware.snapshot import GpuDevice, GpuSnapshot
from gpumem_gui.ui.gpu_panel import GpuPanel
from gpumem_gui.ui.model_panel import Loader, ModelPanel
from gpumem_gui.ui.report import (
    atomic_write,
    cli_command,
    markdown_report,
    plan_json,
    runtime_flags,
    training_runtime_flags,
    worst_verdict,
)
from gpumem_gui.ui.results import ResultsView
from gpumem_gui.ui.run_form import FILE_WEIGHTS, PRESETS, RunForm
from gpumem_gui.ui.scenario import (
    CompareDialog,
    ModelRef,
    RecentFiles,
    Scenario,
    ScenarioError,
    Side,
    looks_like_scenario,
    read_scenario,
    save_scenario,
    scenario_from_json,
)
from gpumem_gui.ui.target_form import ResolvedTarget, TargetForm, resolve_target
from gpumem_gui.ui.train_form import TRAINING_PRESETS, TrainingForm
from gpumem_gui.ui.workers import BackgroundRunner

DEBOUNCE_MS = 120  # while typing into a field: one estimate when the keys stop
STEP_DEBOUNCE_MS = 20  # a spin-box step, a pick from a list, a click: at once (a wheel burst still merges)
BACKGROUND_DELAY_MS = 10  # after the paint that shows the estimate
BACKGROUND_FALLBACK_MS = 250  # when no paint comes (a hidden window, nothing on screen changed)
# GPU readings are drawn at most this often, whatever the poll interval: a throttle (qutebrowser-style), the
# newest reading wins and every reading still enters the sparkline history. Without it a fast poll (--poll-ms
# 50 with 8 GPUs) costs more GUI time per reading than the interval and the queued readings pile up.
SNAPSHOT_MIN_INTERVAL_MS = 250
SWEEP_POINTS = 48
TRAINING_SWEEP_POINTS = 16  # a training estimate replays a whole step: fewer points, same curve
DEFAULT_MODEL = "meta-llama/Llama-3.1-8B"
DEFAULT_RUN = InferenceRun(seq=4096, new_tokens=512)
DEFAULT_TRAINING_RUN = TRAINING_PRESETS[0].run
AnyRun = InferenceRun | TrainingRun


def run_gpus(run: AnyRun) -> int:
    """GPUs the run occupies: tp x pp for inference, dp x tp x pp x cp for training."""
    return run.world if isinstance(run, TrainingRun) else run.gpus


def sweep_xs(spec: ModelSpec, run: AnyRun, over: str) -> list[int]:
    """The swept values: evenly up to a sensible maximum (training replays a whole step: fewer points)."""
    training = isinstance(run, TrainingRun)
    n = TRAINING_SWEEP_POINTS if training else SWEEP_POINTS
    if over == "batch":
        hi = max(2 * run.batch, 16 if training else 32)
    elif training:
        hi = max(2 * run.seq, min(spec.max_position_embeddings, 32768))
    else:
        hi = max(2 * run.seq, spec.max_position_embeddings)
    return sorted({max(1, round(hi * (i + 1) / n)) for i in range(n)})


class Debounce(QTimer):
    """The single-shot timer behind every recompute. :meth:`restart` waits ``typing_ms`` after a key typed
    into a field and ``step_ms`` after any other change. :meth:`setInterval` sets the typing wait, and the
    step wait never exceeds it: ``setInterval(0)`` turns both off (benchmarks/bench_ui.py does that)."""

    def __init__(self, typing_ms: int, step_ms: int, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setSingleShot(True)
        self.typing_ms = typing_ms
        self.step_ms = min(step_ms, typing_ms)
        super().setInterval(typing_ms)

    def setInterval(self, msec: int) -> None:
        self.typing_ms = msec
        self.step_ms = min(self.step_ms, msec)
        super().setInterval(msec)

    def restart(self, typing: bool = True) -> None:
        self.start(self.typing_ms if typing else self.step_ms)


@dataclass(frozen=True)
class BackgroundResult:
    report: FitReport | None
    report_error: str | None
    over: str
    points: list[SweepPoint]
    seconds: float
    serial: int = 0  # the window's input serial when the job was made (see MainWindow._inputs_serial)


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
        self.recent = RecentFiles(settings)
        self.dialogs = dialogs
        self.unit = SizeUnit.GIB
        self.last_message = ""
        self.scenario_path: Path | None = None

        self._model: LoadedModel | None = None
        self._run: AnyRun | None = None
        self._est: Estimate | None = None
        self._fit: FitReport | None = None
        self._resolved: ResolvedTarget | None = None
        self._snapshot: GpuSnapshot | None = None
        self._target_user_set = False
        self._pending_scenario: Scenario | None = None
        self._capacity_cache: dict[tuple[int, int], Estimate] = {}
        self._sweep_over = "seq"
        self.last_estimate_ms = 0.0
        self.last_background_ms = 0.0

        self._debounce = Debounce(debounce_ms, STEP_DEBOUNCE_MS, self)
        self._debounce.timeout.connect(self._on_debounce)
        # bumped by every recompute except a refresh for new free-memory readings; a fit report made for the
        # same serial is still worth showing when a refresh superseded it (busy GPUs change every poll)
        self._inputs_serial = 0
        self._refresh_pending = False
        self._refreshing = False
        # the worker starts a moment after the estimate is painted, so the paint does not wait for the GIL:
        # the window's next paint pass (UpdateRequest) arms _bg_painted, which fires once that pass is over
        # and shortens _bg_delay; without a paint, _bg_delay fires after the fallback interval
        self._bg_delay = QTimer(self)
        self._bg_delay.setSingleShot(True)
        self._bg_delay.setInterval(BACKGROUND_FALLBACK_MS)
        self._bg_delay.timeout.connect(self._start_background)
        self._bg_wait_paint = False
        self._bg_painted = QTimer(self)
        self._bg_painted.setSingleShot(True)
        self._bg_painted.setInterval(0)
        self._bg_painted.timeout.connect(self._on_painted)
        self._snapshot_interval_ms = snapshot_interval_ms
        self._pending_snapshot: GpuSnapshot | None = None
        self._snapshot_shown_at: float | None = None  # time.monotonic() of the last drawn reading
        self._snapshot_timer = QTimer(self)
        self._snapshot_timer.setSingleShot(True)
        self._snapshot_timer.timeout.connect(self._show_pending_snapshot)
        self._bg = BackgroundRunner("fit-and-sweep", 1, self)
        self._bg.finished.connect(self._on_background_finished)
        self._bg.failed.connect(self._on_background_failed)

        self._build_widgets(loader)
        self._build_menus()
        self._connect()
        screen = self.screen().availableGeometry() if self.screen() else None
        self.resize(
            min(1600, screen.width()) if screen else 1600, min(1000, screen.height()) if screen else 1000
        )
        if restore:
            self._restore()
        if self._model is None:
            self.run_form.set_value(DEFAULT_RUN)
            self.train_form.set_value(DEFAULT_TRAINING_RUN)
            self.model_panel.load_source(DEFAULT_MODEL)

    # ---- construction --------------------------------------------------------------------------------------

    def _build_widgets(self, loader: Loader) -> None:
        self.model_panel = ModelPanel(loader)
        self.run_form = RunForm()
        self.train_form = TrainingForm()
        self.target_form = TargetForm()
        self.results = ResultsView()
        self.gpu_panel = GpuPanel()
        self.gpu_panel.set_evaluator(self._evaluate_device)

        def preset_combo(presets: tuple) -> QComboBox:
            combo = QComboBox()
            combo.addItem("Start from a preset…", None)
            for p in presets:
                combo.addItem(p.name, p.name)
                combo.setItemData(combo.count() - 1, p.description, Qt.ItemDataRole.ToolTipRole)
            combo.setToolTip(
                "Named starting points; they replace the run settings (and a catalog GPU target)"
            )
            return combo

        def tab(presets: QComboBox, form: QWidget) -> QScrollArea:
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

        self.presets = preset_combo(PRESETS)
        self.train_presets = preset_combo(TRAINING_PRESETS)
        self.mode_tabs = QTabWidget()
        self.mode_tabs.addTab(tab(self.presets, self.run_form), "Inference")
        self.mode_tabs.addTab(tab(self.train_presets, self.train_form), "Training")
        self.mode_tabs.setTabToolTip(0, "Serving / generation memory: weights, KV cache, activations")
        self.mode_tabs.setTabToolTip(
            1, "Training memory: parameters, gradients, optimizer states, activations, per phase"
        )

        run_box = QWidget()
        rv = QVBoxLayout(run_box)
        rv.setContentsMargins(0, 0, 0, 0)
        rv.addWidget(self.target_form)
        rv.addWidget(self.mode_tabs, 1)

        left = QSplitter(Qt.Orientation.Vertical)
        left.addWidget(self.model_panel)
        left.addWidget(run_box)
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

    def _action(
        self, text: str, slot: Callable[[], object], shortcut: QKeySequence | str | None = None
    ) -> QAction:
        action = QAction(text, self)
        if shortcut is not None:
            action.setShortcut(QKeySequence(shortcut))
        action.triggered.connect(lambda _checked=False: self._guard(slot))
        return action

    def _build_menus(self) -> None:
        bar = self.menuBar()
        file = bar.addMenu("&File")
        self.open_action = self._action(
            "&Open model or scenario…", self.open_dialog, QKeySequence.StandardKey.Open
        )
        file.addAction(self.open_action)
        file.addAction(self._action("Open model &folder…", self.open_folder_dialog))
        file.addSeparator()
        self.save_action = self._action("&Save scenario", self.save_dialog, QKeySequence.StandardKey.Save)
        file.addAction(self.save_action)
        file.addAction(
            self._action("Save scenario &as…", self.save_as_dialog, QKeySequence.StandardKey.SaveAs)
        )
        self.recent_menu = file.addMenu("&Recent scenarios")
        self.recent_menu.aboutToShow.connect(self._fill_recent_menu)
        file.addAction(self._action("&Compare scenarios…", self.compare_dialog))
        file.addSeparator()
        self.export_action = self._action("&Export report…", self.export_dialog, "Ctrl+E")
        file.addAction(self.export_action)
        file.addSeparator()
        file.addAction(self._action("&Quit", self.close, QKeySequence.StandardKey.Quit))

        edit = bar.addMenu("&Edit")
        edit.addAction(self._action("Copy &gpumem command", self.copy_command, "Ctrl+Shift+C"))
        edit.addAction(self._action("Copy &runtime flags", self.copy_runtime_flags))

        view = bar.addMenu("&View")
        units = view.addMenu("&Units")
        group = QActionGroup(self)
        self.unit_actions: dict[SizeUnit, QAction] = {}
        for unit, text in ((SizeUnit.GIB, "GiB (2^30 bytes)"), (SizeUnit.GB, "GB (10^9 bytes)")):
            a = QAction(text, self, checkable=True)
            a.setChecked(unit is self.unit)
            a.triggered.connect(lambda _c=False, u=unit: self.set_unit(u))
            group.addAction(a)
            units.addAction(a)
            self.unit_actions[unit] = a
        view.addAction(self.gpu_dock.toggleViewAction())

        helpm = bar.addMenu("&Help")
        helpm.addAction(self._action("&About gpumem", self._about))

    def _connect(self) -> None:
        self.model_panel.model_loaded.connect(lambda m: self._guard(lambda: self._on_model_loaded(m)))
        self.model_panel.load_failed.connect(self._on_model_failed)
        self.model_panel.open_requested.connect(lambda: self._guard(self.open_dialog))
        self.run_form.changed.connect(lambda: self.schedule(self.run_form.typing))
        self.train_form.changed.connect(lambda: self.schedule(self.train_form.typing))
        self.mode_tabs.currentChanged.connect(lambda _i: self._guard(self._on_mode_changed))
        self.train_presets.activated.connect(lambda i: self._guard(lambda: self._on_training_preset(i)))
        self.target_form.changed.connect(self._on_target_edited)
        # every slot body that is more than a one-liner runs under _guard: nothing raises out of a slot
        self.results.apply_requested.connect(lambda upd: self._guard(lambda: self.apply_change(upd)))
        self.results.sweep_over_changed.connect(lambda over: self._guard(lambda: self._on_sweep_over(over)))
        self.gpu_panel.target_selected.connect(lambda key: self._guard(lambda: self._on_card_clicked(key)))
        self.gpu_panel.basis_changed.connect(lambda basis: self._guard(lambda: self._on_basis_changed(basis)))
        self.presets.activated.connect(lambda i: self._guard(lambda: self._on_preset(i)))

    # ---- small helpers ------------------------------------------------------------------------------------

    def _guard(self, fn: Callable[[], object]) -> None:
        """Run a slot's body; an unexpected error becomes a message, never an exception out of the slot."""
        try:
            fn()
        except GpumemError as e:
            self.notify("gpumem", str(e))
        except Exception as e:  # a bug: say so instead of leaving the window in a half state
            self.notify("gpumem: unexpected error", f"{type(e).__name__}: {e}")

    def notify(self, title: str, text: str) -> None:
        """Tell the user (status bar, and a non-blocking message box when dialogs are on)."""
        self.last_message = text
        self.statusBar().showMessage(text, 10000)
        if self.dialogs:
            box = QMessageBox(QMessageBox.Icon.Warning, title, text, QMessageBox.StandardButton.Ok, self)
            box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
            box.open()

    @property
    def estimate(self) -> Estimate | None:
        """The estimate on screen (the last good one)."""
        return self._est

    @property
    def report(self) -> FitReport | None:
        return self._fit

    @property
    def run(self) -> AnyRun | None:
        return self._run

    @property
    def mode(self) -> str:
        """'train' when the Training tab is on top, else 'infer'."""
        return "train" if self.mode_tabs.currentIndex() == 1 else "infer"

    def set_mode(self, mode: str) -> None:
        """Bring the Inference ('infer') or Training ('train') tab to the top (recomputes)."""
        self.mode_tabs.setCurrentIndex(1 if mode == "train" else 0)

    @property
    def active_form(self) -> RunForm | TrainingForm:
        return self.train_form if self.mode == "train" else self.run_form

    @property
    def model(self) -> LoadedModel | None:
        return self._model

    # ---- inputs -------------------------------------------------------------------------------------------

    def schedule(self, typing: bool = True) -> None:
        """Recompute after the debounce interval (restarted by every edit; short unless ``typing``)."""
        self._refresh_pending = False
        self._debounce.restart(typing)

    def _schedule_refresh(self) -> None:
        """Recompute for new GPU readings (same inputs): unless an edit is pending (it reads them too), a
        refresh."""
        if not self._debounce.isActive():
            self._refresh_pending = True
            self._debounce.restart()

    def _on_debounce(self) -> None:
        refresh, self._refresh_pending = self._refresh_pending, False
        self._refreshing = refresh
        try:
            self.recompute_now()
        finally:
            self._refreshing = False

    def _on_target_edited(self) -> None:
        self._target_user_set = True
        self.schedule(self.target_form.typing)

    def _on_preset(self, index: int) -> None:
        name = self.presets.itemData(index)
        self.presets.setCurrentIndex(0)
        preset = next((p for p in PRESETS if p.name == name), None)
        if preset is None:
            return
        run = preset.run
        if run.weights == FILE_WEIGHTS and not (self._model and self._model.weights):
            run = run.model_copy(update={"weights": "bf16"})
        self.run_form.set_value(run)
        current = self.target_form.value()
        if preset.gpu is not None and current.kind == "catalog":
            self.target_form.set_value(preset.gpu.model_copy(update={"margin_mib": current.margin_mib}))
        self.recompute_now()

    def _on_training_preset(self, index: int) -> None:
        name = self.train_presets.itemData(index)
        self.train_presets.setCurrentIndex(0)
        preset = next((p for p in TRAINING_PRESETS if p.name == name), None)
        if preset is None:
            return
        self.train_form.set_value(preset.run)
        current = self.target_form.value()
        if preset.gpu is not None and current.kind == "catalog":
            self.target_form.set_value(preset.gpu.model_copy(update={"margin_mib": current.margin_mib}))
        self.recompute_now()

    def _on_mode_changed(self) -> None:
        self.results.set_mode(self.mode)
        self._fit = None
        self.recompute_now()

    def _on_card_clicked(self, key: str) -> None:
        current = self.target_form.value()
        self.target_form.set_value(current.model_copy(update={"kind": "local", "device": key, "count": 1}))
        self._target_user_set = True
        self.recompute_now()

    def _on_basis_changed(self, basis: str) -> None:
        self.target_form.set_basis("free" if basis == "free" else "total")
        self.recompute_now()

    def _on_sweep_over(self, over: str) -> None:
        self._sweep_over = over
        self._start_background()

    def _updated_run(self, update: dict) -> AnyRun:
        """The current run with ``update`` applied (validated; raises on a bad update)."""
        base = self._run if self._run is not None else self.active_form.value()
        cls = TrainingRun if isinstance(base, TrainingRun) else InferenceRun
        return cls.model_validate({**base.model_dump(), **update})

    def apply_change(self, update: dict) -> None:
        """Apply one of the ranked changes to the run form (and the GPU count when it needs more GPUs)."""
        try:
            run = self._updated_run(update)
        except Exception as e:
            self.notify("gpumem", f"cannot apply {update}: {e}")
            return
        if isinstance(run, TrainingRun):
            self.train_form.set_value(run)
        else:
            self.run_form.set_value(run)
        choice = self.target_form.value()
        if run_gpus(run) > choice.count:  # local GPUs: an error says so when there are not that many
            self.target_form.set_value(choice.model_copy(update={"count": run_gpus(run)}))
        self.recompute_now()

    def set_unit(self, unit: SizeUnit) -> None:
        """Show every size in GiB or GB."""
        self.unit = unit
        self.unit_actions[unit].setChecked(True)
        self.model_panel.set_unit(unit)
        self.target_form.set_unit(unit)
        self.gpu_panel.set_unit(unit)
        if self._est is not None:
            self._show_estimate()
        if self._fit is not None:
            self._show_report(self._fit)
        self._start_background()

    # ---- GPU snapshots -------------------------------------------------------------------------------------

    @Slot(object)
    def on_snapshot(self, snap: GpuSnapshot) -> None:
        """A new reading from the poller (connected by the composition root).

        Recorded at once; drawn at once unless one was drawn less than ``snapshot_interval_ms`` ago, else
        when that interval is over (only the newest reading waiting by then is drawn)."""
        try:
            self.gpu_panel.record(snap)
            self._pending_snapshot = snap
            if self._snapshot_timer.isActive():
                return
            since = None if self._snapshot_shown_at is None else time.monotonic() - self._snapshot_shown_at
            wait_ms = 0 if since is None else self._snapshot_interval_ms - since * 1000
            if wait_ms <= 0:
                self._show_pending_snapshot()
            else:
                self._snapshot_timer.start(max(1, round(wait_ms)))
        except Exception as e:  # never raise out of a slot
            self.statusBar().showMessage(f"GPU reading not shown: {type(e).__name__}: {e}", 10000)

    def _show_pending_snapshot(self) -> None:
        snap, self._pending_snapshot = self._pending_snapshot, None
        if snap is None:
            return
        self._snapshot_shown_at = time.monotonic()
        try:
            self._on_snapshot(snap)
        except Exception as e:  # never raise out of a slot
            self.statusBar().showMessage(f"GPU reading not shown: {type(e).__name__}: {e}", 10000)

    def _on_snapshot(self, snap: GpuSnapshot) -> None:
        old = self._snapshot
        self._snapshot = snap
        # a GPU in MIG mode is used through its instances, which are listed after it
        usable = [
            d
            for d in snap.devices
            if d.ok and d.total_bytes is not None and not (d.mig_mode and snap.mig_instances(d.index))
        ]
        self.target_form.set_local_devices(usable)
        self.gpu_panel.show_snapshot(snap, record=False)  # on_snapshot recorded it
        if not self._target_user_set and usable:
            self._target_user_set = True
            first = usable[0]
            choice = self.target_form.value()
            self.target_form.set_value(
                choice.model_copy(update={"kind": "local", "device": first.key, "count": 1})
            )
            self.schedule()
            return
        if self.target_form.value().kind == "local" and self._local_changed(old, snap):
            self._schedule_refresh()

    def _local_changed(self, old: GpuSnapshot | None, new: GpuSnapshot) -> bool:
        keys = self._resolved.devices if self._resolved and self._resolved.devices else ()
        if not keys or old is None:
            return True

        def state(s: GpuSnapshot) -> list[tuple]:
            return [
                (d.free_bytes, d.total_bytes, d.error) if (d := s.device(k)) else None  # type: ignore[misc]
                for k in keys
            ]

        return state(old) != state(new)

    @Slot(str)
    def on_gpu_error(self, reason: str) -> None:
        self.gpu_panel.show_error(reason)

    def _evaluate_device(self, dev: GpuDevice, available: int) -> Verdict | None:
        """The plan's verdict on one device, from the core (vLLM sizes its pool from the device's memory)."""
        est, run, model = self._est, self._run, self._model
        if est is None or run is None or model is None or model.spec is None or dev.total_bytes is None:
            return None
        if est.engine == "vllm" and isinstance(run, InferenceRun):
            key = (id(est), dev.total_bytes)
            cached = self._capacity_cache.get(key)
            if cached is None:
                try:
                    cached = estimate_inference(model.spec, run, dev.total_bytes, model.weights)
                except GpumemInputError:
                    return None
                self._capacity_cache = {k: v for k, v in self._capacity_cache.items() if k[0] == id(est)}
                self._capacity_cache[key] = cached
            est = cached
        n = len(est.per_gpu)
        target = GpuTarget(
            name=dev.name, capacity_bytes=dev.total_bytes, count=n, free_bytes=(available,) * n
        )
        try:
            vs = verdicts(est, target, self.target_form.value().margin_bytes)
        except GpumemInputError:
            return None
        return worst_verdict(vs)

    # ---- the model -----------------------------------------------------------------------------------------

    def load_source(self, source: str) -> bool:
        """Load a model (catalog id, local path, hub id); see :meth:`ModelPanel.load_source`."""
        return self.model_panel.load_source(source)

    def _on_model_loaded(self, m: LoadedModel) -> None:
        self._model = m
        self._capacity_cache.clear()
        self.setWindowTitle(f"{m.name} - gpumem")
        self.run_form.set_file_weights_available(m.weights is not None)
        pending, self._pending_scenario = self._pending_scenario, None
        if pending is not None:
            self._apply_scenario_settings(pending)
        elif m.weights is not None:
            run = self.run_form.value() if not self.run_form.has_errors() else InferenceRun()
            self.run_form.set_value(run.model_copy(update={"weights": FILE_WEIGHTS}))
        if m.spec is None:
            self._est = None
            self.results.banner.set_verdict(
                "stale",
                "The architecture of this model is unknown",
                "Estimates need its config.json: open the folder that holds it, or pick the model in the "
                "catalog.",
            )
            return
        self.recompute_now()

    def _on_model_failed(self, message: str) -> None:
        self.last_message = message
        if self._pending_scenario is not None:
            self._pending_scenario = None
            self.notify("Scenario not loaded", f"The scenario's model could not be loaded: {message}")
        self.statusBar().showMessage(message, 10000)

    # ---- computing ----------------------------------------------------------------------------------------

    @Slot()
    def recompute_now(self) -> None:
        """Estimate now (GUI thread), show it, then start the fit report and sweep in the worker."""
        self._debounce.stop()
        try:
            self._recompute()
        except Exception as e:  # a core bug must not take the window down; keep the last estimate
            self.results.mark_stale(f"unexpected error: {type(e).__name__}: {e}")

    def _recompute(self) -> None:
        m = self._model
        if m is None or m.spec is None:
            return
        form = self.active_form
        self.results.set_mode(self.mode)
        run = form.checked_value()
        if run is None:
            self.results.mark_stale(
                "Fix the highlighted field; the numbers below are for the last valid input."
            )
            return
        choice = self.target_form.value()
        self.target_form.clear_errors()
        resolved: ResolvedTarget | None = None
        try:
            resolved = resolve_target(choice, self._snapshot, self.unit)
            if isinstance(run, TrainingRun) and run.world > resolved.target.count:
                raise GpumemInputError(
                    f"the run uses {run.world} GPUs (dp x tp x pp x cp) but the target has "
                    f"{resolved.target.count}: raise the count",
                    field="gpu",
                )
        except GpumemInputError as e:
            resolved = None
            self.target_form.show_error("gpu", e.message)
        if isinstance(run, TrainingRun) and resolved is not None and resolved.target.free_bytes:
            resolved = self._training_target(resolved)
        capacity = resolved.target.capacity_bytes if resolved else None
        t0 = time.perf_counter()
        try:
            est = estimate_any(m.spec, run, capacity, m.weights)
        except GpumemInputError as e:
            form.show_error(e.field, e.message)
            self.results.mark_stale(f"{e.one_line()} (the numbers below are for the last valid input)")
            return
        self.last_estimate_ms = (time.perf_counter() - t0) * 1000
        refresh = self._refreshing and run == self._run
        if not refresh:
            self._inputs_serial += 1
        self._est, self._run, self._resolved = est, run, resolved
        self._show_estimate()
        self.gpu_panel.set_selected(resolved.devices[0] if resolved and resolved.devices else None)
        self.gpu_panel.refresh_verdicts()
        if refresh and self._fit is not None:  # keep the last report up (not greyed) while it is redone
            self._show_report(self._fit)
        else:
            self._fit = None
            self.results.changes.set_busy("Working out what would make it fit…")
        self._bg_wait_paint = True
        self._bg_delay.start(BACKGROUND_FALLBACK_MS)
        self.estimate_updated.emit()

    def _training_target(self, resolved: ResolvedTarget) -> ResolvedTarget:
        """Local GPUs checked against free memory, for training: the estimate describes one replica's ranks
        (every data-parallel replica is the same), so each rank is checked against the least-free GPU."""
        free = resolved.target.free_bytes or ()
        low = min(free)
        worst = resolved.devices[free.index(low)] if resolved.devices else "?"
        target = resolved.target.model_copy(update={"free_bytes": (low,) * resolved.target.count})
        text = (
            f"{resolved.text}; every training rank against the least-free GPU ({worst}: "
            f"{fmt_bytes(low, self.unit)} free)"
        )
        return replace(resolved, target=target, text=text, free_now=(low,) * len(resolved.free_now or ()))

    def _show_estimate(self) -> None:
        est, resolved = self._est, self._resolved
        assert est is not None
        free = resolved.free_now[0] if resolved and resolved.free_now else None
        self.results.show_estimate(
            est,
            self.unit,
            capacity_bytes=resolved.target.capacity_bytes if resolved else None,
            free_bytes=free,
        )
        margin = self.target_form.value().margin_bytes
        if resolved is None:
            self.results.show_no_target(
                est, "no GPU target: " + self.target_form.error_text("gpu"), self.unit
            )
        else:
            try:
                vs = verdicts(est, resolved.target, margin)
            except GpumemInputError as e:
                self.target_form.show_error("gpu", e.message)
                self.results.show_no_target(est, e.message, self.unit)
            else:
                self.results.show_verdicts(vs, est, resolved.text, self.unit)
        self.timing.setText(f"estimate {self.last_estimate_ms:.1f} ms")

    def _background_job(self) -> Callable[[], BackgroundResult] | None:
        m, run, resolved = self._model, self._run, self._resolved
        if m is None or m.spec is None or run is None:
            return None
        spec, weights, over, serial = m.spec, m.weights, self._sweep_over, self._inputs_serial
        target = resolved.target if resolved else None
        margin = self.target_form.value().margin_bytes

        def job() -> BackgroundResult:
            t0 = time.perf_counter()
            rep, err = None, None
            if target is not None:
                try:
                    if isinstance(run, TrainingRun):
                        rep = fit_training(spec, run, target, margin)
                    else:
                        rep = fit_report(spec, run, target, margin, weights)
                except GpumemInputError as e:
                    err = str(e)
            points = sweep(
                spec, run, over, sweep_xs(spec, run, over), target, margin, weights, skip_invalid=True
            )
            return BackgroundResult(rep, err, over, points, time.perf_counter() - t0, serial)

        return job

    def event(self, event: QEvent) -> bool:
        if event.type() == QEvent.Type.UpdateRequest and self._bg_wait_paint:  # a paint pass is about to run
            self._bg_wait_paint = False
            self._bg_painted.start()
        return super().event(event)

    def _on_painted(self) -> None:
        if self._bg_delay.isActive():
            self._bg_delay.start(BACKGROUND_DELAY_MS)

    def _start_background(self) -> None:
        self._bg_delay.stop()
        self._bg_wait_paint = False
        job = self._background_job()
        if job is None:
            return
        if self._fit is None:
            self.results.changes.set_busy("Working out what would make it fit…")
        self._bg.submit(job)

    def flush_background(self, timeout_ms: int = 10000) -> bool:
        """Start a delayed job now, wait for the worker and deliver its result (tests, export, self-test)."""
        if self._bg_delay.isActive():
            self._bg_delay.stop()
            self._start_background()
        ok = self._bg.wait(timeout_ms)
        QApplication.processEvents()
        return ok

    @Slot(int, object)
    def _on_background_finished(self, job_id: int, result: object) -> None:
        if not isinstance(result, BackgroundResult):
            return
        latest = job_id == self._bg.latest
        if not latest and result.serial != self._inputs_serial:
            return  # made for inputs that have changed since
        try:
            self._apply_background(result)
        except Exception as e:  # never raise out of a slot
            self.results.changes.clear(f"could not show the fit report: {type(e).__name__}: {e}")
        if latest:
            self.background_done.emit()

    def _apply_background(self, result: BackgroundResult) -> None:
        self.last_background_ms = result.seconds * 1000
        self._fit = result.report
        run = self._run
        if result.report is not None:
            self._show_report(result.report)
        else:
            self.results.changes.clear(
                result.report_error or "Pick a GPU target to see what would make it fit."
            )
        rep = result.report
        if result.over == "seq" and isinstance(run, TrainingRun):
            max_fit = rep.max_context if rep else None
            current = run.seq
        elif result.over == "seq":
            max_fit = rep.max_context - run.new_tokens if rep and rep.max_context and run else None
            current = run.seq if run else 0
        else:
            max_fit = rep.max_batch if rep else None
            current = run.batch if run else 0
        cap = self._resolved.target.capacity_bytes if self._resolved else None
        self.results.sweep.show_sweep(
            result.over,
            result.points,
            self.unit,
            capacity_bytes=cap,
            max_fit=max_fit,
            current=current,
            what=self.results.sweep_axis(result.over),
        )
        self.timing.setText(
            f"estimate {self.last_estimate_ms:.1f} ms · fit report + sweep {self.last_background_ms:.0f} ms"
        )

    def _local_gpu_count(self) -> int | None:
        """How many whole GPUs this machine has (None when the target is not local or nothing was read)."""
        if self._resolved is None or not self._resolved.devices or self._snapshot is None:
            return None
        snap = self._snapshot
        return sum(
            1 for d in snap.physical_devices if d.ok and not (d.mig_mode and snap.mig_instances(d.index))
        )

    def _show_report(self, rep: FitReport) -> None:
        """The changes panel (changes needing more GPUs than a local target has left out, with a note) and
        the local GPUs the report suggests, in the banner."""
        changes = list(rep.changes)
        note = ""
        local = self._local_gpu_count()
        if local is not None:
            kept = []
            for c in changes:
                try:
                    need = run_gpus(self._updated_run(dict(c.update)))
                except Exception:
                    need = 0
                if need <= local:
                    kept.append(c)
            hidden = len(changes) - len(kept)
            if hidden:
                note = (
                    f"{hidden} change(s) left out: they need more GPUs than this machine has ({local}); pick "
                    "a catalog GPU to see them."
                )
            changes = kept
        self.results.changes.show_report(rep, self.unit, changes, note)
        resolved, run = self._resolved, self._run
        if rep.local_gpus and resolved is not None and resolved.devices and run is not None:
            keys = [resolved.devices[i] for i in rep.local_gpus if i < len(resolved.devices)]
            current_tp = run.tp
            if keys != list(resolved.devices) or (rep.local_tp or current_tp) != current_tp:  # a suggestion
                ids = ",".join(keys)
                tp = f" with tp {rep.local_tp}" if rep.local_tp else ""
                gpus = "GPU" if len(keys) == 1 else "GPUs"
                self.results.banner.add_line(f"use local {gpus} {ids}{tp} (CUDA_VISIBLE_DEVICES={ids})")

    @Slot(int, str)
    def _on_background_failed(self, job_id: int, message: str) -> None:
        if job_id == self._bg.latest:
            self.results.changes.clear(f"fit report failed: {message}")
            self.background_done.emit()

    # ---- scenarios ----------------------------------------------------------------------------------------

    def current_scenario(self) -> Scenario | None:
        m = self._model
        if m is None:
            return None
        try:
            run = self.run_form.value()
        except GpumemInputError:
            run = self._run if isinstance(self._run, InferenceRun) else None
        try:
            training = self.train_form.value()
        except GpumemInputError:
            training = self._run if isinstance(self._run, TrainingRun) else None
        if run is None and self.mode == "infer":
            return None
        if training is None and self.mode == "train":
            return None
        return Scenario(
            model=ModelRef(source=m.source),
            mode=self.mode,  # type: ignore[arg-type]
            run=run or InferenceRun(),
            training=training,
            gpu=self.target_form.value(),
        )

    def save_scenario(self, path: Path | str) -> bool:
        sc = self.current_scenario()
        if sc is None:
            self.notify("Nothing to save", "Pick a model first.")
            return False
        try:
            save_scenario(path, sc)
        except OSError as e:
            self.notify("Scenario not saved", f"{path}: {e.strerror or e}")
            return False
        self.scenario_path = Path(path)
        self.recent.add(path)
        self.statusBar().showMessage(f"Saved {path}", 5000)
        return True

    def open_scenario(self, path: Path | str) -> bool:
        """Load a scenario file; a bad file or a model that cannot be loaded changes nothing."""
        try:
            sc = read_scenario(path)
        except ScenarioError as e:
            self.notify("Scenario not loaded", str(e))
            return False
        if not self._apply_scenario(sc):
            return False
        self.scenario_path = Path(path)
        self.recent.add(path)
        return True

    def _apply_scenario(self, sc: Scenario) -> bool:
        source = sc.model.source
        if not self.model_panel.is_local_or_catalog(source):
            self._pending_scenario = sc  # applied when the hub fetch succeeds
            self.model_panel.fetch(source)
            return True
        try:
            loaded = self.model_panel.try_load(source)
        except (GpumemError, OSError) as e:
            self.notify("Scenario not loaded", f"The scenario's model could not be loaded: {e}")
            return False
        self._pending_scenario = sc
        self.model_panel.set_model(loaded)  # -> _on_model_loaded applies the run and the GPU
        return True

    def _apply_scenario_settings(self, sc: Scenario) -> None:
        self.run_form.set_value(sc.run)
        if sc.training is not None:
            self.train_form.set_value(sc.training)
        with QSignalBlocker(self.mode_tabs):
            self.set_mode(sc.mode)
        self.results.set_mode(sc.mode)
        self.target_form.set_value(sc.gpu)
        self.gpu_panel.set_basis(sc.gpu.basis)
        self._target_user_set = True

    def compare_files(self, a: Path | str | None, b: Path | str) -> CompareDialog:
        """Compare two scenario files (``a`` None: the current plan) in a dialog; raises on bad input."""
        sides = []
        for path in (a, b):
            if path is None:
                if self._model is None or self._run is None or self._est is None:
                    raise GpumemInputError("no current plan to compare")
                sides.append(Side("current plan", self._model.name, self._run, self._est))
                continue
            try:
                sc = read_scenario(path)
            except ScenarioError as e:
                raise GpumemInputError(str(e)) from None
            m = self.model_panel.try_load(sc.model.source)
            if m.spec is None:
                raise GpumemInputError("the architecture is unknown (no config.json)", source=sc.model.source)
            run = sc.active_run
            cap = find_gpu(sc.gpu.gpu_id).memory_bytes if sc.gpu.kind == "catalog" else None
            est = estimate_any(m.spec, run, cap, m.weights)
            sides.append(Side(Path(path).name, m.name, run, est))
        dialog = CompareDialog(sides[0], sides[1], self.unit, self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        return dialog

    # ---- export and copy -----------------------------------------------------------------------------------

    def _cli_gpu(self) -> tuple[str | None, int]:
        choice = self.target_form.value()
        if choice.kind == "catalog":
            return choice.gpu_id, choice.count
        if self._resolved is not None:
            name = self._resolved.target.name
            for candidate in (name, name.replace("NVIDIA ", ""), name.replace("NVIDIA GeForce ", "")):
                try:
                    return find_gpu(candidate).id, choice.count
                except GpumemInputError:
                    continue
        return None, choice.count

    def command_line(self) -> str:
        m, run = self._model, self._run
        if m is None or run is None:
            raise GpumemInputError("no plan yet")
        gpu, count = self._cli_gpu()
        margin = self.target_form.value().margin_bytes
        return cli_command(m.source, run, gpu, count, margin)

    def runtime_flags_text(self) -> str:
        m, run, est = self._model, self._run, self._est
        if m is None or run is None or est is None:
            raise GpumemInputError("no plan yet")
        if isinstance(run, TrainingRun):
            return training_runtime_flags(m.source, run)
        return runtime_flags(m.source, run, est)

    def copy_command(self) -> None:
        QApplication.clipboard().setText(self.command_line())
        self.statusBar().showMessage("Copied the gpumem command line", 4000)

    def copy_runtime_flags(self) -> None:
        QApplication.clipboard().setText(self.runtime_flags_text())
        what = "training arguments" if isinstance(self._run, TrainingRun) else "engine command line"
        self.statusBar().showMessage(f"Copied the {what}", 4000)

    def export_report(self, base: Path | str) -> list[Path]:
        """Write ``base``.md (report), ``base``.png (charts) and ``base``.json (the plan as
        ``gpumem estimate --json`` prints it); returns the paths."""
        base = Path(base)
        if base.suffix.lower() in (".md", ".json", ".png"):
            base = base.with_suffix("")
        m, run, est = self._model, self._run, self._est
        if m is None or run is None or est is None:
            raise GpumemInputError("no plan to export yet")
        job = self._background_job()
        if job is not None:  # bring the fit report and the sweep up to date in this thread
            self._bg.wait(10000)
            self._apply_background(job())
        rep = self._fit
        json_path = base.with_suffix(".json")
        png_path = base.with_suffix(".png")
        md_path = base.with_suffix(".md")
        atomic_write(json_path, plan_json(m, run, est, rep))
        data = QByteArray()
        buf = QBuffer(data)
        buf.open(QIODevice.OpenModeFlag.WriteOnly)
        self.results.charts.grab().save(buf, "PNG")
        buf.close()
        atomic_write(png_path, bytes(data.data()))
        target_text = self._resolved.text if self._resolved else "none"
        md = markdown_report(
            m,
            run,
            est,
            rep,
            unit=self.unit,
            target_text=target_text,
            command=self.command_line(),
            flags=self.runtime_flags_text(),
            chart_png=png_path.name,
        )
        atomic_write(md_path, md)
        self.statusBar().showMessage(f"Exported {md_path.name}, {png_path.name}, {json_path.name}", 5000)
        return [md_path, png_path, json_path]

    # ---- dialogs -------------------------------------------------------------------------------------------

    def open_path(self, path: Path | str) -> bool:
        """Open a model file/folder, or a scenario JSON (recognised by its ``format``)."""
        if looks_like_scenario(path):
            return self.open_scenario(path)
        return self.model_panel.load_source(str(path))

    def open_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self,
            "Open a model or a scenario",
            "",
            "Models and scenarios (*.json *.safetensors *.gguf);;config.json (*.json);;"
            "safetensors (*.safetensors *.safetensors.index.json);;GGUF (*.gguf);;All files (*)",
        )
        if path:
            self.open_path(path)

    def open_folder_dialog(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Open a model folder")
        if path:
            self.model_panel.load_source(path)

    def save_dialog(self) -> None:
        if self.scenario_path is None:
            self.save_as_dialog()
        else:
            self.save_scenario(self.scenario_path)

    def save_as_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(
            self, "Save scenario", "scenario.gpumem.json", "Scenario (*.json)"
        )
        if path:
            self.save_scenario(path)

    def compare_dialog(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(
            self, "Compare: pick one scenario (against the current plan) or two", "", "Scenario (*.json)"
        )
        if not paths:
            return
        a, b = (None, paths[0]) if len(paths) == 1 else (paths[0], paths[1])
        self.compare_files(a, b).open()

    def export_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export report", "gpumem-report.md", "Markdown (*.md)")
        if path:
            written = self.export_report(path)
            self.notify_info(f"Wrote {', '.join(p.name for p in written)} in {written[0].parent}")

    def notify_info(self, text: str) -> None:
        self.last_message = text
        self.statusBar().showMessage(text, 8000)

    def _fill_recent_menu(self) -> None:
        self.recent_menu.clear()
        paths = self.recent.paths()
        if not paths:
            a = self.recent_menu.addAction("(none)")
            a.setEnabled(False)
            return
        for p in paths:
            a = self.recent_menu.addAction(p)
            a.triggered.connect(lambda _c=False, p=p: self._guard(lambda: self.open_scenario(p)))
        self.recent_menu.addSeparator()
        self.recent_menu.addAction("Clear").triggered.connect(lambda _c=False: self.recent.clear())

    def _about(self) -> None:
        QMessageBox.about(
            self,
            "About gpumem",
            f"<b>gpumem {__version__}</b><p>Will this model, in this setup, fit on my GPUs, and what is "
            "eating "
            "the memory?</p>",
        )

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
        self._guard(lambda: self.open_path(urls[0].toLocalFile()))

    # ---- settings ------------------------------------------------------------------------------------------

    def _restore(self) -> None:
        s = self.settings
        geometry = s.value("window/geometry")
        if isinstance(geometry, QByteArray | bytes) and geometry:
            self.restoreGeometry(geometry)
        state = s.value("window/state")
        if isinstance(state, QByteArray | bytes) and state:
            self.restoreState(state)
        unit = s.value("view/unit", SizeUnit.GIB.value)
        if unit in (SizeUnit.GIB.value, SizeUnit.GB.value):
            self.set_unit(SizeUnit(unit))
        last = s.value("scenario/last", "")
        if isinstance(last, str) and last:
            try:
                sc = scenario_from_json(last, "last session")
            except ScenarioError as e:
                self.statusBar().showMessage(f"Last session not restored: {e}", 8000)
                return
            if self.model_panel.is_local_or_catalog(sc.model.source):
                self._apply_scenario(sc)
            else:  # do not hit the network at start: fall back to the default model
                self.statusBar().showMessage(f"Last model {sc.model.source} is a hub id: open it again", 8000)

    def save_settings(self) -> None:
        s = self.settings
        s.setValue("window/geometry", self.saveGeometry())
        s.setValue("window/state", self.saveState())
        s.setValue("view/unit", self.unit.value)
        sc = self.current_scenario()
        if sc is not None:
            s.setValue("scenario/last", sc.to_json())
        s.sync()

    def shutdown(self) -> None:
        """Stop the workers (the composition root stops the poller)."""
        self._debounce.stop()
        self._snapshot_timer.stop()
        self._bg_delay.stop()
        self._bg_painted.stop()
        self._bg.shutdown(5000)
        self.model_panel.shutdown()

    def closeEvent(self, event: QCloseEvent) -> None:
        try:
            self.save_settings()
        finally:
            self.shutdown()
        super().closeEvent(event)
