"""The window's menu bar, its actions and the dialogs they open.

Every action goes through the window's own API (``open_path``, ``save_scenario``, ``compare_files``,
``export_report``, ``command_line``...), under the window's ``guard``: an error becomes a message, never an
exception out of a slot.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject
from PySide6.QtGui import QAction, QActionGroup, QKeySequence
from PySide6.QtWidgets import QApplication, QFileDialog, QMenu, QMessageBox

from gpumem_gui import __version__
from gpumem_gui.core import SizeUnit, TrainingRun
from gpumem_gui.ui.diagnose_view import DiagnoseDialog
from gpumem_gui.ui.import_glue import ImportGlue

if TYPE_CHECKING:
    from gpumem_gui.ui.main_window import MainWindow

OPEN_FILTER = (
    "Models and scenarios (*.json *.safetensors *.gguf);;config.json (*.json);;"
    "Training configs (*.yaml *.yml *.toml *.json);;"
    "safetensors (*.safetensors *.safetensors.index.json);;GGUF (*.gguf);;"
    "What a GPU said (*.txt *.log *.out *.err *.csv *.pickle *.pkl);;All files (*)"
)


class WindowMenus(QObject):
    """File, Edit, View and Help; the actions the window exposes are attributes here."""

    def __init__(self, window: MainWindow) -> None:
        super().__init__(window)
        self.window = window
        window.imports = ImportGlue(window)  # paste a command, drop a config, Copy as (ui/import_glue.py)
        self.unit_actions: dict[SizeUnit, QAction] = {}
        self.diagnose_dialog: DiagnoseDialog | None = None
        bar = window.menuBar()
        self._file_menu(bar.addMenu("&File"))
        edit = bar.addMenu("&Edit")
        edit.addAction(self._action("Copy &gpumem command", self.copy_command, "Ctrl+Shift+C"))
        edit.addAction(self._action("Copy &runtime flags", self.copy_runtime_flags))
        self.copy_as_menu = edit.addMenu("Copy &as")
        self.copy_as_menu.aboutToShow.connect(lambda: window.imports.fill_copy_menu(self.copy_as_menu))
        edit.addSeparator()
        edit.addAction(self._action("&Paste command…", window.imports.paste_dialog, "Ctrl+Shift+V"))
        view = bar.addMenu("&View")
        units = view.addMenu("&Units")
        group = QActionGroup(window)
        for unit, text in ((SizeUnit.GIB, "GiB (2^30 bytes)"), (SizeUnit.GB, "GB (10^9 bytes)")):
            a = QAction(text, window, checkable=True)
            a.setChecked(unit is window.unit)
            a.triggered.connect(lambda _c=False, u=unit: window.set_unit(u))
            group.addAction(a)
            units.addAction(a)
            self.unit_actions[unit] = a
        view.addAction(window.gpu_dock.toggleViewAction())
        self.cluster_action = self._action(
            "&Cluster GPUs (Prometheus)…", window.gpu_glue.cluster.edit_connection
        )
        view.addAction(self.cluster_action)
        tools = bar.addMenu("&Tools")
        self.verify_action = self._action(
            "&Verify exactly (trace with PyTorch)…", self.verify_exactly, "Ctrl+T"
        )
        tools.addAction(self.verify_action)
        tools.addAction(self._action("Trace &Python…", self.choose_trace_python))
        tools.addSeparator()
        self.diagnose_action = self._action("What the &GPU said…", self.diagnose, "Ctrl+Shift+D")
        tools.addAction(self.diagnose_action)
        window.results.banner.verify_button.clicked.connect(self.verify_exactly)
        helpm = bar.addMenu("&Help")
        helpm.addAction(self._action("&About gpumem", self.about))

    def _file_menu(self, file: QMenu) -> None:
        w = self.window
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
        self.recent_menu.aboutToShow.connect(self.fill_recent_menu)
        file.addAction(self._action("&Compare scenarios…", self.compare_dialog))
        file.addSeparator()
        self.export_action = self._action("&Export report…", self.export_dialog, "Ctrl+E")
        file.addAction(self.export_action)
        file.addSeparator()
        file.addAction(self._action("&Quit", w.close, QKeySequence.StandardKey.Quit))

    def _action(
        self, text: str, slot: Callable[[], object], shortcut: QKeySequence | str | None = None
    ) -> QAction:
        action = QAction(text, self.window)
        if shortcut is not None:
            action.setShortcut(QKeySequence(shortcut))
        action.triggered.connect(lambda _checked=False: self.window.guard(slot))
        return action

    # ---- dialogs -------------------------------------------------------------------------------------------

    def open_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self.window, "Open a model or a scenario", "", OPEN_FILTER)
        if path:
            self.window.open_path(path)

    def open_folder_dialog(self) -> None:
        path = QFileDialog.getExistingDirectory(self.window, "Open a model folder")
        if path:
            self.window.model_panel.load_source(path)

    def save_dialog(self) -> None:
        if self.window.scenario_path is None:
            self.save_as_dialog()
        else:
            self.window.save_scenario(self.window.scenario_path)

    def save_as_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(
            self.window, "Save scenario", "scenario.gpumem.json", "Scenario (*.json)"
        )
        if path:
            self.window.save_scenario(path)

    def compare_dialog(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(
            self.window,
            "Compare: pick one scenario (against the current plan) or two",
            "",
            "Scenario (*.json)",
        )
        if not paths:
            return
        a, b = (None, paths[0]) if len(paths) == 1 else (paths[0], paths[1])
        self.window.compare_files(a, b).open()

    def export_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(
            self.window, "Export report", "gpumem-report.md", "Markdown (*.md)"
        )
        if path:
            written = self.window.export_report(path)
            self.window.notify_info(f"Wrote {', '.join(p.name for p in written)} in {written[0].parent}")

    def fill_recent_menu(self) -> None:
        menu, recent = self.recent_menu, self.window.recent
        menu.clear()
        paths = recent.paths()
        if not paths:
            a = menu.addAction("(none)")
            a.setEnabled(False)
            return
        for p in paths:
            a = menu.addAction(p)
            a.triggered.connect(lambda _c=False, p=p: self.window.guard(lambda: self.window.open_scenario(p)))
        menu.addSeparator()
        menu.addAction("Clear").triggered.connect(lambda _c=False: recent.clear())

    def about(self) -> None:
        QMessageBox.about(
            self.window,
            "About gpumem",
            f"<b>gpumem {__version__}</b><p>Will this model, in this setup, fit on my GPUs, and what is "
            "eating the memory?</p>",
        )

    # ---- copy ----------------------------------------------------------------------------------------------

    def diagnose(self) -> DiagnoseDialog:
        """Open (or raise) the What the GPU said dialog (one per window: what was pasted stays)."""
        if self.diagnose_dialog is None:
            self.diagnose_dialog = DiagnoseDialog(self.window)
        self.diagnose_dialog.show()
        return self.diagnose_dialog

    def verify_exactly(self) -> None:
        """Trace the current plan in a dialog (progress, cancel, traced vs estimated)."""
        from gpumem_gui.ui.trace_view import TraceDialog

        w = self.window
        if w.model is None or w.run is None:
            w.notify_info("Verify exactly: pick a model and a valid run first.")
            return
        self.trace_dialog = TraceDialog(w.model, w.run, w.settings, w.unit, parent=w)
        self.trace_dialog.show()
        self.trace_dialog.start()

    def choose_trace_python(self) -> None:
        from gpumem_gui.ui.trace_view import choose_trace_python

        choose_trace_python(self.window, self.window.settings)

    def copy_command(self) -> None:
        QApplication.clipboard().setText(self.window.command_line())
        self.window.statusBar().showMessage("Copied the gpumem command line", 4000)

    def copy_runtime_flags(self) -> None:
        QApplication.clipboard().setText(self.window.runtime_flags_text())
        what = "training arguments" if isinstance(self.window.run, TrainingRun) else "engine command line"
        self.window.statusBar().showMessage(f"Copied the {what}", 4000)
