"""What the window reads from and writes to disk: scenario files (save, open, recent), the last session
(geometry, unit, scenario), the comparison of two plans, and the report export.

A scenario names its model by source; opening one loads that model first and applies the runs, the mode and
the GPU target once it has loaded (a hub model: when its fetch succeeds). A bad file, or a model that cannot
be loaded, changes nothing and says why.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, QObject, QSettings, Qt
from PySide6.QtWidgets import QWidget

from gpumem_gui.core import GpumemError, GpumemInputError, SizeUnit
from gpumem_gui.ui import export
from gpumem_gui.ui.diagnose_view import REPORT_SUFFIXES
from gpumem_gui.ui.import_glue import is_training_config
from gpumem_gui.ui.messages import error_line
from gpumem_gui.ui.scenario import (
    CompareDialog,
    RecentFiles,
    Scenario,
    ScenarioError,
    Side,
    looks_like_scenario,
    read_scenario,
    save_scenario,
    scenario_from_json,
)

if TYPE_CHECKING:
    from gpumem_gui.ui.main_window import MainWindow


def grab_png(widget: QWidget) -> bytes:
    """``widget`` as drawn now, as PNG bytes."""
    data = QByteArray()
    buf = QBuffer(data)
    buf.open(QIODevice.OpenModeFlag.WriteOnly)
    widget.grab().save(buf, "PNG")
    buf.close()
    return bytes(data.data())


class Documents(QObject):
    """Scenario files, the last session, comparisons and exports, for ``window`` (see module docstring)."""

    def __init__(self, window: MainWindow, settings: QSettings) -> None:
        super().__init__(window)
        self.window = window
        self.settings = settings
        self.recent = RecentFiles(settings)
        self.scenario_path: Path | None = None
        self._pending: Scenario | None = None  # applied once its model has loaded

    # ---- scenarios -----------------------------------------------------------------------------------------

    def current_scenario(self) -> Scenario | None:
        w = self.window
        return None if w.model is None else w.run_panel.scenario(w.model.source, w.run)

    def save_scenario(self, path: Path | str) -> bool:
        w = self.window
        sc = self.current_scenario()
        if sc is None:
            w.notify("Nothing to save", "Pick a model first.")
            return False
        try:
            save_scenario(path, sc)
        except OSError as e:
            w.notify("Scenario not saved", f"{path}: {e.strerror or e}")
            return False
        self.scenario_path = Path(path)
        self.recent.add(path)
        w.statusBar().showMessage(f"Saved {path}", 5000)
        return True

    def open_scenario(self, path: Path | str) -> bool:
        """Load a scenario file; a bad file or a model that cannot be loaded changes nothing."""
        try:
            sc = read_scenario(path)
        except ScenarioError as e:
            self.window.notify("Scenario not loaded", error_line(e))
            return False
        if not self.apply_scenario(sc):
            return False
        self.scenario_path = Path(path)
        self.recent.add(path)
        return True

    def apply_scenario(self, sc: Scenario) -> bool:
        """Load the scenario's model; its settings follow when the model has loaded (:meth:`take_pending`)."""
        panel = self.window.model_panel
        source = sc.model.source
        if not panel.is_local_or_catalog(source):
            self._pending = sc  # applied when the hub fetch succeeds
            panel.fetch(source)
            return True
        try:
            loaded = panel.try_load(source)
        except (GpumemError, OSError) as e:
            self.window.notify(
                "Scenario not loaded", f"The scenario's model could not be loaded: {error_line(e)}"
            )
            return False
        self._pending = sc
        panel.set_model(loaded)  # -> the window's model_loaded slot applies the run and the GPU
        return True

    def take_pending(self) -> Scenario | None:
        """The scenario waiting for the model that has just loaded (then none is waiting)."""
        sc, self._pending = self._pending, None
        return sc

    def model_failed(self, message: str) -> None:
        """The model did not load: a scenario waiting for it is dropped, with a message."""
        w = self.window
        w.last_message = message
        if self._pending is not None:
            self._pending = None
            w.notify("Scenario not loaded", f"The scenario's model could not be loaded: {message}")
        w.statusBar().showMessage(message, 10000)

    def open_path(self, path: Path | str) -> bool:
        """Open a model file/folder, a scenario JSON (recognised by its ``format``), a training config
        (YAML/JSON/TOML a config reader takes: :mod:`gpumem_gui.ui.import_glue`), or what a GPU said (a log,
        text or snapshot pickle: :mod:`gpumem_gui.ui.diagnose_view`)."""
        if Path(path).suffix.lower() in REPORT_SUFFIXES:
            return self.window.menus.diagnose().load_file(path)
        if looks_like_scenario(path):
            return self.open_scenario(path)
        if is_training_config(path):
            return self.window.imports.apply_file(path)
        return self.window.model_panel.load_source(str(path))

    def compare_files(self, a: Path | str | None, b: Path | str) -> CompareDialog:
        """Compare two scenario files (``a`` None: the current plan) in a dialog; raises on bad input."""
        w = self.window
        sides = []
        for path in (a, b):
            if path is not None:
                sides.append(export.scenario_side(path, w.model_panel.try_load))
            elif w.model is None or w.run is None or w.estimate is None:
                raise GpumemInputError("no current plan to compare")
            else:
                sides.append(Side("current plan", w.model.name, w.run, w.estimate))
        dialog = CompareDialog(sides[0], sides[1], w.unit, w)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        return dialog

    # ---- the last session ----------------------------------------------------------------------------------

    def restore_session(self) -> None:
        """The window's geometry and docks, the unit and the last scenario, as the last session left them."""
        w, s = self.window, self.settings
        geometry = s.value("window/geometry")
        if isinstance(geometry, QByteArray | bytes) and geometry:
            w.restoreGeometry(geometry)
        state = s.value("window/state")
        if isinstance(state, QByteArray | bytes) and state:
            w.restoreState(state)
        unit = s.value("view/unit", SizeUnit.GIB.value)
        if unit in (SizeUnit.GIB.value, SizeUnit.GB.value):
            w.set_unit(SizeUnit(unit))
        self._restore_scenario()

    def _restore_scenario(self) -> None:
        """Reopen the last session's scenario (a catalog or local model only: no network at start)."""
        last = self.settings.value("scenario/last", "")
        if not isinstance(last, str) or not last:
            return
        bar = self.window.statusBar()
        try:
            sc = scenario_from_json(last, "last session")
        except ScenarioError as e:
            bar.showMessage(f"Last session not restored: {error_line(e)}", 8000)
            return
        if self.window.model_panel.is_local_or_catalog(sc.model.source):
            self.apply_scenario(sc)
        else:  # do not hit the network at start: fall back to the default model
            bar.showMessage(f"Last model {sc.model.source} is a hub id: open it again", 8000)

    def save_session(self) -> None:
        w, s = self.window, self.settings
        s.setValue("window/geometry", w.saveGeometry())
        s.setValue("window/state", w.saveState())
        s.setValue("view/unit", w.unit.value)
        sc = self.current_scenario()
        if sc is not None:
            s.setValue("scenario/last", sc.to_json())
        s.sync()

    # ---- export --------------------------------------------------------------------------------------------

    def export_report(self, base: Path | str) -> list[Path]:
        """Write ``base``.md (report), ``base``.png (charts) and ``base``.json (the plan as
        ``gpumem estimate --json`` prints it); returns the paths."""
        w = self.window
        m, run, est = w.model, w.run, w.estimate
        if m is None or run is None or est is None:
            raise GpumemInputError("no plan to export yet")
        w.session.finish_background_here()  # the fit report and the sweep, up to date, on screen
        resolved = w.session.resolved
        paths = export.write_export(
            export.export_base(base),
            m,
            run,
            est,
            w.report,
            chart_png=grab_png(w.results.charts),
            unit=w.unit,
            target_text=resolved.text if resolved else "none",
            command=w.command_line(),
            flags=w.runtime_flags_text(),
        )
        w.statusBar().showMessage(f"Exported {', '.join(p.name for p in paths)}", 5000)
        return paths
