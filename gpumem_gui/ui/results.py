"""The results side: the fit verdict banner, the charts, the component table with explanations, and the ranked
changes that would make the plan fit (each with an Apply button).

Nothing here computes memory: it shows an :class:`~gpumem_gui.core.results.estimate.Estimate`, the core's
verdicts and a :class:`~gpumem_gui.core.fit.FitReport`, in the unit the window uses.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from PySide6.QtCore import QSignalBlocker, Qt, Signal
from PySide6.QtGui import QFont, QPalette, QTextBlock, QTextCharFormat, QTextCursor, QTextDocument
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QSplitter,
    QStyle,
    QTableWidget,
    QTableWidgetItem,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from gpumem_gui.core import Change, Component, Estimate, FitReport, SizeUnit, Verdict, fmt_bytes
from gpumem_gui.ui.charts import BreakdownChart, PhaseChart, SweepChart
from gpumem_gui.ui.report import explanation_html, verdict_words, worst_verdict
from gpumem_gui.ui.theme import ErrorLabel, status_color


def _runs(block: QTextBlock) -> list[tuple[int, int, QTextCharFormat, str]]:
    """(position, length, format, text) of each run of equally formatted text in ``block``."""
    runs = []
    it = block.begin()
    while not it.atEnd():
        frag = it.fragment()
        if frag.isValid():
            runs.append((frag.position(), frag.length(), frag.charFormat(), frag.text()))
        it += 1
    return runs


class VerdictBanner(QFrame):
    """One line that answers the question: fits with H headroom, or misses by M; and a detail line."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setAutoFillBackground(True)
        self.state = "none"
        self._icon_for: QStyle.StandardPixmap | None = None
        self.icon = QLabel()
        self.title = QLabel("Pick a model")
        font = QFont(self.title.font())
        font.setPointSizeF(font.pointSizeF() * 1.35)
        font.setBold(True)
        self.title.setFont(font)
        self.title.setWordWrap(True)
        self.detail = QLabel("")
        self.detail.setWordWrap(True)
        self.detail.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        text = QVBoxLayout()
        text.setSpacing(2)
        text.addWidget(self.title)
        text.addWidget(self.detail)
        row = QHBoxLayout(self)
        row.setContentsMargins(10, 6, 10, 6)
        row.addWidget(self.icon, 0, Qt.AlignmentFlag.AlignTop)
        row.addLayout(text, 1)

    def set_verdict(self, state: str, title: str, detail: str = "") -> None:
        """``state``: 'fits', 'misses', 'none' (no target) or 'stale' (inputs invalid, last result kept)."""
        self.state = state
        self.title.setText(title)
        self.detail.setText(detail)
        style = self.style()
        icon = {
            "fits": QStyle.StandardPixmap.SP_DialogApplyButton,
            "misses": QStyle.StandardPixmap.SP_MessageBoxWarning,
            "stale": QStyle.StandardPixmap.SP_MessageBoxInformation,
        }.get(state, QStyle.StandardPixmap.SP_MessageBoxQuestion)
        if self._icon_for != icon:
            size = self.title.fontMetrics().height() + 8
            self.icon.setPixmap(style.standardIcon(icon).pixmap(size, size))
            self._icon_for = icon
        pal = self.title.palette()
        if state in ("fits", "misses"):
            pal.setColor(QPalette.ColorRole.WindowText, status_color(self.palette(), state == "fits"))
        else:
            pal.setColor(QPalette.ColorRole.WindowText, self.palette().color(QPalette.ColorRole.WindowText))
        self.title.setPalette(pal)

    def add_line(self, text: str) -> None:
        """Append one line to the detail (e.g. the local GPUs the fit report suggests), once."""
        current = self.detail.text()
        if text and text not in current.split("\n"):
            self.detail.setText(f"{current}\n{text}" if current else text)


class ComponentTable(QTableWidget):
    """component | bytes | GiB (or GB) | share; the last row is the total."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(0, 4, parent)
        self.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.verticalHeader().hide()
        self.setAlternatingRowColors(True)
        self.setWordWrap(False)
        h = self.horizontalHeader()
        h.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for i in (1, 2, 3):
            h.setSectionResizeMode(i, QHeaderView.ResizeMode.ResizeToContents)
        self.components: list[Component] = []

    def show_components(self, comps: Sequence[Component], total: int, unit: SizeUnit) -> None:
        """Fill the table; cells are updated in place (creating items is what makes a table slow)."""
        selected = self.selected_key()
        self.components = list(comps)
        rows = [(c.label, c.bytes, c.key) for c in comps] + [("total (as nvidia-smi)", total, "")]
        self.setUpdatesEnabled(False)
        blocker = QSignalBlocker(self)
        header = self.horizontalHeader()
        for i in (1, 2, 3):  # no column re-measure per cell: once, at the end
            header.setSectionResizeMode(i, QHeaderView.ResizeMode.Fixed)
        try:
            if self.horizontalHeaderItem(2) is None or self.horizontalHeaderItem(2).text() != unit.value:
                self.setHorizontalHeaderLabels(["component", "bytes", unit.value, "share"])
            if self.rowCount() != len(rows):
                self.setRowCount(len(rows))
            right = Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter
            for r, (label, n, key) in enumerate(rows):
                cells = [label, f"{n:,}", f"{n / unit.factor:,.2f}", f"{100 * n / max(1, total):.1f} %"]
                for col, text in enumerate(cells):
                    item = self.item(r, col)
                    if item is None:
                        item = QTableWidgetItem(text)
                        if col:
                            item.setTextAlignment(right)
                        self.setItem(r, col, item)
                    elif item.text() != text:
                        item.setText(text)
                    if item.data(Qt.ItemDataRole.UserRole) != key:
                        item.setData(Qt.ItemDataRole.UserRole, key)
                    is_total = not key
                    if item.font().bold() != is_total:
                        font = QFont(self.font())
                        font.setBold(is_total)
                        item.setFont(font)
                        flags = Qt.ItemFlag.ItemIsEnabled
                        item.setFlags(flags if is_total else flags | Qt.ItemFlag.ItemIsSelectable)
            if selected:
                self.select_key(selected)
        finally:
            for i in (1, 2, 3):
                header.setSectionResizeMode(i, QHeaderView.ResizeMode.ResizeToContents)
            del blocker
            self.setUpdatesEnabled(True)

    def selected_key(self) -> str | None:
        rows = self.selectionModel().selectedRows() if self.selectionModel() else []
        if not rows:
            return None
        item = self.item(rows[0].row(), 0)
        return item.data(Qt.ItemDataRole.UserRole) if item else None

    def select_key(self, key: str) -> bool:
        for r, c in enumerate(self.components):
            if c.key == key:
                self.selectRow(r)
                return True
        return False


class ChangesPanel(QWidget):
    """The maxima that fit and the ranked changes, each with an Apply button.

    Signals:
        apply_requested(dict): the user wants this update applied to the run.
    """

    apply_requested = Signal(dict)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.heading = QLabel("<b>To make it fit</b>")
        self.maxima = QLabel("")
        self.maxima.setWordWrap(True)
        self.maxima.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.status = QLabel("")
        self.status.setWordWrap(True)
        self._rows_box = QWidget()
        self._rows = QVBoxLayout(self._rows_box)
        self._rows.setContentsMargins(0, 0, 0, 0)
        self._rows.addStretch(1)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setWidget(self._rows_box)
        v = QVBoxLayout(self)
        v.setContentsMargins(4, 0, 0, 0)
        v.addWidget(self.heading)
        v.addWidget(self.maxima)
        v.addWidget(self.status)
        v.addWidget(scroll, 1)
        self.buttons: list[QPushButton] = []
        self.changes: list[Change] = []

    def set_busy(self, text: str) -> None:
        """A new report is being worked out: the old one stays visible but greyed out, its buttons off."""
        self.status.setText(text)
        self.maxima.setEnabled(False)
        self._rows_box.setEnabled(False)

    def clear(self, text: str = "") -> None:
        self._set_rows([], SizeUnit.GIB)
        self.maxima.setText("")
        self.status.setText(text)
        self.maxima.setEnabled(True)
        self._rows_box.setEnabled(True)

    def show_report(
        self, rep: FitReport, unit: SizeUnit, changes: Sequence[Change] | None = None, note: str = ""
    ) -> None:
        """Show ``rep``'s maxima and ``changes`` (default: all of ``rep.changes``); ``note`` says why some
        are left out."""
        self.maxima.setEnabled(True)
        self._rows_box.setEnabled(True)
        self.heading.setText("<b>To make it fit</b>" if not rep.fits else "<b>Other options</b>")
        changes = list(rep.changes if changes is None else changes)
        if rep.estimate.mode == "train":
            parts = [
                f"max micro-batch <b>{rep.max_batch if rep.max_batch is not None else 'none'}</b>",
                f"longest sequence <b>{f'{rep.max_context:,}' if rep.max_context else 'none'}</b> tokens",
                f"fewest GPUs <b>{rep.fewest_gpus if rep.fewest_gpus is not None else 'none'}</b>",
            ]
        else:
            parts = [
                f"max batch <b>{rep.max_batch if rep.max_batch is not None else 'none'}</b>",
                f"max context <b>{f'{rep.max_context:,}' if rep.max_context else 'none'}</b> tokens",
                f"fewest GPUs <b>{rep.fewest_gpus if rep.fewest_gpus is not None else 'none'}</b>",
                f"best weights <b>{rep.smallest_weights or 'none'}</b>",
                f"best KV dtype <b>{rep.smallest_kv_dtype or 'none'}</b>",
            ]
        if rep.max_concurrency is not None:
            parts.append(f"max concurrency <b>{rep.max_concurrency:g}x</b>")
        self.maxima.setText(" · ".join(parts))
        status = "" if changes else "No change is needed." if rep.fits else "No change found."
        self.status.setText(" ".join(t for t in (status, note) if t))
        self._set_rows(changes, unit)

    def _set_rows(self, changes: list[Change], unit: SizeUnit) -> None:
        while self._rows.count() > 1:
            item = self._rows.takeAt(0)
            if item.widget() is not None:
                item.widget().deleteLater()
        self.buttons = []
        self.changes = changes
        for i, c in enumerate(changes):
            row = QFrame()
            row.setFrameShape(QFrame.Shape.StyledPanel)
            h = QHBoxLayout(row)
            h.setContentsMargins(6, 3, 6, 3)
            mark = QLabel("fits" if c.fits else "misses")
            pal = mark.palette()
            pal.setColor(QPalette.ColorRole.WindowText, status_color(self.palette(), c.fits))
            mark.setPalette(pal)
            mark.setMinimumWidth(mark.fontMetrics().horizontalAdvance("misses") + 4)
            text = QLabel(
                f"<b>{i + 1}. {html.escape(c.description)}</b><br>needs {fmt_bytes(c.total_bytes, unit)}"
            )
            text.setToolTip(f"{c.description}: needs {fmt_bytes(c.total_bytes, unit)} per GPU")
            text.setWordWrap(True)
            text.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
            text.setMinimumWidth(80)
            button = QPushButton("Apply")
            button.setToolTip(f"Change the run: {c.update}")
            button.clicked.connect(lambda _=False, upd=dict(c.update): self.apply_requested.emit(upd))
            h.addWidget(mark)
            h.addWidget(text, 1)
            h.addWidget(button)
            self._rows.insertWidget(self._rows.count() - 1, row)
            self.buttons.append(button)


SWEEP_LABELS = {
    "infer": {"seq": "against prompt length", "batch": "against batch"},
    "train": {"seq": "against sequence length", "batch": "against micro-batch"},
}
SWEEP_AXES = {
    "infer": {"seq": "prompt tokens", "batch": "batch (sequences)"},
    "train": {"seq": "sequence tokens", "batch": "micro-batch (sequences)"},
}


class ResultsView(QWidget):
    """Banner, charts, component table, explanation and changes.

    Signals:
        apply_requested(dict): from the changes panel.
        sweep_over_changed(str): 'seq' or 'batch'.
    """

    apply_requested = Signal(dict)
    sweep_over_changed = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.banner = VerdictBanner()
        self.warnings = ErrorLabel()
        self.breakdown = BreakdownChart()
        self.phases = PhaseChart()
        self.sweep = SweepChart()
        self.sweep_over = QComboBox()
        self.sweep_over.addItem(SWEEP_LABELS["infer"]["seq"], "seq")
        self.sweep_over.addItem(SWEEP_LABELS["infer"]["batch"], "batch")
        self.mode = "infer"
        self.sweep_over.setToolTip("What the sweep chart varies (48 estimates at once)")
        self.sweep_over.currentIndexChanged.connect(
            lambda _i: self.sweep_over_changed.emit(self.sweep_over.currentData())
        )
        self.table = ComponentTable()
        self.explain = QTextBrowser()
        self.explain.setOpenExternalLinks(True)
        self.explain.setPlaceholderText(
            "Select a component to see how it is computed: formula, inputs, source."
        )
        self.changes = ChangesPanel()
        self.changes.apply_requested.connect(self.apply_requested)
        self.table.itemSelectionChanged.connect(self._on_table_selection)
        self._est: Estimate | None = None
        self._unit = SizeUnit.GIB
        self._explained = ""

        # charts in a 2 x 2 grid: breakdown | phases / sweep | the changes that would make it fit
        self.charts = QWidget()
        grid = QGridLayout(self.charts)
        grid.setContentsMargins(0, 0, 0, 0)
        grid.setSpacing(4)
        sweep_box = QWidget()
        sv = QVBoxLayout(sweep_box)
        sv.setContentsMargins(0, 0, 0, 0)
        sv.setSpacing(2)
        sv.addWidget(self.sweep, 1)
        sv.addWidget(self.sweep_over, 0, Qt.AlignmentFlag.AlignRight)
        grid.addWidget(self.breakdown, 0, 0)
        grid.addWidget(self.phases, 0, 1)
        grid.addWidget(sweep_box, 1, 0)
        grid.addWidget(self.changes, 1, 1)
        grid.setColumnStretch(0, 1)
        grid.setColumnStretch(1, 1)
        grid.setRowStretch(0, 1)
        grid.setRowStretch(1, 1)

        bottom = QSplitter(Qt.Orientation.Horizontal)
        bottom.addWidget(self.table)
        bottom.addWidget(self.explain)
        bottom.setStretchFactor(0, 1)
        bottom.setStretchFactor(1, 1)
        bottom.setChildrenCollapsible(False)

        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(self.charts)
        split.addWidget(bottom)
        split.setStretchFactor(0, 5)
        split.setStretchFactor(1, 2)
        split.setChildrenCollapsible(False)
        split.setSizes([640, 260])
        self.splitter = split

        v = QVBoxLayout(self)
        v.setContentsMargins(0, 0, 0, 0)
        v.addWidget(self.banner)
        v.addWidget(self.warnings)
        v.addWidget(split, 1)

    # ---- updates -------------------------------------------------------------------------------------------

    def set_mode(self, mode: str) -> None:
        """'infer' or 'train': names the sweep's choices and axis for what the estimate is about."""
        self.mode = mode
        with QSignalBlocker(self.sweep_over):
            for i in range(self.sweep_over.count()):
                self.sweep_over.setItemText(i, SWEEP_LABELS[mode][self.sweep_over.itemData(i)])

    def sweep_axis(self, over: str) -> str:
        return SWEEP_AXES[self.mode][over]

    def show_estimate(
        self,
        est: Estimate,
        unit: SizeUnit,
        *,
        capacity_bytes: int | None,
        free_bytes: int | None,
    ) -> None:
        self._est = est
        self._unit = unit
        self.breakdown.show_estimate(est, unit, capacity_bytes, free_bytes)
        self.phases.show_estimate(est, unit)
        self.table.show_components(est.components, est.total_bytes, unit)
        self.warnings.show_message("\n".join(f"warning: {w}" for w in est.warnings))
        if self.table.selected_key() is None and est.components:
            self.table.select_key(est.components[0].key)
        self._on_table_selection()

    def show_verdicts(self, vs: Sequence[Verdict], est: Estimate, target_text: str, unit: SizeUnit) -> None:
        worst = worst_verdict(vs)
        need = f"needs {fmt_bytes(est.total_bytes, unit)} per GPU"
        if worst is None:
            self.banner.set_verdict("none", f"Needs {fmt_bytes(est.total_bytes, unit)} per GPU", target_text)
            return
        words = verdict_words(worst, unit)
        state = "fits" if worst.fits else "misses"
        head = words[0].upper() + words[1:] if worst.fits else f"Does not fit: {words}"
        who = "rank" if est.mode == "train" else "GPU"
        detail = (
            f"{need} ({est.engine}, peak in {est.peak_phase}); on {target_text}: "
            f"worst {who} {worst.gpu_index} "
            f"needs {fmt_bytes(worst.needed_bytes, unit)} of {fmt_bytes(worst.available_bytes, unit)} "
            f"with a {fmt_bytes(worst.margin_bytes, unit)} margin"
        )
        if est.engine == "vllm" and "kv_tokens" in est.facts:
            detail += (
                f"; KV pool {int(est.facts['kv_tokens']):,} tokens for max_model_len "
                f"{int(est.facts.get('max_model_len', 0)):,}"
            )
        self.banner.set_verdict(state, head, detail)

    def show_no_target(self, est: Estimate, reason: str, unit: SizeUnit) -> None:
        self.banner.set_verdict("none", f"Needs {fmt_bytes(est.total_bytes, unit)} per GPU", reason)

    def mark_stale(self, message: str) -> None:
        """The inputs are invalid: keep the last good numbers and say so."""
        self.banner.set_verdict("stale", "Showing the last valid estimate", message)

    def _on_table_selection(self) -> None:
        key = self.table.selected_key()
        est = self._est
        comp = est.component(key) if est is not None and key else None
        text = "" if comp is None else explanation_html(comp, self._unit, est.total_bytes if est else 0)
        if text != self._explained:  # setHtml costs milliseconds (laying the inputs table out): only when
            if not self._patch_explanation(text):  # the text changes, and only the paragraph that changed
                self.explain.setHtml(text)
            self._explained = text

    def _patch_explanation(self, text: str) -> bool:
        """When ``text`` differs from the explanation on screen only in its first paragraph (the size and the
        share of the total: what a new batch or prompt length changes), rewrite that paragraph's runs of text
        in place, each keeping its format, so the inputs table is not laid out again. False when it cannot
        (the caller then sets the whole text)."""
        old, sep = self._explained, "</p>"
        if not old or sep not in old or sep not in text:
            return False
        old_head, old_rest = old.split(sep, 1)
        new_head, new_rest = text.split(sep, 1)
        if old_rest != new_rest or "<p>" not in old_head or "<p>" not in new_head:
            return False
        if old_head[: old_head.index("<p>")] != new_head[: new_head.index("<p>")]:
            return False
        fresh = QTextDocument()
        fresh.setHtml(new_head[new_head.index("<p>") :] + sep)
        new_runs = _runs(fresh.firstBlock())
        doc = self.explain.document()
        block = doc.firstBlock().next()
        old_runs = _runs(block)
        if not block.isValid() or len(old_runs) != len(new_runs):
            return False
        if any(a[2] != b[2] for a, b in zip(old_runs, new_runs, strict=True)):
            return False
        cursor = QTextCursor(doc)
        cursor.beginEditBlock()
        for (pos, length, fmt, _t), (_p, _n, _f, new_text) in reversed(
            list(zip(old_runs, new_runs, strict=True))
        ):
            cursor.setPosition(pos)
            cursor.setPosition(pos + length, QTextCursor.MoveMode.KeepAnchor)
            cursor.insertText(new_text, fmt)
        cursor.endEditBlock()
        return True
