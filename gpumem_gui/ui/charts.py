"""pyqtgraph charts: memory per GPU (stacked by component), the phase timeline, and the context/batch sweep.

Each chart creates its graphics items once and updates them in place (``BarGraphItem.setOpts``,
``setData``, ``setPos``). Axes, text and background follow the system palette; only the series use the fixed
colors of :mod:`gpumem_gui.ui.theme` (one per component key, the same in every chart).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QHBoxLayout, QWidget

from gpumem_gui.core import Estimate, SizeUnit, SweepPoint, fmt_bytes
from gpumem_gui.ui.chart_base import (
    Chart,
    ChartLegend,
    StackedBars,
    nice_ceil,
    ref_line,
    set_axis_label,
    set_line,
    set_ticks,
    set_title,
)
from gpumem_gui.ui.theme import (
    CAPACITY_COLOR,
    CURRENT_COLOR,
    FITS_COLOR,
    FREE_COLOR,
    MISSES_COLOR,
    PEAK_COLOR,
    RESERVED_COLOR,
)


class BreakdownChart(QWidget):
    """Memory per GPU, stacked by component, with the target's capacity and (local GPUs) free memory."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.view = Chart()
        self.plot = self.view.plot
        self.plot.setTitle("Memory per GPU")
        self.view.setMinimumWidth(160)
        self.legend = ChartLegend()
        h = QHBoxLayout(self)
        h.setContentsMargins(0, 0, 0, 0)
        h.setSpacing(0)
        h.addWidget(self.view, 1)
        h.addWidget(self.legend, 0)
        self.setAutoFillBackground(True)
        self.setBackgroundRole(QPalette.ColorRole.Base)
        self.bars = StackedBars(self.plot, self.legend)
        base = self.palette().color(QPalette.ColorRole.Base)
        self.capacity_line = ref_line(CAPACITY_COLOR, "capacity", fill=base)
        self.free_line = ref_line(FREE_COLOR, "free now", style=Qt.PenStyle.DotLine, position=0.95, fill=base)
        self.free_line.label.anchors = [(1, 0), (1, 0)]
        self.plot.addItem(self.capacity_line, ignoreBounds=True)
        self.plot.addItem(self.free_line, ignoreBounds=True)
        self._ticks: list[tuple[float, str]] = []

    def text_color(self) -> QColor:
        return self.view.text_color()

    def show_estimate(
        self,
        est: Estimate,
        unit: SizeUnit,
        capacity_bytes: int | None = None,
        free_bytes: int | None = None,
    ) -> None:
        factor = unit.factor
        stacks = [g.components for g in est.per_gpu]
        self.bars.set_data(stacks, factor)
        short = len(est.per_gpu) > 2  # many bars: numbers under them, "GPU" once as the axis label
        ticks = [(float(i), str(g.index) if short else f"GPU {g.index}") for i, g in enumerate(est.per_gpu)]
        if set_ticks(self.plot, ticks, self._ticks):
            self._ticks = ticks
        set_axis_label(self.plot, "bottom", "GPU" if short else "", self.text_color())
        set_axis_label(self.plot, "left", unit.value, self.text_color())
        top = float(self.bars.tops.max()) if len(self.bars.tops) else 0.0
        for line, value, name in (
            (self.capacity_line, capacity_bytes, "CUDA total"),
            (self.free_line, free_bytes, "free now"),
        ):
            if value is None:
                line.hide()
            else:
                set_line(line, value / factor, f"{name} {fmt_bytes(value, unit, 1)}")
                top = max(top, value / factor)
        if free_bytes is not None:  # the label under its line, unless that would run into the axis
            low = free_bytes / factor < 0.15 * max(top, 1e-3)
            anchor = (1, 1) if low else (1, 0)
            self.free_line.label.anchors = [anchor, anchor]
            self.free_line.label.updatePosition()
        n = len(stacks)
        self.plot.setXRange(-0.6, n - 0.4, padding=0)
        self.plot.setYRange(0, max(top * 1.08, 1e-3), padding=0)
        self.view.scene().prepareForPaint()  # the new view transform now, not in the paint (see Chart)


class PhaseChart(Chart):
    """One bar per phase (load, prefill, decode / profile, serve), stacked by component; the peak marked."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.plot.setTitle("Phases (most-loaded GPU)")
        self.bars = StackedBars(self.plot)
        self.peak_marker = pg.ScatterPlotItem(size=14, symbol="t", brush=PEAK_COLOR, pen=pg.mkPen(None))
        self.peak_marker.setZValue(30)
        self.peak_text = pg.TextItem(anchor=(0.5, 1.2), color=PEAK_COLOR)
        self.peak_text.setZValue(30)
        self.plot.addItem(self.peak_marker)
        self.plot.addItem(self.peak_text)
        # the caching allocator's reserved peak of each phase, where the allocator model ran: a dash above the
        # phase's stack of live tensors (torch.cuda.max_memory_reserved beside max_memory_allocated)
        self.reserved_marker = pg.ScatterPlotItem(
            size=34, symbol="_", pen=pg.mkPen(RESERVED_COLOR, width=2), brush=pg.mkBrush(RESERVED_COLOR)
        )
        self.reserved_marker.setZValue(25)
        self.reserved_text = pg.TextItem(anchor=(0.25, 1.0), color=RESERVED_COLOR)
        self.reserved_text.setZValue(25)
        self.plot.addItem(self.reserved_marker)
        self.plot.addItem(self.reserved_text)
        self.reserved_levels: list[float] = []
        self.phase_names: list[str] = []
        self.peak_index = -1
        self._ticks: list[tuple[float, str]] = []

    def show_estimate(self, est: Estimate, unit: SizeUnit) -> None:
        factor = unit.factor
        names = list(est.phases)
        self.phase_names = names
        self.bars.set_data([est.phases[n].components for n in names], factor)
        ticks = [(float(i), n) for i, n in enumerate(names)]
        if set_ticks(self.plot, ticks, self._ticks):
            self._ticks = ticks
        set_axis_label(self.plot, "left", unit.value, self.text_color())
        self.peak_index = names.index(est.peak_phase) if est.peak_phase in names else -1
        top = float(self.bars.tops.max()) if len(self.bars.tops) else 0.0
        top = max(top, self._show_reserved(est, names, unit))
        if self.peak_index >= 0:
            y = float(self.bars.tops[self.peak_index])
            self.peak_marker.setData([self.peak_index], [y])
            peak = est.phases[est.peak_phase]
            text = f"peak {fmt_bytes(peak.peak_bytes, unit, 1)}"
            if peak.reserved_bytes is not None and not self.reserved_text.isVisible():
                text += f" · reserved {fmt_bytes(peak.reserved_bytes, unit, 1)}"  # one label, no overlap
            self.peak_text.setText(text)
            self.peak_text.setPos(self.peak_index, max(y, (peak.reserved_bytes or 0) / factor))
            self.peak_marker.show()
            self.peak_text.show()
        else:
            self.peak_marker.hide()
            self.peak_text.hide()
        self.plot.setXRange(-0.6, len(names) - 0.4, padding=0)
        self.plot.setYRange(0, nice_ceil(max(top * 1.22, 1e-3)), padding=0)  # room for the peak's label
        self.scene().prepareForPaint()

    def _show_reserved(self, est: Estimate, names: list[str], unit: SizeUnit) -> float:
        """The reserved dashes (none where no phase has one) and their highest level. That level is labelled
        above its phase (the peak phase where it is as high there: then the peak's own label says it)."""
        at = [(i, est.phases[n].reserved_bytes) for i, n in enumerate(names)]
        shown = [(float(i), r) for i, r in at if r is not None]
        self.reserved_levels = [r / unit.factor for _, r in shown]
        self.reserved_marker.setData([x for x, _ in shown], self.reserved_levels)
        if not shown:
            self.reserved_text.hide()
            return 0.0
        x, r = max(shown, key=lambda t: (t[1], t[0] == self.peak_index))
        if x == self.peak_index:
            self.reserved_text.hide()
        else:
            self.reserved_text.setText(f"reserved {fmt_bytes(r, unit, 1)}")
            self.reserved_text.setPos(x, r / unit.factor)
            self.reserved_text.show()
        return max(self.reserved_levels) * 1.08  # room for its label


class SweepChart(Chart):
    """Total memory against the prompt length (or the batch), with the capacity and the largest that fits."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.plot.setTitle("Sweep")
        self.curve = self.plot.plot([], [], pen=pg.mkPen("#4e79a7", width=2))
        self.points = pg.ScatterPlotItem(size=6, pen=pg.mkPen(None))
        # the same three brush objects every time: the scatter item caches one rendered symbol per brush
        # *object*, so new brushes per sweep re-rendered every point and grew that cache without end
        self._brushes = {
            True: pg.mkBrush(FITS_COLOR),
            False: pg.mkBrush(MISSES_COLOR),
            None: pg.mkBrush("#4e79a7"),
        }
        self.plot.addItem(self.points)
        base = self.palette().color(QPalette.ColorRole.Base)
        self.capacity_line = ref_line(CAPACITY_COLOR, "capacity", position=0.97, fill=base)
        self.capacity_line.label.anchors = [(1, 1), (1, 1)]
        self.max_line = ref_line(FITS_COLOR, "max that fits", angle=90, position=0.85, fill=base)
        self.current_line = ref_line(
            CURRENT_COLOR, "now", angle=90, style=Qt.PenStyle.DotLine, position=0.12, fill=base
        )
        for line in (self.capacity_line, self.max_line, self.current_line):
            self.plot.addItem(line, ignoreBounds=True)
        self.data: list[SweepPoint] = []
        self.over = "seq"

    def show_progress(self, done: int, total: int) -> None:
        """A sweep that takes a while: how far it is (the next :meth:`show_sweep` sets the title back)."""
        set_title(self.plot, f"Working out the sweep: {done:,} of {total:,} points…", self.text_color())

    def clear_sweep(self, message: str = "") -> None:
        self.data = []
        self.curve.setData([], [])
        self.points.setData([], [])
        for line in (self.capacity_line, self.max_line, self.current_line):
            line.hide()
        set_title(self.plot, message or "Sweep", self.text_color())

    def show_sweep(
        self,
        over: str,
        points: Sequence[SweepPoint],
        unit: SizeUnit,
        *,
        capacity_bytes: int | None,
        max_fit: int | None,
        current: int,
        what: str | None = None,
    ) -> None:
        self.data = list(points)
        self.over = over
        factor = unit.factor
        xs = np.array([p.x for p in points], dtype=float)
        ys = np.array([p.total_bytes / factor for p in points], dtype=float)
        self.curve.setData(xs, ys)
        brushes = [self._brushes[p.fits] for p in points]
        self.points.setData(xs, ys, brush=brushes)
        what = what or ("prompt tokens" if over == "seq" else "batch (sequences)")
        set_title(self.plot, f"Total memory against {what}", self.text_color())
        set_axis_label(self.plot, "left", unit.value, self.text_color())
        set_axis_label(self.plot, "bottom", what, self.text_color())
        top = float(ys.max()) if len(ys) else 0.0
        if capacity_bytes is not None:
            label = f"CUDA total {fmt_bytes(capacity_bytes, unit, 1)}"
            set_line(self.capacity_line, capacity_bytes / factor, label)
            top = max(top, capacity_bytes / factor)
        else:
            self.capacity_line.hide()
        x_max = float(xs.max()) if len(xs) else 1.0
        if max_fit is not None and max_fit <= x_max * 1.0001:
            set_line(self.max_line, max_fit, f"max {max_fit:,}")
        else:
            self.max_line.hide()
        set_line(self.current_line, current, f"now {current:,}")
        self.plot.setXRange(0, x_max, padding=0.02)
        self.plot.setYRange(0, nice_ceil(max(top * 1.1, 1e-3)), padding=0)
        self.scene().prepareForPaint()
