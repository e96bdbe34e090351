"""One GPU card of the side panel: name, a memory bar (used by others / this plan / free), utilisation,
temperature, processes, a used-memory sparkline and the plan's verdict on that GPU.

The sparkline is painted with one ``QPainter.drawPolyline`` per run of readings (no plot widget: a pyqtgraph
``PlotWidget`` per card cost ~10 ms to build and more to lay out, so 4,097 cards took minutes, issue 18); a
card is a handful of labels and two painted widgets.
"""

from __future__ import annotations

import numpy as np
from PySide6.QtCore import QPointF, QRectF, QSize, Qt, Signal
from PySide6.QtGui import QFont, QMouseEvent, QPainter, QPalette, QPen, QPolygonF
from PySide6.QtWidgets import QFrame, QLabel, QSizePolicy, QVBoxLayout, QWidget

from gpumem_gui.core import SizeUnit, Verdict, fmt_bytes
from gpumem_gui.hardware.snapshot import GpuDevice
from gpumem_gui.ui.cluster_delegate import paint_memory_bar
from gpumem_gui.ui.report import verdict_words
from gpumem_gui.ui.theme import status_color

SPARKLINE_WINDOW_S = 60.0  # the sparkline shows at least the last minute

# A sparkline is ~200 px wide: more points than this only cost drawing time (a 5-minute history polled at
# 20 Hz is 6,000 points per GPU)
SPARKLINE_POINTS = 240


def sparkline_points(
    xs: np.ndarray, ys: np.ndarray, max_points: int = SPARKLINE_POINTS
) -> tuple[np.ndarray, np.ndarray]:
    """At most ``max_points`` points of a series: consecutive buckets, each drawn at its newest time with its
    highest value (a short spike of used memory stays visible); a bucket of gaps only stays a gap."""
    n = len(xs)
    if n <= max_points:
        return xs, ys
    starts = (np.arange(max_points) * n) // max_points
    ends = np.append(starts[1:], n)
    return xs[ends - 1], np.fmax.reduceat(ys, starts)


class Sparkline(QWidget):
    """Used memory over time as a line: x from the oldest shown reading (at least a minute back) to now,
    y from 0 to the GPU's total; a reading without a value (``nan``) breaks the line."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.xs = np.zeros(0)
        self.ys = np.zeros(0)
        self.y_max = 1.0
        self.setFixedHeight(30)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    def sizeHint(self) -> QSize:
        return QSize(200, 30)

    def set_data(self, xs: np.ndarray, ys: np.ndarray, y_max: float) -> None:
        """``xs``: seconds before now (<= 0); ``ys``: used memory (``nan``: no value); ``y_max``: the top."""
        self.xs, self.ys, self.y_max = xs, ys, max(float(y_max), 1e-9)
        self.update()

    def polylines(self) -> list[QPolygonF]:
        """The line in widget coordinates, one polygon per run of finite readings."""
        if not len(self.xs):
            return []
        w, h = max(1, self.width() - 2), max(1, self.height() - 2)
        x0 = min(-SPARKLINE_WINDOW_S, float(self.xs.min()))
        px = 1 + (self.xs - x0) / (0 - x0) * w
        py = 1 + h - np.clip(self.ys / self.y_max, 0, 1) * h
        finite = np.isfinite(py)
        runs: list[QPolygonF] = []
        start = None
        for i, ok in enumerate([*finite.tolist(), False]):
            if ok and start is None:
                start = i
            elif not ok and start is not None:
                runs.append(QPolygonF([QPointF(float(px[j]), float(py[j])) for j in range(start, i)]))
                start = None
        return runs

    def paintEvent(self, event: object) -> None:
        p = QPainter(self)
        pal = self.palette()
        p.fillRect(self.rect(), pal.color(QPalette.ColorRole.Base))
        p.setRenderHint(QPainter.RenderHint.Antialiasing, True)
        p.setPen(QPen(pal.color(QPalette.ColorRole.Highlight), 1.5))
        for poly in self.polylines():
            if poly.size() == 1:
                p.drawPoint(poly.at(0))
            else:
                p.drawPolyline(poly)
        p.end()


class MemoryBar(QWidget):
    """A horizontal bar: used by others | this plan | free. A plan larger than the free memory overflows."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.total = 0
        self.used = 0
        self.plan = 0
        self.setMinimumHeight(16)
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)

    def sizeHint(self) -> QSize:
        return QSize(200, 16)

    def set_values(self, total: int, used: int, plan: int) -> None:
        self.total, self.used, self.plan = max(0, total), max(0, used), max(0, plan)
        self.update()

    def paintEvent(self, event: object) -> None:
        p = QPainter(self)
        paint_memory_bar(p, self.palette(), QRectF(self.rect()), self.total, self.used, self.plan)
        p.end()


class GpuCard(QFrame):
    """One GPU (or MIG instance).

    Signals:
        clicked(str): the device key (``"0"``, ``"0:1"``).
    """

    clicked = Signal(str)

    def __init__(self, key: str, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.key = key
        self.setObjectName("gpuCard")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setCursor(Qt.CursorShape.PointingHandCursor)
        self.setToolTip("Click to make this GPU the target of the charts")
        self.title = QLabel()
        bold = QFont(self.title.font())
        bold.setBold(True)
        self.title.setFont(bold)
        self.title.setWordWrap(True)
        self.bar = MemoryBar()
        self.memory = QLabel()
        self.memory.setWordWrap(True)
        self.stats = QLabel()
        self.stats.setWordWrap(True)
        self.verdict = QLabel()
        self.verdict.setWordWrap(True)
        self.spark = Sparkline()
        self.spark.setToolTip("Used memory, last 5 minutes")
        v = QVBoxLayout(self)
        v.setContentsMargins(8, 5, 8, 5)
        v.setSpacing(2)
        for w in (self.title, self.bar, self.memory, self.stats, self.verdict, self.spark):
            v.addWidget(w)
        self.selected = False

    def set_selected(self, on: bool) -> None:
        if on == self.selected and self.lineWidth() == (2 if on else 1):
            return  # unchanged: no relayout, no repaint (every estimate sets it)
        self.selected = on
        self.setFrameShadow(QFrame.Shadow.Sunken if on else QFrame.Shadow.Plain)
        self.setLineWidth(2 if on else 1)
        self.setBackgroundRole(QPalette.ColorRole.AlternateBase if on else QPalette.ColorRole.Window)
        self.setAutoFillBackground(on)

    def mousePressEvent(self, event: QMouseEvent) -> None:
        if event.button() == Qt.MouseButton.LeftButton:
            self.clicked.emit(self.key)
        super().mousePressEvent(event)

    def show_device(self, d: GpuDevice, unit: SizeUnit) -> None:
        kind = "MIG " if d.is_mig_instance else ""
        cuda = f" · CUDA {d.cuda_index}" if d.cuda_index is not None else " · hidden from CUDA"
        self.title.setText(f"{kind}GPU {d.key} · {d.name}")
        self.title.setToolTip(f"{d.uuid or ''}\nPCI {d.pci_bus_id or '?'}{cuda}")
        if d.error:
            self.memory.setText(d.error)
            self.stats.setText("")
            self.bar.set_values(0, 0, 0)
            return
        if d.total_bytes is None:
            self.memory.setText("memory not reported by the driver")
        else:
            f = unit.factor
            cuda = d.cuda_total_bytes or d.total_bytes
            self.memory.setText(
                f"used {(d.used_bytes or 0) / f:.1f} · free {(d.free_bytes or 0) / f:.1f} "
                f"of {fmt_bytes(d.total_bytes, unit, 1)} (nvidia-smi; CUDA {cuda / f:.1f})"
            )
        parts = []
        if d.utilization_percent is not None:
            parts.append(f"util {d.utilization_percent} %")
        if d.temperature_c is not None:
            parts.append(f"{d.temperature_c} °C")
        if d.processes is None:
            parts.append("processes: not allowed to list")
        else:
            parts.append(f"{len(d.processes)} process{'es' if len(d.processes) != 1 else ''}")
        self.stats.setText(" · ".join(parts))

    def show_verdict(self, v: Verdict | None, d: GpuDevice, unit: SizeUnit, basis: str) -> None:
        total = d.total_bytes or 0
        used = d.used_bytes or 0
        if v is None or d.error or d.total_bytes is None:
            self.verdict.setText("" if d.error else "no plan to check")
            self.bar.set_values(total, used, 0)
            return
        against = "free now" if basis == "free" else "CUDA's total"
        words = verdict_words(v, unit)
        self.verdict.setText(f"{words[0].upper()}{words[1:]} ({against})")
        pal = self.verdict.palette()
        pal.setColor(QPalette.ColorRole.WindowText, status_color(self.palette(), v.fits))
        self.verdict.setPalette(pal)
        self.bar.set_values(total, used, v.needed_bytes)
        self.bar.setToolTip(
            f"used by others {fmt_bytes(used, unit)}\nthis plan {fmt_bytes(v.needed_bytes, unit)}\n"
            f"free now {fmt_bytes(d.free_bytes or 0, unit)} of {fmt_bytes(total, unit)}"
        )

    def show_history(
        self, points: tuple[tuple[float, int | None], ...], total: int | None, unit: SizeUnit
    ) -> None:
        if not points:
            self.spark.set_data(np.zeros(0), np.zeros(0), 1.0)
            return
        n = len(points)
        xs = np.fromiter((t for t, _ in points), dtype=float, count=n) - points[-1][0]
        ys = np.fromiter((np.nan if u is None else u for _, u in points), dtype=float, count=n) / unit.factor
        xs, ys = sparkline_points(xs, ys)
        top = total or max(1, int(np.nanmax(ys) * unit.factor) if np.isfinite(ys).any() else 1)
        self.spark.set_data(xs, ys, top / unit.factor)
