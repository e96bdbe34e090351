"""The changes panel: the maxima that fit and the ranked changes that would make the plan fit, each with an
Apply button. It shows a :class:`~gpumem_gui.core.fit.FitReport`; it computes nothing."""

from __future__ import annotations

import html
from collections.abc import Sequence

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from gpumem_gui.core import Change, FitReport, SizeUnit, fmt_bytes, maxima_phrases
from gpumem_gui.ui.theme import status_color


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
        self.maxima.setTextFormat(Qt.TextFormat.PlainText)  # core phrases, shown as written (apostrophes too)
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
        # the same phrases as the CLI and the Markdown report (core maxima_phrases): "no batch size fits"
        # where nothing does, a best format only when it is a change
        self.maxima.setText(" · ".join(maxima_phrases(rep)))
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
