"""pyqtgraph charts: memory per GPU (stacked by component), the phase timeline, and the context/batch sweep.

Each chart creates its graphics items once and updates them in place (``BarGraphItem.setOpts``,
``setData``, ``setPos``). Axes, text and background follow the system palette; only the series use the fixed
colors of :mod:`gpumem_gui.ui.theme` (one per component key, the same in every chart).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent, Qt
from PySide6.QtGui import QColor, QPalette, QPixmap
from PySide6.QtWidgets import QHBoxLayout, QLabel, QSizePolicy, QVBoxLayout, QWidget

from gpumem_gui.core import Component, Estimate, SizeUnit, SweepPoint, fmt_bytes
from gpumem_gui.ui.theme import (
    CAPACITY_COLOR,
    CURRENT_COLOR,
    FITS_COLOR,
    FREE_COLOR,
    MISSES_COLOR,
    PEAK_COLOR,
    series_color,
)

BAR_WIDTH = 0.62
LEGEND_TEXT_WIDTH = 150  # px; longer series names are elided (full name in the tooltip)


def _text_color(palette: QPalette) -> QColor:
    return palette.color(QPalette.ColorRole.WindowText)


def _style_axes(plot: pg.PlotItem, palette: QPalette) -> None:
    fg = _text_color(palette)
    grid = QColor(fg)
    grid.setAlpha(60)
    for name in ("left", "bottom", "right", "top"):
        axis = plot.getAxis(name)
        axis.setPen(pg.mkPen(grid))
        axis.setTextPen(pg.mkPen(fg))
    plot.titleLabel.setAttr("color", fg.name())
    title = plot.titleLabel.text
    if title:
        plot.setTitle(title, color=fg.name())


def _set_axis_label(plot: pg.PlotItem, axis: str, text: str, color: QColor) -> None:
    """Set (or, with no text, hide) an axis label only when it changes: pyqtgraph re-lays the axis out on
    every call."""
    item = plot.getAxis(axis)
    if not text:
        if item.label.isVisible():
            item.showLabel(False)
        return
    if item.labelText != text or not item.label.isVisible():
        plot.setLabel(axis, text, color=color.name())


def _set_ticks(plot: pg.PlotItem, ticks: list[tuple[float, str]], shown: list[tuple[float, str]]) -> bool:
    """Set the bottom axis's fixed ticks unless they are ``shown`` already: each call throws the axis's
    drawing away. Returns whether they were set."""
    if ticks == shown:
        return False
    plot.getAxis("bottom").setTicks([ticks])
    return True


def _set_title(plot: pg.PlotItem, text: str, color: QColor) -> None:
    """Set the title only when it (or its color) changes: each call re-lays the whole plot out."""
    if plot.titleLabel.text != text or plot.titleLabel.opts.get("color") != color.name():
        plot.setTitle(text, color=color.name())


def _set_line(line: pg.InfiniteLine, value: float, text: str) -> None:
    """Show ``line`` at ``value`` with ``text`` (shown first: a hidden label ignores text updates)."""
    line.show()
    line.setValue(value)
    line.label.setFormat(text)
    line.label.valueChanged()


def _line(
    color: str,
    label: str,
    angle: int = 0,
    style: Qt.PenStyle = Qt.PenStyle.DashLine,
    position: float | None = None,
    fill: QColor | None = None,
) -> pg.InfiniteLine:
    """A dashed reference line with a label; ``fill`` (the palette's base color) keeps the label readable
    where it crosses the bars."""
    if position is None:
        position = 0.93 if angle == 90 else 0.05
    opts: dict[str, object] = {"color": color, "position": position, "anchors": [(0, 1), (0, 1)]}
    if fill is not None:
        back = QColor(fill)
        back.setAlpha(215)
        opts["fill"] = pg.mkBrush(back)
    line = pg.InfiniteLine(
        angle=angle, movable=False, pen=pg.mkPen(color, width=2, style=style), label=label, labelOpts=opts
    )
    line.setZValue(20)
    line.hide()
    return line


class _Chart(pg.GraphicsLayoutWidget):
    """A GraphicsLayoutWidget whose background, axes and texts follow the palette."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setMinimumSize(220, 180)
        self.plot: pg.PlotItem = self.addPlot(row=0, col=0, enableMenu=False)  # menus never built (~15 ms)
        self.plot.setMenuEnabled(False)
        self.plot.hideButtons()
        self.plot.setMouseEnabled(x=False, y=False)
        self.plot.showGrid(x=False, y=True, alpha=0.25)
        self._apply_palette()

    def _apply_palette(self) -> None:
        pal = self.palette()
        self.setBackground(pal.color(QPalette.ColorRole.Base))
        _style_axes(self.plot, pal)

    def changeEvent(self, event: QEvent) -> None:
        if event.type() in (QEvent.Type.PaletteChange, QEvent.Type.ApplicationPaletteChange) and hasattr(
            self, "plot"
        ):
            self._apply_palette()
        super().changeEvent(event)

    def text_color(self) -> QColor:
        return _text_color(self.palette())


class StackedBars:
    """One ``BarGraphItem`` per component key, stacked per category, kept in a plot (and a legend)."""

    def __init__(self, plot: pg.PlotItem, legend: ChartLegend | None = None) -> None:
        self._plot = plot
        self._legend = legend
        self.items: dict[str, pg.BarGraphItem] = {}
        self._legend_keys: list[tuple[str, str]] = []
        self.tops: np.ndarray = np.zeros(0)

    def set_data(self, stacks: Sequence[Sequence[Component]], factor: float) -> None:
        n = len(stacks)
        x = np.arange(n, dtype=float)
        order: dict[str, str] = {}
        for comps in stacks:
            for c in comps:
                order.setdefault(c.key, c.label)
        bottoms = np.zeros(n)
        for key in order:
            heights = np.array(
                [sum(c.bytes for c in comps if c.key == key) / factor for comps in stacks], dtype=float
            )
            item = self.items.get(key)
            if item is None:
                color = series_color(key)
                item = pg.BarGraphItem(
                    x=x, height=heights, y0=bottoms.copy(), width=BAR_WIDTH, brush=color, pen=pg.mkPen(None)
                )
                item.setToolTip(order[key])
                self.items[key] = item
                self._plot.addItem(item)
            elif not self._same(item, x, heights, bottoms):  # an unchanged segment is not redrawn
                item.setOpts(x=x, height=heights, y0=bottoms.copy(), width=BAR_WIDTH)
            bottoms = bottoms + heights
        for key in [k for k in self.items if k not in order]:
            self._plot.removeItem(self.items.pop(key))
        self.tops = bottoms
        legend_keys = list(order.items())
        if self._legend is not None and legend_keys != self._legend_keys:
            self._legend.set_entries([(series_color(k), label) for k, label in legend_keys])
        self._legend_keys = legend_keys

    @staticmethod
    def _same(item: pg.BarGraphItem, x: np.ndarray, heights: np.ndarray, bottoms: np.ndarray) -> bool:
        opts = item.opts
        return all(
            isinstance(a, np.ndarray) and a.shape == b.shape and bool(np.array_equal(a, b))
            for a, b in ((opts.get("x"), x), (opts.get("height"), heights), (opts.get("y0"), bottoms))
        )

    def heights(self, key: str) -> list[float]:
        """Bar heights of one component (in the display unit), for tests."""
        item = self.items.get(key)
        return [] if item is None else [float(h) for h in np.atleast_1d(item.opts["height"])]

    def keys(self) -> list[str]:
        return list(self.items)


class ChartLegend(QWidget):
    """A legend as plain Qt widgets (color swatch + label per series), beside a chart; follows the palette."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._layout = QVBoxLayout(self)
        self._layout.setContentsMargins(4, 28, 4, 4)
        self._layout.setSpacing(2)
        self._layout.addStretch(1)
        self.entries: list[tuple[str, str]] = []
        self.setSizePolicy(QSizePolicy.Policy.Maximum, QSizePolicy.Policy.Preferred)

    def set_entries(self, entries: list[tuple[str, str]]) -> None:
        """``(color, label)`` per series, top to bottom as the stack is drawn bottom to top."""
        while self._layout.count() > 1:
            item = self._layout.takeAt(0)
            if item.widget() is not None:
                item.widget().deleteLater()
        self.entries = list(entries)
        size = self.fontMetrics().height() - 4
        for color, label in reversed(self.entries):  # the top of the stack first, as on screen
            row = QWidget()
            h = QHBoxLayout(row)
            h.setContentsMargins(0, 0, 0, 0)
            h.setSpacing(5)
            pix = QPixmap(size, size)
            pix.fill(QColor(color))
            swatch = QLabel()
            swatch.setPixmap(pix)
            shown = self.fontMetrics().elidedText(label, Qt.TextElideMode.ElideRight, LEGEND_TEXT_WIDTH)
            text = QLabel(shown)
            text.setToolTip(label)
            h.addWidget(swatch)
            h.addWidget(text, 1)
            self._layout.insertWidget(self._layout.count() - 1, row)


class BreakdownChart(QWidget):
    """Memory per GPU, stacked by component, with the target's capacity and (local GPUs) free memory."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.view = _Chart()
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
        self.capacity_line = _line(CAPACITY_COLOR, "capacity", fill=base)
        self.free_line = _line(FREE_COLOR, "free now", style=Qt.PenStyle.DotLine, position=0.95, fill=base)
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
        if _set_ticks(self.plot, ticks, self._ticks):
            self._ticks = ticks
        _set_axis_label(self.plot, "bottom", "GPU" if short else "", self.text_color())
        _set_axis_label(self.plot, "left", unit.value, self.text_color())
        top = float(self.bars.tops.max()) if len(self.bars.tops) else 0.0
        for line, value, name in (
            (self.capacity_line, capacity_bytes, "capacity"),
            (self.free_line, free_bytes, "free now"),
        ):
            if value is None:
                line.hide()
            else:
                _set_line(line, value / factor, f"{name} {fmt_bytes(value, unit, 1)}")
                top = max(top, value / factor)
        if free_bytes is not None:  # the label under its line, unless that would run into the axis
            low = free_bytes / factor < 0.15 * max(top, 1e-3)
            anchor = (1, 1) if low else (1, 0)
            self.free_line.label.anchors = [anchor, anchor]
            self.free_line.label.updatePosition()
        n = len(stacks)
        self.plot.setXRange(-0.6, n - 0.4, padding=0)
        self.plot.setYRange(0, max(top * 1.08, 1e-3), padding=0)


class PhaseChart(_Chart):
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
        self.phase_names: list[str] = []
        self.peak_index = -1
        self._ticks: list[tuple[float, str]] = []

    def show_estimate(self, est: Estimate, unit: SizeUnit) -> None:
        factor = unit.factor
        names = list(est.phases)
        self.phase_names = names
        self.bars.set_data([est.phases[n].components for n in names], factor)
        ticks = [(float(i), n) for i, n in enumerate(names)]
        if _set_ticks(self.plot, ticks, self._ticks):
            self._ticks = ticks
        _set_axis_label(self.plot, "left", unit.value, self.text_color())
        self.peak_index = names.index(est.peak_phase) if est.peak_phase in names else -1
        top = float(self.bars.tops.max()) if len(self.bars.tops) else 0.0
        if self.peak_index >= 0:
            y = float(self.bars.tops[self.peak_index])
            self.peak_marker.setData([self.peak_index], [y])
            self.peak_text.setText(f"peak {fmt_bytes(est.phases[est.peak_phase].peak_bytes, unit, 1)}")
            self.peak_text.setPos(self.peak_index, y)
            self.peak_marker.show()
            self.peak_text.show()
        else:
            self.peak_marker.hide()
            self.peak_text.hide()
        self.plot.setXRange(-0.6, len(names) - 0.4, padding=0)
        self.plot.setYRange(0, max(top * 1.22, 1e-3), padding=0)


class SweepChart(_Chart):
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
        self.capacity_line = _line(CAPACITY_COLOR, "capacity", position=0.97, fill=base)
        self.capacity_line.label.anchors = [(1, 1), (1, 1)]
        self.max_line = _line(FITS_COLOR, "max that fits", angle=90, position=0.85, fill=base)
        self.current_line = _line(
            CURRENT_COLOR, "now", angle=90, style=Qt.PenStyle.DotLine, position=0.12, fill=base
        )
        for line in (self.capacity_line, self.max_line, self.current_line):
            self.plot.addItem(line, ignoreBounds=True)
        self.data: list[SweepPoint] = []
        self.over = "seq"

    def clear_sweep(self, message: str = "") -> None:
        self.data = []
        self.curve.setData([], [])
        self.points.setData([], [])
        for line in (self.capacity_line, self.max_line, self.current_line):
            line.hide()
        _set_title(self.plot, message or "Sweep", self.text_color())

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
        _set_title(self.plot, f"Total memory against {what}", self.text_color())
        _set_axis_label(self.plot, "left", unit.value, self.text_color())
        _set_axis_label(self.plot, "bottom", what, self.text_color())
        top = float(ys.max()) if len(ys) else 0.0
        if capacity_bytes is not None:
            _set_line(
                self.capacity_line, capacity_bytes / factor, f"capacity {fmt_bytes(capacity_bytes, unit, 1)}"
            )
            top = max(top, capacity_bytes / factor)
        else:
            self.capacity_line.hide()
        x_max = float(xs.max()) if len(xs) else 1.0
        if max_fit is not None and max_fit <= x_max * 1.0001:
            _set_line(self.max_line, max_fit, f"max {max_fit:,}")
        else:
            self.max_line.hide()
        _set_line(self.current_line, current, f"now {current:,}")
        self.plot.setXRange(0, x_max, padding=0.02)
        self.plot.setYRange(0, max(top * 1.1, 1e-3), padding=0)
