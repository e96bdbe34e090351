"""The per-rank table of a training estimate, under the per-GPU bars: every class of ranks that hold the same
memory (pipeline stage, TP / CP / expert / data-parallel positions), how many GPUs that is, its peak, total,
peak phase and largest components, the host RAM and NVMe offload needs, and which class decides the fit.

Shown only when the ranks differ (more than one class); it shows what the core's
:class:`~gpumem_gui.core.results.estimate.RankClass` rows say and computes nothing.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QFont
from PySide6.QtWidgets import QAbstractItemView, QHeaderView, QTableWidget, QTableWidgetItem, QWidget

from gpumem_gui.core import Estimate, RankClass, SizeUnit

MAX_VISIBLE_ROWS = 4  # more classes (deep pipelines) scroll


class RankTable(QTableWidget):
    """ranks | GPUs | peak | total | phase | [host RAM | NVMe | paged states] | largest component; the
    deciding class in bold and marked; each row's tooltip has the full position and the three largest
    components."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(0, 0, parent)
        self.setObjectName("rank_table")
        self.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.verticalHeader().hide()
        self.setAlternatingRowColors(True)
        self.setWordWrap(False)
        self.setToolTip("Ranks that hold the same memory form one class; the bold class decides the fit")
        # a narrow grid cell: the last column is elided (its full text is in each row's tooltip)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setTextElideMode(Qt.TextElideMode.ElideRight)
        left = Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignVCenter
        self.horizontalHeader().setDefaultAlignment(left)
        self.hide()

    def show_ranks(self, est: Estimate, unit: SizeUnit) -> None:
        """Fill the table from ``est.ranks``; hidden when there is at most one class."""
        ranks = est.ranks
        if len(ranks) < 2:
            self.hide()
            return
        off = est.off_gpu_columns()
        u = unit.value
        heads = ["ranks", "GPUs", f"peak {u}", f"total {u}", "phase", *(f"{label} {u}" for _, label in off)]
        heads.append("largest")
        self.setUpdatesEnabled(False)
        try:
            self.setColumnCount(len(heads))
            self.setHorizontalHeaderLabels(heads)
            self.setRowCount(len(ranks))
            for row, r in enumerate(ranks):
                size = [r.peak_bytes, r.total_bytes]
                sizes_off = [getattr(r, f) for f, _ in off]
                tops = r.top_components()
                top = ", ".join(f"{c.label} {c.bytes / unit.factor:,.2f}" for c in tops)
                cells = [
                    _short(r, len(ranks)),
                    f"{r.gpus:,}",
                    *(f"{n / unit.factor:,.2f}" for n in size),
                    r.peak_phase,
                    *(f"{n / unit.factor:,.2f}" for n in sizes_off),
                    tops[0].label if tops else "",
                ]
                tip = f"{r.role}: {r.gpus:,} GPUs" + ("; decides the fit" if r.decides else "")
                tip += f"\nlargest ({u}): {top}"
                for col, text in enumerate(cells):
                    item = QTableWidgetItem(text)
                    item.setToolTip(tip)
                    if 0 < col < len(cells) - 1 and col != 4:
                        item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                    if r.decides:
                        font = QFont(self.font())
                        font.setBold(True)
                        item.setFont(font)
                    self.setItem(row, col, item)
            h = self.horizontalHeader()
            for col in range(len(heads) - 1):
                h.setSectionResizeMode(col, QHeaderView.ResizeMode.ResizeToContents)
            h.setSectionResizeMode(len(heads) - 1, QHeaderView.ResizeMode.Stretch)
            rows = min(len(ranks), MAX_VISIBLE_ROWS)
            height = h.height() + sum(self.rowHeight(i) for i in range(rows)) + 2 * self.frameWidth() + 2
            self.setFixedHeight(height)
        finally:
            self.setUpdatesEnabled(True)
        self.show()

    def deciding_row(self) -> int | None:
        """The row of the class that decides the fit (bold), or None when the table is hidden."""
        if self.isHidden():
            return None
        return next((r for r in range(self.rowCount()) if self.item(r, 0).font().bold()), None)

    def row_texts(self) -> list[list[str]]:
        """The cells as text (tests, the self-test)."""
        return [
            [self.item(r, c).text() if self.item(r, c) else "" for c in range(self.columnCount())]
            for r in range(self.rowCount())
        ]


def _short(r: RankClass, n: int) -> str:
    """The class in a few characters: its pipeline stage (and data-parallel rank where the ranks of a stage
    differ); ``▶`` marks the class that decides the fit. The full position is in the row's tooltip."""
    text = f"stage {r.stage}"
    if len(r.dp_ranks) == 1 and n > 1:
        text += f", DP {r.dp_ranks[0]}"
    return ("▶ " if r.decides else "") + text
