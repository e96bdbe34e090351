"""The GPU panel's cluster page: a header, the snapshot's notes or why there is no data, the fit banner, and a
virtualised tree of hosts > GPU cards > MIG instances (:mod:`~gpumem_gui.ui.cluster_model` holds the rows,
:mod:`~gpumem_gui.ui.cluster_delegate` paints the ones on screen).

The banner says where the plan on screen fits now (``cluster_summary`` of the core's ``cluster_fit``, worked
out by :class:`~gpumem_gui.ui.cluster_glue.ClusterGlue` off the GUI thread), and the GPUs of the best
placement are highlighted in the tree; "Show" scrolls to them. Clicking a GPU card makes it the target
(``card_clicked``; the target's card is framed). Hosts a person collapsed stay collapsed when the hosts
change.
"""

from __future__ import annotations

from PySide6.QtCore import QModelIndex, Qt, Signal
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QTreeView,
    QVBoxLayout,
    QWidget,
)

from gpumem_gui.core import ClusterFit, SizeUnit, cluster_summary
from gpumem_gui.hardware.snapshot import GpuSnapshot
from gpumem_gui.ui.cluster_delegate import ClusterDelegate
from gpumem_gui.ui.cluster_model import ClusterModel, Evaluator
from gpumem_gui.ui.theme import ErrorLabel, status_color

NO_PLAN_TEXT = "No plan to place yet."


class ClusterView(QWidget):
    """The cluster page of the GPU panel (see module docstring).

    Signals:
        card_clicked(str): a GPU card that can be a target was clicked (its device key, ``"node-a/0"``).
    """

    card_clicked = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.snapshot: GpuSnapshot | None = None
        self.fit: ClusterFit | None = None
        self._collapsed: set[str] = set()
        self.header = QLabel("Cluster: waiting for the first reading…")
        self.header.setWordWrap(True)
        self.notes = QLabel()
        self.notes.setWordWrap(True)
        self.notes.hide()
        self.reason = QLabel()
        self.reason.setWordWrap(True)
        self.reason.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.reason.hide()
        self.error = ErrorLabel()
        self.banner = QLabel(NO_PLAN_TEXT)
        self.banner.setWordWrap(True)
        self.banner.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        bold = self.banner.font()
        bold.setBold(True)
        self.banner.setFont(bold)
        self.show_button = QPushButton("Show")
        self.show_button.setToolTip("Scroll to the GPUs of the best placement")
        self.show_button.setEnabled(False)
        self.show_button.clicked.connect(self.scroll_to_placement)
        banner_row = QHBoxLayout()
        banner_row.addWidget(self.banner, 1)
        banner_row.addWidget(self.show_button, 0, Qt.AlignmentFlag.AlignTop)

        self.model = ClusterModel(self)
        self.tree = QTreeView()
        self.tree.setModel(self.model)
        self.delegate = ClusterDelegate(self.model, self.tree)
        self.tree.setItemDelegate(self.delegate)
        self.tree.setHeaderHidden(True)
        self.tree.setUniformRowHeights(False)
        self.tree.setIndentation(12)
        self.tree.setAnimated(False)
        self.tree.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.tree.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.tree.setVerticalScrollMode(QAbstractItemView.ScrollMode.ScrollPerPixel)
        self.tree.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.tree.collapsed.connect(lambda i: self._collapsed.add(self.model.node(i).key))
        self.tree.expanded.connect(lambda i: self._collapsed.discard(self.model.node(i).key))
        self.tree.clicked.connect(self._on_clicked)
        self.model.modelReset.connect(self._expand)

        v = QVBoxLayout(self)
        v.setContentsMargins(0, 0, 0, 0)
        for w in (self.header, self.notes, self.reason, self.error):
            v.addWidget(w)
        v.addLayout(banner_row)
        v.addWidget(self.tree, 1)

    # ---- inputs ------------------------------------------------------------------------------------------

    def sync(self, evaluator: Evaluator | None, basis: str, unit: SizeUnit) -> None:
        """The plan's evaluator, the basis ('free' or 'total') and the unit: every card is redrawn, its
        verdict worked out again when painted."""
        self.model.configure(evaluator, basis, unit)

    def show_error(self, reason: str | None) -> None:
        """A poll failed (polling goes on): say so; the cards keep their last reading."""
        self.error.show_message(reason)

    def show_snapshot(self, snap: GpuSnapshot) -> int:
        """Show one cluster poll; returns how many rows changed (see :meth:`ClusterModel.update`)."""
        self.snapshot = snap
        self.error.show_message(None)
        self.header.setText(header_text(snap))
        self.notes.setText("\n".join(snap.notes))
        self.notes.setVisible(bool(snap.notes))
        if snap.available:
            self.reason.hide()
        else:
            self.reason.setText(
                f"{snap.unavailable_reason}\n\nEverything else works: switch the source back to "
                '"This machine", or pick a catalog GPU as the target.'
            )
            self.reason.show()
        return self.model.update(snap)

    def show_fit(self, fit: ClusterFit | None, message: str | None = None) -> None:
        """The cluster fit of the plan on screen (None: no plan, or ``message`` says why there is none)."""
        self.fit = fit
        pal = self.banner.palette()
        if fit is None:
            self.banner.setText(message or NO_PLAN_TEXT)
            ok = message is None
        else:
            summary = cluster_summary(fit)
            self.banner.setText(summary[:1].upper() + summary[1:])
            cals = ", ".join(fit.calibrations)
            self.banner.setToolTip(
                f"With the saved calibration(s) of their GPU models: {cals}" if cals else ""
            )
            ok = fit.fits
        color = status_color(self.palette(), ok) if fit is not None or message else None
        pal.setColor(
            QPalette.ColorRole.WindowText, color or self.palette().color(QPalette.ColorRole.WindowText)
        )
        self.banner.setPalette(pal)
        best = fit.placements[0] if fit is not None and fit.placements else None
        ranks = {r.key: r.rank for r in best.gpus} if best else {}
        rooms = {h.host: h.gpus_for_one_rank for h in fit.hosts} if fit is not None else {}
        self.model.set_placement(ranks, rooms)
        self.show_button.setEnabled(best is not None)

    def scroll_to_placement(self) -> None:
        """Bring the first GPU of the best placement into view (expanding its host)."""
        if self.fit is None or not self.fit.placements:
            return
        index = self.model.index_of(self.fit.placements[0].gpus[0].key)
        if index.isValid():
            self.tree.expand(index.parent())
            self.tree.scrollTo(index, QAbstractItemView.ScrollHint.PositionAtTop)

    def set_target(self, key: str | None) -> None:
        """Frame the card of the target's first GPU (None: the target is not a cluster GPU)."""
        self.model.set_target(key)

    # ---- internals ---------------------------------------------------------------------------------------

    def _on_clicked(self, index: QModelIndex) -> None:
        """A click on a GPU card (not a host row, not a GPU in MIG mode: its instances are the devices)."""
        node = self.model.node(index) if index.isValid() else None
        if node is not None and node.device is not None and not node.children:
            self.card_clicked.emit(node.key)

    def _expand(self) -> None:
        """After a reset: every host and GPU open, except the hosts a person collapsed."""
        self.tree.expandAll()
        for row, i in enumerate(self.model.hosts):
            if self.model.nodes[i].key in self._collapsed:
                self.tree.collapse(self.model.index(row, 0))


def header_text(snap: GpuSnapshot) -> str:
    """'1,000 GPUs on 125 hosts · 3 hosts stale · prometheus:http://…'."""
    if not snap.available:
        return f"No cluster data ({snap.backend})"
    gpus = len(snap.physical_devices)
    hosts = snap.hosts
    fresh = {d.host for d in snap.devices if not d.stale}
    stale = sum(h not in fresh for h in hosts)
    parts = [f"{gpus:,} GPU{'s' if gpus != 1 else ''} on {len(hosts):,} host{'s' if len(hosts) != 1 else ''}"]
    if stale:
        parts.append(f"{stale} host{'s' if stale != 1 else ''} stale")
    return " · ".join([*parts, snap.backend])
