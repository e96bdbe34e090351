"""What every chart is built from: a plot widget that follows the system palette, stacked bars with a
legend, labelled reference lines, and setters that touch pyqtgraph only when a value changes (each of its
calls re-lays an axis or the whole plot out)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pyqtgraph as pg
import PySide6.QtOpenGL  # pyqtgraph's hidden imports (it imports them itself): named for freezers
import PySide6.QtOpenGLWidgets  # noqa: F401
from PySide6.QtCore import QEvent, Qt
from PySide6.QtGui import QColor, QPainter, QPalette, QPen, QPixmap
from PySide6.QtWidgets import QGraphicsItem, QHBoxLayout, QLabel, QSizePolicy, QVBoxLayout, QWidget

from gpumem_gui.core import Component
from gpumem_gui.ui.bars_item import Segment, StackedBarsItem
from gpumem_gui.ui.theme import series_color

pg.setConfigOptions(antialias=True)  # smooth lines and text in every chart (set once, before any is built)

BAR_WIDTH = 0.62
LEGEND_TEXT_WIDTH = 150  # px; longer series names are elided (full name in the tooltip)


# "Nice" tops for an axis: 1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8 times a power of ten
_NICE_STEPS = (1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0)


def nice_ceil(x: float) -> float:
    """The smallest "nice" number at least ``x`` (for ``x`` > 0). An axis whose top moves to one only when a
    value crosses it keeps its ticks, and its drawing, across most form changes."""
    if not x > 0 or not math.isfinite(x):
        return x
    base = 10.0 ** math.floor(math.log10(x))
    return next((m * base for m in _NICE_STEPS if m * base >= x * (1 - 1e-12)), 10 * base)


def text_color_of(palette: QPalette) -> QColor:
    return palette.color(QPalette.ColorRole.WindowText)


def style_axes(plot: pg.PlotItem, palette: QPalette) -> None:
    fg = text_color_of(palette)
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


def set_axis_label(plot: pg.PlotItem, axis: str, text: str, color: QColor) -> None:
    """Set (or, with no text, hide) an axis label only when it changes: pyqtgraph re-lays the axis out on
    every call."""
    item = plot.getAxis(axis)
    if not text:
        if item.label.isVisible():
            item.showLabel(False)
        return
    if item.labelText != text or not item.label.isVisible():
        plot.setLabel(axis, text, color=color.name())


def set_ticks(plot: pg.PlotItem, ticks: list[tuple[float, str]], shown: list[tuple[float, str]]) -> bool:
    """Set the bottom axis's fixed ticks unless they are ``shown`` already: each call throws the axis's
    drawing away. Returns whether they were set."""
    if ticks == shown:
        return False
    plot.getAxis("bottom").setTicks([ticks])
    return True


def set_title(plot: pg.PlotItem, text: str, color: QColor) -> None:
    """Set the title only when it (or its color) changes: each call re-lays the whole plot out."""
    if plot.titleLabel.text != text or plot.titleLabel.opts.get("color") != color.name():
        plot.setTitle(text, color=color.name())


def set_line(line: pg.InfiniteLine, value: float, text: str) -> None:
    """Show ``line`` at ``value`` with ``text`` (shown first: a hidden label ignores text updates)."""
    line.show()
    line.setValue(value)
    line.label.setFormat(text)
    line.label.valueChanged()


def ref_line(
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


class ChartAxis(pg.AxisItem):
    """An axis whose tick and grid lines are opaque, their colour blended with the chart's background
    (:attr:`backdrop`) as the translucent pen would have been, and which lies behind the plotted items (the
    grid under the bars, not across them). Qt draws a 1-pixel line with a translucent pen ~30x slower than an
    opaque one (~0.1 ms; a grid is ~40 lines): that was most of a chart's paint (issue 18)."""

    def __init__(self, orientation: str) -> None:
        super().__init__(orientation)
        self.backdrop = QColor("white")

    def generateDrawSpecs(self, p: QPainter) -> tuple | None:
        specs = super().generateDrawSpecs(p)
        if specs is None:
            return None
        axis, ticks, texts = specs
        return (self._opaque(axis[0]), *axis[1:]), [(self._opaque(pen), a, b) for pen, a, b in ticks], texts

    def _opaque(self, pen: QPen) -> QPen:
        c = pen.color()
        a = c.alphaF()
        if a >= 1.0:
            return pen
        b = self.backdrop
        out = QPen(pen)
        out.setColor(
            QColor.fromRgbF(
                c.redF() * a + b.redF() * (1 - a),
                c.greenF() * a + b.greenF() * (1 - a),
                c.blueF() * a + b.blueF() * (1 - a),
            )
        )
        return out


class Chart(pg.GraphicsLayoutWidget):
    """A GraphicsLayoutWidget whose background, axes and texts follow the palette."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setMinimumSize(220, 180)
        axes = {name: ChartAxis(name) for name in ("left", "bottom")}  # those shown (axisItems shows them)
        # menus never built (~15 ms)
        self.plot: pg.PlotItem = self.addPlot(row=0, col=0, enableMenu=False, axisItems=axes)
        self.plot.setMenuEnabled(False)
        self.plot.hideButtons()
        self.plot.setMouseEnabled(x=False, y=False)
        self.plot.showGrid(x=False, y=True, alpha=0.25)
        # an axis (its ticks, labels and grid) is drawn into a pixmap when it changes and copied after that:
        # replaying its recorded picture was ~1 ms a paint per axis (issue 18); and it lies behind the plot
        for axis in axes.values():
            axis.setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
            axis.setZValue(self.plot.vb.zValue() - 1)
        self._apply_palette()

    def _apply_palette(self) -> None:
        pal = self.palette()
        self.setBackground(pal.color(QPalette.ColorRole.Base))
        for name in ("left", "bottom"):
            axis = self.plot.getAxis(name)
            if isinstance(axis, ChartAxis):
                axis.backdrop = pal.color(QPalette.ColorRole.Base)
        style_axes(self.plot, pal)

    def changeEvent(self, event: QEvent) -> None:
        if event.type() in (QEvent.Type.PaletteChange, QEvent.Type.ApplicationPaletteChange) and hasattr(
            self, "plot"
        ):
            self._apply_palette()
        super().changeEvent(event)

    def text_color(self) -> QColor:
        return text_color_of(self.palette())


class StackedBars:
    """Stacked bars, a segment per component key, as one :class:`StackedBarsItem` in a plot (and a legend)."""

    def __init__(self, plot: pg.PlotItem, legend: ChartLegend | None = None) -> None:
        self._plot = plot
        self._legend = legend
        self.item = StackedBarsItem(BAR_WIDTH)
        plot.addItem(self.item)
        self._heights: dict[str, list[float]] = {}
        self._legend_keys: list[tuple[str, str]] = []
        self.tops: np.ndarray = np.zeros(0)

    def set_data(self, stacks: Sequence[Sequence[Component]], factor: float) -> None:
        n = len(stacks)
        order: dict[str, str] = {}
        for comps in stacks:
            for c in comps:
                order.setdefault(c.key, c.label)
        sums: list[dict[str, int]] = []
        for comps in stacks:
            per: dict[str, int] = {}
            for c in comps:
                per[c.key] = per.get(c.key, 0) + c.bytes
            sums.append(per)
        bottoms = [0.0] * n
        segments: list[Segment] = []
        heights: dict[str, list[float]] = {}
        for key, label in order.items():
            color = series_color(key)
            hs = heights[key] = [sums[i].get(key, 0) / factor for i in range(n)]
            for i, h in enumerate(hs):
                segments.append(Segment(key, label, color, float(i), bottoms[i], h))
                bottoms[i] += h
        self.item.set_segments(segments)  # unchanged segments: nothing is redrawn
        self._heights = heights
        self.tops = np.array(bottoms, dtype=float)
        legend_keys = list(order.items())
        if self._legend is not None and legend_keys != self._legend_keys:
            self._legend.set_entries([(series_color(k), label) for k, label in legend_keys])
        self._legend_keys = legend_keys

    def heights(self, key: str) -> list[float]:
        """Bar heights of one component (in the display unit), for tests."""
        return list(self._heights.get(key, []))

    def keys(self) -> list[str]:
        return list(self._heights)


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
