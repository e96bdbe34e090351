"""The calibration line under the GPU target (issue 32): which saved calibration applies to the plan's GPU,
what it measured, and a button that removes it.

The calibrations are the ones ``gpumem calibrate`` saves (:mod:`gpumem_gui.calibration_store`, shared with the
CLI); the file is read again whenever it changed on disk, so one saved from a terminal applies at the next
estimate. Which calibration applies is the core's answer (the plan's estimate names it in its facts)."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QLabel, QMessageBox, QPushButton, QWidget

from gpumem_gui.calibration_store import CalibrationStore
from gpumem_gui.core import Calibration, GpumemInputError
from gpumem_gui.ui.plan import Plan


class CalibrationRow(QWidget):
    """Shows the calibration a plan used (hidden when none) and removes it on request.

    Signals:
        removed(str): the calibration of that name was removed from the store (the plan must be redone).
    """

    removed = Signal(str)

    def __init__(self, store: CalibrationStore | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.store = store or CalibrationStore()
        self._calibrations: tuple[Calibration, ...] = ()
        self._shown: str | None = None
        self._problem: str | None = (
            None  # the last load's problem (a file kept aside), shown until a plan uses one
        )
        self.label = QLabel()
        self.label.setWordWrap(True)
        self.remove_button = QPushButton("Remove calibration")
        self.remove_button.setToolTip(
            "Remove it from the saved calibrations (gpumem calibrations lists them)"
        )
        self.remove_button.clicked.connect(self._remove)
        row = QHBoxLayout(self)
        row.setContentsMargins(4, 0, 4, 0)
        row.addWidget(self.label, 1)
        row.addWidget(self.remove_button)
        self.setVisible(False)

    @property
    def calibrations(self) -> tuple[Calibration, ...]:
        """The saved calibrations, read again when the file changed since the last read."""
        loaded = self.store.fresh()
        self._calibrations = loaded.calibrations
        self._problem = loaded.problem or self._problem
        return self._calibrations

    def show_plan(self, plan: Plan) -> None:
        """Show the calibration ``plan``'s estimate used, or hide the row when it used none."""
        name = plan.estimate.facts.get("calibration")
        cal = next((c for c in self._calibrations if c.name == name), None)
        self._shown = cal.name if cal is not None else None
        if cal is None:
            if self._problem:
                self._say(f"Calibrations: {self._problem}", removable=False)
            else:
                self.setVisible(False)
            return
        self._problem = None
        self._say(f"Calibration '{cal.name}' applies on this GPU: {cal.summary()}", removable=True)
        tip = [cal.non_torch_formula, cal.allocator_formula, cal.stack.text(), cal.measurement.excerpt[:400]]
        self.label.setToolTip("\n".join(t for t in tip if t))

    def _say(self, text: str, *, removable: bool) -> None:
        self.label.setText(text)
        self.remove_button.setVisible(removable)
        self.setVisible(True)

    def _remove(self) -> None:
        name = self._shown
        if name is None:
            return
        answer = QMessageBox.question(
            self, "Remove calibration", f"Remove the calibration '{name}' from the saved calibrations?"
        )
        if answer != QMessageBox.StandardButton.Yes:
            return
        try:
            self.store.remove(name)
        except GpumemInputError as e:
            self._say(f"Cannot remove '{name}': {e}", removable=False)
            return
        _ = self.calibrations  # the store wrote the file: read again
        self._shown = None
        self.setVisible(False)
        self.removed.emit(name)
