"""The results' 2 x 2 grid (breakdown | phases / sweep | changes), whose charts are built after the first
paint and drawn only while they are on screen.

pyqtgraph takes ~0.15-0.45 s to import (it loads QtSvg and QtTest, and builds its own wrappers), more than
everything else the window needs before its first paint. So the grid starts with plain placeholders of the
charts' size and colour; the first paint of the grid schedules :meth:`ChartSlots.build` for right after that
paint pass, which imports :mod:`gpumem_gui.ui.charts`, puts the charts in, and draws what arrived meanwhile.
Reading :attr:`breakdown`, :attr:`phases` or :attr:`sweep` builds them at once (tests, the self-test and an
export never wait for a paint).

A chart that is not on screen (a hidden or minimised window, the results collapsed) is not redrawn: the
newest data is kept and drawn when it is shown again, or when a chart is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QEvent, Qt, QTimer
from PySide6.QtGui import QPalette, QShowEvent
from PySide6.QtWidgets import QGridLayout, QVBoxLayout, QWidget

from gpumem_gui.core import Estimate, SizeUnit

if TYPE_CHECKING:
    from gpumem_gui.ui.charts import BreakdownChart, PhaseChart, SweepChart

CHART_MIN_SIZE = (220, 180)  # px, as gpumem_gui.ui.chart_base.Chart sets it: the layout does not jump


@dataclass(frozen=True)
class _EstimateArgs:
    est: Estimate
    unit: SizeUnit
    capacity_bytes: int | None
    free_bytes: int | None


class _Placeholder(QWidget):
    """An empty chart-sized area in the charts' background colour, until the chart takes its place."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setMinimumSize(*CHART_MIN_SIZE)
        self.setAutoFillBackground(True)
        self.setBackgroundRole(QPalette.ColorRole.Base)


class ChartSlots(QWidget):
    """The grid. ``changes`` goes bottom right; ``below_sweep`` (the sweep's choice) under the sweep;
    ``below_breakdown`` (the per-rank table of a training run) under the per-GPU bars."""

    def __init__(
        self,
        changes: QWidget,
        below_sweep: QWidget,
        below_breakdown: QWidget | None = None,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self._charts: tuple[BreakdownChart, PhaseChart, SweepChart] | None = None
        self._estimate: _EstimateArgs | None = None  # drawn once the charts exist and are on screen
        self._sweep: tuple[tuple[Any, ...], dict[str, Any]] | None = None
        self._sweep_message: str | None = None
        self._build_scheduled = False
        self.builds = 0  # how many times the charts were built (once; tests count it)
        self.grid = QGridLayout(self)
        self.grid.setContentsMargins(0, 0, 0, 0)
        self.grid.setSpacing(4)
        self._slots = [_Placeholder() for _ in range(3)]
        sweep_box = QWidget()
        self._sweep_layout = QVBoxLayout(sweep_box)
        self._sweep_layout.setContentsMargins(0, 0, 0, 0)
        self._sweep_layout.setSpacing(2)
        self._sweep_layout.addWidget(self._slots[2], 1)
        self._sweep_layout.addWidget(below_sweep, 0, Qt.AlignmentFlag.AlignRight)
        if below_breakdown is None:
            self.grid.addWidget(self._slots[0], 0, 0)
        else:
            breakdown_box = QWidget()
            box = QVBoxLayout(breakdown_box)
            box.setContentsMargins(0, 0, 0, 0)
            box.setSpacing(2)
            box.addWidget(self._slots[0], 1)
            box.addWidget(below_breakdown, 0)
            self.grid.addWidget(breakdown_box, 0, 0)
        self.grid.addWidget(self._slots[1], 0, 1)
        self.grid.addWidget(sweep_box, 1, 0)
        self.grid.addWidget(changes, 1, 1)
        for i in (0, 1):
            self.grid.setColumnStretch(i, 1)
            self.grid.setRowStretch(i, 1)

    # ---- building ----------------------------------------------------------------------------------------

    @property
    def built(self) -> bool:
        return self._charts is not None

    def event(self, event: QEvent) -> bool:
        if event.type() == QEvent.Type.Paint and self._charts is None and not self._build_scheduled:
            self._build_scheduled = True  # after this paint pass: the window is on screen first
            QTimer.singleShot(0, self, self.build)
        return super().event(event)

    def build(self) -> tuple[BreakdownChart, PhaseChart, SweepChart]:
        """Import pyqtgraph, put the charts in place of the placeholders and draw what is pending."""
        if self._charts is None:
            from gpumem_gui.ui.charts import BreakdownChart, PhaseChart, SweepChart

            charts = (BreakdownChart(), PhaseChart(), SweepChart())
            self.setUpdatesEnabled(False)
            try:
                for slot, chart in zip(self._slots, charts, strict=True):
                    layout = slot.parentWidget().layout() if slot.parentWidget() is not self else self.grid
                    layout.replaceWidget(slot, chart)
                    slot.deleteLater()
            finally:
                self.setUpdatesEnabled(True)
            self._charts = charts
            self.builds += 1
            self.flush()
        return self._charts

    @property
    def breakdown(self) -> BreakdownChart:
        return self._ready()[0]

    @property
    def phases(self) -> PhaseChart:
        return self._ready()[1]

    @property
    def sweep(self) -> SweepChart:
        return self._ready()[2]

    def _ready(self) -> tuple[BreakdownChart, PhaseChart, SweepChart]:
        charts = self.build()
        self.flush(force=True)
        return charts

    # ---- drawing -----------------------------------------------------------------------------------------

    def show_estimate(
        self, est: Estimate, unit: SizeUnit, capacity_bytes: int | None, free_bytes: int | None
    ) -> None:
        self._estimate = _EstimateArgs(est, unit, capacity_bytes, free_bytes)
        self.flush()

    def show_sweep(self, *args: Any, **kwargs: Any) -> None:
        """:meth:`SweepChart.show_sweep`'s arguments."""
        self._sweep, self._sweep_message = (args, kwargs), None
        self.flush()

    def show_sweep_progress(self, done: int, total: int) -> None:
        """A long sweep's progress, in the sweep chart's title (on screen only: the sweep replaces it)."""
        if self._charts is not None and self.isVisible():
            self._charts[2].show_progress(done, total)

    def clear_sweep(self, message: str = "") -> None:
        self._sweep, self._sweep_message = None, message
        self.flush()

    def flush(self, force: bool = False) -> None:
        """Draw what is pending, if the charts exist and are on screen (``force``: even when they are not)."""
        if self._charts is None or not (force or self.isVisible()):
            return
        breakdown, phases, sweep = self._charts
        a, self._estimate = self._estimate, None
        if a is not None:
            breakdown.show_estimate(a.est, a.unit, a.capacity_bytes, a.free_bytes)
            phases.show_estimate(a.est, a.unit)
        if self._sweep is not None:
            (args, kwargs), self._sweep = self._sweep, None
            sweep.show_sweep(*args, **kwargs)
        elif self._sweep_message is not None:
            message, self._sweep_message = self._sweep_message, None
            sweep.clear_sweep(message)

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        QTimer.singleShot(0, self, self.flush)  # what arrived while hidden
