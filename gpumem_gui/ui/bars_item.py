"""Stacked bars as one graphics item: every segment of every bar is a rectangle painted with ``fillRect``.

The charts used one ``pyqtgraph.BarGraphItem`` per component key (9-17 per chart); each estimate called
``setOpts`` on every one whose segment moved, and each call re-normalised its arrays, rebuilt its picture and
re-announced its bounds: ~0.2 ms a segment, most of a form change's redraw (issue 18). One item holding plain
rectangles is set in one call and painted in one pass; its tooltip names the segment under the mouse.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pyqtgraph as pg
from PySide6.QtCore import QPointF, QRectF, Qt
from PySide6.QtGui import QBrush, QColor, QPainter


@dataclass(frozen=True)
class Segment:
    """One rectangle: bar ``x`` (its centre), from ``y0`` up by ``height`` (data units)."""

    key: str
    label: str
    color: str
    x: float
    y0: float
    height: float


class StackedBarsItem(pg.GraphicsObject):
    """Rectangles ``width`` wide centred on their bar's x; set them all at once with :meth:`set_segments`."""

    def __init__(self, width: float) -> None:
        super().__init__()
        self.width = width
        self.segments: tuple[Segment, ...] = ()
        self._rects: list[tuple[QRectF, QBrush]] = []
        self._brushes: dict[str, QBrush] = {}  # one per color, made once
        self._bounds = QRectF()
        self.sets = 0  # segment sets that changed something (tests count them)

    def set_segments(self, segments: Sequence[Segment]) -> bool:
        """Show ``segments``; False (nothing redrawn) when they are the ones shown."""
        segments = tuple(segments)
        if segments == self.segments:
            return False
        self.prepareGeometryChange()
        self.segments = segments
        half = self.width / 2
        self._rects = [
            (QRectF(s.x - half, s.y0, self.width, s.height), self._brush(s.color))
            for s in segments
            if s.height
        ]
        bounds = QRectF()
        for rect, _ in self._rects:
            bounds = bounds.united(rect)
        self._bounds = bounds
        self.sets += 1
        self.update()
        self.informViewBoundsChanged()
        return True

    def _brush(self, color: str) -> QBrush:
        brush = self._brushes.get(color)
        if brush is None:
            brush = self._brushes[color] = QBrush(QColor(color))
        return brush

    def label_at(self, pos: QPointF) -> str:
        """The label of the segment under ``pos`` (item coordinates), '' when none."""
        for (rect, _), seg in zip(self._rects, (s for s in self.segments if s.height), strict=True):
            if rect.normalized().contains(pos):
                return seg.label
        return ""

    def hoverEvent(self, ev: object) -> None:  # pyqtgraph's hover protocol (its scene delivers these)
        if ev.isExit():  # type: ignore[attr-defined]
            self.setToolTip("")
        else:
            self.setToolTip(self.label_at(ev.pos()))  # type: ignore[attr-defined]

    def boundingRect(self) -> QRectF:
        return self._bounds

    def dataBounds(self, ax: int, frac: float = 1.0, orthoRange: object = None) -> tuple[float, float] | None:
        if self._bounds.isNull():
            return None
        b = self._bounds.normalized()
        return (b.left(), b.right()) if ax == 0 else (b.top(), b.bottom())

    def paint(self, p: QPainter, *args: object) -> None:
        p.setPen(Qt.PenStyle.NoPen)
        for rect, brush in self._rects:
            p.fillRect(rect, brush)
