"""What every chart is built from: a plot widget that follows the system palette, stacked bars with a
legend, labelled reference lines, and setters that touch pyqtgraph only when a value changes (each of its
calls re-lays an axis or the whole plot out)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent, Qt
from PySide6.QtGui import QColor, QPalette, QPixmap
from PySide6.QtWidgets import QHBoxLayout, QLabel, QSizePolicy, QVBoxLayout, QWidget

from gpumem_gui.core import Component
from gpumem_gui.ui.theme import series_color

BAR_WIDTH = 0.62
LEGEND_TEXT_WIDTH = 150  # px; longer series names are elided (full name in the tooltip)


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


class Chart(pg.GraphicsLayoutWidget):
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
