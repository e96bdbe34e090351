"""The GPU side panel: one card per GPU or MIG instance, fed only by snapshots from the poller's signal.

Each card shows the name, a memory bar (used by others / what this plan would take / free), utilisation,
temperature, process count, a used-memory sparkline, and the plan's verdict on that GPU against its free
memory now (or its total, with the switch). Clicking a card makes it the chart's target. The panel never
talks to NVML and never computes memory: the window injects an *evaluator* (a function over the core) that
gives the verdict for one device. The source selector on top switches to the cluster page
(:class:`~gpumem_gui.ui.cluster_view.ClusterView`; :mod:`~gpumem_gui.ui.cluster_glue` does the switching).
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QButtonGroup,
    QComboBox,
    QFrame,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QRadioButton,
    QScrollArea,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from gpumem_gui.core import SizeUnit
from gpumem_gui.hardware.history import MemoryHistory
from gpumem_gui.hardware.snapshot import GpuSnapshot
from gpumem_gui.ui.cluster_model import Evaluator
from gpumem_gui.ui.cluster_view import ClusterView
from gpumem_gui.ui.gpu_card import SPARKLINE_POINTS, GpuCard, MemoryBar, Sparkline, sparkline_points
from gpumem_gui.ui.theme import ErrorLabel

__all__ = ["SPARKLINE_POINTS", "GpuCard", "GpuPanel", "MemoryBar", "Sparkline", "sparkline_points"]

SOURCES = (("local", "This machine"), ("cluster", "Cluster (Prometheus)"))
# Cards drawn at most (16 GPUs x 7 MIG instances + the 16 GPUs: the largest single node we know of); a
# scripted machine with thousands of GPUs gets a line saying how many are not drawn (issue 18)
MAX_CARDS = 128


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
            more = f" (cards for the first {MAX_CARDS})" if n > MAX_CARDS else ""
            self.header.setText(f"{n} device{'s' if n != 1 else ''}{more} · {drv}{cuda} · {snap.backend}")
        shown = snap.devices[:MAX_CARDS]
        keys = [d.key for d in shown]
        if keys != list(self.cards):
            self._rebuild(keys)
        for d in shown:
            card = self.cards[d.key]
            card.show_device(d, self.unit)
            card.show_history(self.history.series(d.key), self.history.total_bytes(d.key), self.unit)
        self.refresh_verdicts()

    def refresh_verdicts(self) -> None:
        self.cluster.sync(self._evaluator, self.basis, self.unit)
        snap = self.snapshot
        if snap is None:
            return
        for d in snap.devices[:MAX_CARDS]:
            card = self.cards.get(d.key)
            if card is None:
                continue
            v = None
            if self._evaluator is not None and d.ok and d.total_bytes is not None:
                available = d.free_bytes if self.basis == "free" else d.cuda_total_bytes
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
