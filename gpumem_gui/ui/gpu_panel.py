"""The GPU side panel: one card per GPU or MIG instance, fed only by snapshots from the poller's signal.

Each card shows the name, a memory bar (used by others / what this plan would take / free), utilisation,
temperature, process count, a used-memory sparkline, and the plan's verdict on that GPU against its free
memory now (or its total, with the switch). Clicking a card makes it the chart's target. The panel never
talks to NVML and never computes memory: the window injects an *evaluator* (a function over the core) that
gives the verdict for one device. The source selector on top switches to the cluster page
(:class:`~gpumem_gui.ui.cluster_view.ClusterView`; :mod:`~gpumem_gui.ui.cluster_glue` does the switching).
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF, QSize, Qt, Signal
from PySide6.QtGui import QFont, QMouseEvent, QPainter, QPalette
from PySide6.QtWidgets import (
    QButtonGroup,
    QComboBox,
    QFrame,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QRadioButton,
    QScrollArea,
    QSizePolicy,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from gpumem_gui.core import SizeUnit, Verdict, fmt_bytes
from gpumem_gui.hardware.history import MemoryHistory
from gpumem_gui.hardware.snapshot import GpuDevice, GpuSnapshot
from gpumem_gui.ui.cluster_delegate import paint_memory_bar
from gpumem_gui.ui.cluster_model import Evaluator
from gpumem_gui.ui.cluster_view import ClusterView
from gpumem_gui.ui.report import verdict_words
from gpumem_gui.ui.theme import ErrorLabel, status_color

SOURCES = (("local", "This machine"), ("cluster", "Cluster (Prometheus)"))

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
        self.spark = pg.PlotWidget(enableMenu=False)  # its context menus are then never built (~15 ms)
        self.spark.setFixedHeight(30)
        self.spark.hideAxis("left")
        self.spark.hideAxis("bottom")
        self.spark.setMouseEnabled(x=False, y=False)
        self.spark.setMenuEnabled(False)
        self.spark.hideButtons()
        self.spark.setBackground(self.palette().color(QPalette.ColorRole.Base))
        self.spark.setToolTip("Used memory, last 5 minutes")
        self.curve = self.spark.plot(
            [], [], pen=pg.mkPen(self.palette().color(QPalette.ColorRole.Highlight), width=1.5)
        )
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
            self.memory.setText(
                f"used {(d.used_bytes or 0) / f:.1f} · free {(d.free_bytes or 0) / f:.1f} "
                f"of {fmt_bytes(d.total_bytes, unit, 1)}"
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
        against = "free now" if basis == "free" else "total"
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
            self.curve.setData([], [])
            return
        n = len(points)
        xs = np.fromiter((t for t, _ in points), dtype=float, count=n) - points[-1][0]
        ys = np.fromiter((np.nan if u is None else u for _, u in points), dtype=float, count=n) / unit.factor
        xs, ys = sparkline_points(xs, ys)
        self.curve.setData(xs, ys, connect="finite")
        self.spark.setXRange(min(-60.0, float(xs.min())), 0, padding=0)
        self.spark.setYRange(
            0, (total or max(1, int(np.nanmax(ys) * unit.factor) if ys.size else 1)) / unit.factor
        )


class GpuPanel(QWidget):
    """Cards for the GPUs of the latest snapshot; the reason text when there are none.

    Signals:
        target_selected(str): a card was clicked (device key).
        basis_changed(str): 'free' or 'total'.
        source_changed(str): 'local' or 'cluster' was picked in the source selector.
        connection_requested(): "Connection…" was clicked (the cluster's Prometheus settings).
    """

    target_selected = Signal(str)
    basis_changed = Signal(str)
    source_changed = Signal(str)
    connection_requested = Signal()

    def __init__(self, history: MemoryHistory | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.history = history or MemoryHistory()
        self.unit = SizeUnit.GIB
        self.basis = "free"
        self.snapshot: GpuSnapshot | None = None
        self.cards: dict[str, GpuCard] = {}
        self._evaluator: Evaluator | None = None
        self._selected: str | None = None

        self.header = QLabel("Waiting for the first GPU reading…")
        self.header.setWordWrap(True)
        self.free_button = QRadioButton("free now")
        self.total_button = QRadioButton("total")
        self.free_button.setToolTip("Check the plan against each GPU's free memory now (others' use counted)")
        self.total_button.setToolTip("Check the plan against each GPU's total memory (as if it were idle)")
        self.free_button.setChecked(True)
        group = QButtonGroup(self)
        group.addButton(self.free_button)
        group.addButton(self.total_button)
        self.free_button.toggled.connect(self._on_basis_toggled)
        switch = QHBoxLayout()
        switch.addWidget(QLabel("Check against:"))
        switch.addWidget(self.free_button)
        switch.addWidget(self.total_button)
        switch.addStretch(1)
        self.reason = QLabel()
        self.reason.setWordWrap(True)
        self.reason.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.reason.hide()
        self.error = ErrorLabel()

        self._cards_box = QWidget()
        self._cards = QVBoxLayout(self._cards_box)
        self._cards.setContentsMargins(0, 0, 0, 0)
        self._cards.setSpacing(6)
        self._cards.addStretch(1)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setWidget(self._cards_box)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)

        self.source = QComboBox()
        for data, text in SOURCES:
            self.source.addItem(text, data)
        self.source.setToolTip("Read this machine's GPUs, or a cluster's from a Prometheus server")
        self.source.activated.connect(lambda i: self.source_changed.emit(self.source.itemData(i)))
        self.connection_button = QPushButton("Connection…")
        self.connection_button.clicked.connect(self.connection_requested)
        source_row = QHBoxLayout()
        for w, stretch in ((QLabel("Source:"), 0), (self.source, 1), (self.connection_button, 0)):
            source_row.addWidget(w, stretch)
        local = QWidget()
        lv = QVBoxLayout(local)
        lv.setContentsMargins(0, 0, 0, 0)
        for w, stretch in ((self.header, 0), (self.reason, 0), (self.error, 0), (scroll, 1)):
            lv.addWidget(w, stretch)
        self.cluster = ClusterView()
        self.pages = QStackedWidget()
        self.pages.addWidget(local)
        self.pages.addWidget(self.cluster)
        v = QVBoxLayout(self)
        v.setContentsMargins(6, 6, 6, 6)
        v.addLayout(source_row)
        v.addLayout(switch)
        v.addWidget(self.pages, 1)

    # ---- inputs ------------------------------------------------------------------------------------------

    def set_evaluator(self, evaluator: Evaluator | None) -> None:
        self._evaluator = evaluator
        self.refresh_verdicts()

    def show_source(self, source: str, detail: str | None = None) -> None:
        """Show the page of ``source`` ('local' or 'cluster') and select it (``detail``: its tooltip)."""
        self.source.setCurrentIndex(0 if source == "local" else 1)
        self.source.setToolTip(detail or self.source.itemText(self.source.currentIndex()))
        self.pages.setCurrentIndex(self.source.currentIndex())

    def set_unit(self, unit: SizeUnit) -> None:
        self.unit = unit
        if self.snapshot is not None:
            self.show_snapshot(self.snapshot, record=False)
        else:
            self.refresh_verdicts()

    def set_basis(self, basis: str) -> None:
        (self.free_button if basis == "free" else self.total_button).setChecked(True)

    def set_selected(self, key: str | None) -> None:
        self._selected = key
        for k, card in self.cards.items():
            card.set_selected(k == key)

    def show_error(self, reason: str) -> None:
        """A poll failed (the poller goes on): say so above the cards, which keep their last reading."""
        self.error.show_message(reason)

    def record(self, snap: GpuSnapshot) -> None:
        """Add one poll to the sparkline history (cheap: the window records every poll, draws fewer)."""
        self.history.add(snap)
        self.error.show_message(None)

    def show_snapshot(self, snap: GpuSnapshot, record: bool = True) -> None:
        """Show one poll; ``record`` adds it to the sparkline history first."""
        self.snapshot = snap
        if record:
            self.record(snap)
        if not snap.available:
            self.header.setText(f"No live GPU data ({snap.backend})")
            self.reason.setText(
                f"{snap.unavailable_reason}\n\nEverything else works: pick a catalog GPU as the target."
            )
            self.reason.show()
        else:
            self.reason.hide()
            drv = f"driver {snap.driver_version}" if snap.driver_version else "driver ?"
            cuda = f", CUDA {snap.cuda_driver_version}" if snap.cuda_driver_version else ""
            n = len(snap.devices)
            self.header.setText(f"{n} device{'s' if n != 1 else ''} · {drv}{cuda} · {snap.backend}")
        keys = [d.key for d in snap.devices]
        if keys != list(self.cards):
            self._rebuild(keys)
        for d in snap.devices:
            card = self.cards[d.key]
            card.show_device(d, self.unit)
            card.show_history(self.history.series(d.key), self.history.total_bytes(d.key), self.unit)
        self.refresh_verdicts()

    def refresh_verdicts(self) -> None:
        self.cluster.sync(self._evaluator, self.basis, self.unit)
        snap = self.snapshot
        if snap is None:
            return
        for d in snap.devices:
            card = self.cards.get(d.key)
            if card is None:
                continue
            v = None
            if self._evaluator is not None and d.ok and d.total_bytes is not None:
                available = d.free_bytes if self.basis == "free" else d.total_bytes
                v = self._evaluator(d, available or 0)
            card.show_verdict(v, d, self.unit, self.basis)

    def verdict_text(self, key: str) -> str:
        card = self.cards.get(key)
        return card.verdict.text() if card else ""

    # ---- internals ---------------------------------------------------------------------------------------

    def _rebuild(self, keys: list[str]) -> None:
        for card in self.cards.values():
            self._cards.removeWidget(card)
            card.deleteLater()
        self.cards = {}
        for key in keys:
            card = GpuCard(key)
            card.clicked.connect(self._on_card_clicked)
            self._cards.insertWidget(self._cards.count() - 1, card)
            self.cards[key] = card
        self.set_selected(self._selected)

    def _on_card_clicked(self, key: str) -> None:
        self.set_selected(key)
        self.target_selected.emit(key)

    def _on_basis_toggled(self, _checked: bool) -> None:
        basis = "free" if self.free_button.isChecked() else "total"
        if basis != self.basis:
            self.basis = basis
            self.refresh_verdicts()
            self.basis_changed.emit(basis)
