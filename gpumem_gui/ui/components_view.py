"""The component table (bytes, size and share per component, the total last) and the explanation of the
selected component (formula, inputs, source), which is patched in place when only its numbers change."""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import QSignalBlocker, Qt
from PySide6.QtGui import QFont, QTextBlock, QTextCharFormat, QTextCursor, QTextDocument
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHeaderView,
    QTableWidget,
    QTableWidgetItem,
    QTextBrowser,
    QWidget,
)

from gpumem_gui.core import Component, Reported, SizeUnit


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


_SELECTABLE = Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable


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

    def show_components(
        self, comps: Sequence[Component], total: int, unit: SizeUnit, reported: Reported | None = None
    ) -> None:
        """Fill the table; cells are updated in place (creating items is what makes a table slow). After the
        total (what a fit checks), ``reported``'s figures: what a GPU with room would show (no share)."""
        selected = self.selected_key()
        self.components = list(comps)
        rows = [(c.label, c.bytes, c.key) for c in comps] + [("total: what a fit checks", total, "")]
        if reported is not None:  # the statistic first: a narrow column elides the end
            rows += [
                ("reserved, on a GPU with room", reported.reserved_bytes, ""),
                ("nvidia-smi, on a GPU with room", reported.nvidia_smi_bytes, ""),
            ]
        tip = (
            f"What a GPU with more memory than the run needs would report ({reported.basis}): "
            f"{reported.explain.formula}"
            if reported is not None
            else ""
        )
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
                share = f"{100 * n / max(1, total):.1f} %" if r <= len(comps) else ""  # reported: no share
                cells = [label, f"{n:,}", f"{n / unit.factor:,.2f}", share]
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
                    is_total = r == len(comps)  # the reported rows after it: plain, not selectable
                    row_tip = tip if r > len(comps) else ""
                    if item.toolTip() != row_tip:
                        item.setToolTip(row_tip)
                    if item.font().bold() != is_total:
                        font = QFont(self.font())
                        font.setBold(is_total)
                        item.setFont(font)
                    flags = _SELECTABLE if key else Qt.ItemFlag.ItemIsEnabled
                    if item.flags() != flags:
                        item.setFlags(flags)
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


class ExplanationView(QTextBrowser):
    """The selected component's explanation (HTML from :func:`~gpumem_gui.ui.report.explanation_html`)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setOpenExternalLinks(True)
        self.setPlaceholderText("Select a component to see how it is computed: formula, inputs, source.")
        self._shown = ""

    def show_html(self, text: str) -> None:
        """Show ``text``. setHtml costs milliseconds (laying the inputs table out): only when the text
        changes, and only the paragraph that changed."""
        if text != self._shown:
            if not self._patch(text):
                self.setHtml(text)
            self._shown = text

    def _patch(self, text: str) -> bool:
        """When ``text`` differs from the explanation on screen only in its first paragraph (the size and the
        share of the total: what a new batch or prompt length changes), rewrite that paragraph's runs of text
        in place, each keeping its format, so the inputs table is not laid out again. False when it cannot
        (the caller then sets the whole text)."""
        old, sep = self._shown, "</p>"
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
        doc = self.document()
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
