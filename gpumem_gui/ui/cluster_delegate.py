"""Painting the cluster view's rows: a host header, or a compact GPU card (the view asks only for the rows
on screen).

A card has three text lines and a memory bar: the GPU and its utilisation/temperature (and its rank when the
best placement uses it), the bar (used by others | this plan | free), the memory numbers, and the plan's
verdict on it. A stale GPU is drawn in the disabled text colour with the age of its last sample; a lost GPU
shows its error; a GPU of the best placement gets the highlight colour's stripe and tint; the GPU target's
card (a card clicked) a frame twice as thick, in the text colour.
"""

from __future__ import annotations

from PySide6.QtCore import QModelIndex, QPersistentModelIndex, QRect, QRectF, QSize, Qt
from PySide6.QtGui import QBrush, QColor, QFont, QFontMetrics, QPainter, QPalette, QPen
from PySide6.QtWidgets import QStyledItemDelegate, QStyleOptionViewItem, QWidget

from gpumem_gui.core import Verdict
from gpumem_gui.hardware.report import age_words
from gpumem_gui.hardware.snapshot import GpuDevice
from gpumem_gui.ui.cluster_model import ClusterModel, HostInfo, Node, memory_text
from gpumem_gui.ui.report import verdict_words
from gpumem_gui.ui.theme import status_color

PAD = 4  # px around a card's text
BAR_H = 8  # px: the memory bar's height
GAP = 2  # px between a card's lines


class ClusterDelegate(QStyledItemDelegate):
    """Paints :class:`ClusterModel` rows; sizes come from the font only (no per-row measuring)."""

    def __init__(self, model: ClusterModel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.model = model

    def sizeHint(self, option: QStyleOptionViewItem, index: QModelIndex | QPersistentModelIndex) -> QSize:
        h = QFontMetrics(option.font).height()
        if self.model.node(index).is_host:
            return QSize(200, h + 2 * PAD + 2)
        return QSize(200, 3 * h + BAR_H + 3 * GAP + 2 * PAD + 4)

    def paint(
        self, painter: QPainter, option: QStyleOptionViewItem, index: QModelIndex | QPersistentModelIndex
    ) -> None:
        node = self.model.node(index)
        painter.save()
        try:
            if node.is_host:
                self._paint_host(painter, option, node)
            else:
                self._paint_card(painter, option, node)
        finally:
            painter.restore()

    # ---- a host ------------------------------------------------------------------------------------------

    def _paint_host(self, p: QPainter, option: QStyleOptionViewItem, node: Node) -> None:
        pal: QPalette = option.palette
        info: HostInfo = node.shown  # type: ignore[assignment]
        r = option.rect.adjusted(0, 1, -2, -1)
        p.fillRect(r, pal.color(QPalette.ColorRole.AlternateBase))
        grey = info.stale
        text = _text_color(pal, grey)
        bold = QFont(option.font)
        bold.setBold(True)
        p.setFont(bold)
        p.setPen(text)
        inner = r.adjusted(PAD, 0, -PAD, 0)
        name_w = min(QFontMetrics(bold).horizontalAdvance(node.key) + 4, inner.width() * 3 // 5)
        p.drawText(
            inner, Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignLeft, _elide(bold, node.key, name_w)
        )
        p.setFont(option.font)
        parts = [f"{info.gpus} GPU{'s' if info.gpus != 1 else ''}"]
        if info.lost:
            parts.append(f"{info.lost} lost")
        if info.stale:
            parts.append(f"stale, {age_words(info.age_s)}")
        elif info.room is not None:
            parts.append(f"{info.room} can take a rank")
        rest = inner.adjusted(name_w + 8, 0, 0, 0)
        p.drawText(
            rest,
            Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignRight,
            _elide(option.font, " · ".join(parts), rest.width()),
        )

    # ---- a GPU -------------------------------------------------------------------------------------------

    def _paint_card(self, p: QPainter, option: QStyleOptionViewItem, node: Node) -> None:
        d = node.device
        assert d is not None
        pal: QPalette = option.palette
        grey = d.stale
        card = QRectF(option.rect.adjusted(1, 2, -3, -2))
        p.setRenderHint(QPainter.RenderHint.Antialiasing, True)
        fill = pal.color(QPalette.ColorRole.Base)
        if node.rank is not None:
            tint = QColor(pal.color(QPalette.ColorRole.Highlight))
            tint.setAlpha(40)
            p.fillRect(card, fill)
            fill = tint
        p.setBrush(QBrush(fill))
        p.setPen(pal.color(QPalette.ColorRole.Highlight if node.rank is not None else QPalette.ColorRole.Mid))
        p.drawRoundedRect(card, 3, 3)
        if node.target:
            p.setBrush(Qt.BrushStyle.NoBrush)
            p.setPen(QPen(pal.color(QPalette.ColorRole.Text), 2))
            p.drawRoundedRect(card.adjusted(1, 1, -1, -1), 3, 3)
        if node.rank is not None:
            p.fillRect(
                QRectF(card.left(), card.top(), 4, card.height()), pal.color(QPalette.ColorRole.Highlight)
            )
        p.setRenderHint(QPainter.RenderHint.Antialiasing, False)
        h = QFontMetrics(option.font).height()
        inner = card.toRect().adjusted(PAD + (4 if node.rank is not None else 0), PAD, -PAD, -PAD)
        line1 = QRect(inner.left(), inner.top(), inner.width(), h)
        bar = QRect(inner.left(), line1.bottom() + 1 + GAP, inner.width(), BAR_H)
        line2 = QRect(inner.left(), bar.bottom() + 1 + GAP, inner.width(), h)
        line3 = QRect(inner.left(), line2.bottom() + 1 + GAP, inner.width(), h)
        verdict = self.model.verdict(node)
        self._title(p, option, line1, node, grey)
        _bar(p, pal, bar, d, verdict, grey)
        p.setFont(option.font)
        p.setPen(_text_color(pal, grey))
        _draw(p, option.font, line2, memory_text(d, self.model.unit) if d.ok else "")
        self._status(p, option, line2 if not d.ok else line3, d, verdict, node)

    def _title(self, p: QPainter, option: QStyleOptionViewItem, r: QRect, node: Node, grey: bool) -> None:
        d = node.device
        assert d is not None
        stats = []
        if node.rank is not None:
            stats.append(f"rank {node.rank}")
        if d.utilization_percent is not None:
            stats.append(f"{d.utilization_percent} %")
        if d.temperature_c is not None:
            stats.append(f"{d.temperature_c} °C")
        right = " · ".join(stats)
        fm = QFontMetrics(option.font)
        right_w = min(fm.horizontalAdvance(right), r.width() // 2)
        bold = QFont(option.font)
        bold.setBold(True)
        p.setFont(bold)
        p.setPen(_text_color(option.palette, grey))
        kind = "MIG " if d.is_mig_instance else ""
        _draw(p, bold, r.adjusted(0, 0, -right_w - 6, 0), f"{kind}GPU {d.local_key} · {_short_name(d.name)}")
        p.setFont(option.font)
        _draw(p, option.font, r, right, Qt.AlignmentFlag.AlignRight)

    def _status(
        self, p: QPainter, option: QStyleOptionViewItem, r: QRect, d: GpuDevice, v: Verdict | None, node: Node
    ) -> None:
        pal: QPalette = option.palette
        if not d.ok:
            p.setPen(status_color(pal, ok=False))
            _draw(p, option.font, r, d.error or "")
            return
        if d.stale:
            p.setPen(_text_color(pal, True))
            _draw(p, option.font, r, f"stale: {age_words(d.sample_age_s)} (not placed)")
            return
        if node.children:
            text = "MIG mode: placed through its instances"
        elif v is None:
            text = "no plan to check" if d.total_bytes is not None else "memory not reported"
        else:
            words = verdict_words(v, self.model.unit)  # against free now or total: the panel's switch says
            p.setPen(status_color(pal, v.fits))
            _draw(p, option.font, r, f"{words[0].upper()}{words[1:]}")
            return
        p.setPen(_text_color(pal, True))
        _draw(p, option.font, r, text)


def _text_color(pal: QPalette, grey: bool) -> QColor:
    if grey:
        return pal.color(QPalette.ColorGroup.Disabled, QPalette.ColorRole.Text)
    return pal.color(QPalette.ColorRole.Text)


def _short_name(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'H100 80GB HBM3' (every card of a cluster says NVIDIA)."""
    return name.removeprefix("NVIDIA ").removeprefix("GeForce ") or name


def _elide(font: QFont, text: str, width: int) -> str:
    return QFontMetrics(font).elidedText(text, Qt.TextElideMode.ElideRight, max(0, width))


def _draw(
    p: QPainter, font: QFont, r: QRect, text: str, align: Qt.AlignmentFlag = Qt.AlignmentFlag.AlignLeft
) -> None:
    p.drawText(r, align | Qt.AlignmentFlag.AlignVCenter, _elide(font, text, r.width()))


def _bar(p: QPainter, pal: QPalette, r: QRect, d: GpuDevice, v: Verdict | None, grey: bool) -> None:
    total = d.total_bytes or 0 if d.ok else 0
    plan = v.needed_bytes if v is not None and not grey else 0
    paint_memory_bar(p, pal, QRectF(r), total, d.used_bytes or 0, plan)


def paint_memory_bar(p: QPainter, pal: QPalette, rect: QRectF, total: int, used: int, plan: int) -> None:
    """The memory bar of a GPU card (here and in the local panel): used by others | this plan | free; a plan
    larger than the free memory is hatched in red over the bar's end."""
    r = rect.adjusted(0.5, 0.5, -0.5, -0.5)
    p.fillRect(r, pal.color(QPalette.ColorRole.Base))
    total, used, plan = max(0, total), max(0, used), max(0, plan)
    if total > 0:
        w = r.width()
        used_w = w * min(1.0, used / total)
        p.fillRect(QRectF(r.left(), r.top(), used_w, r.height()), pal.color(QPalette.ColorRole.Mid))
        free = max(0, total - used)
        plan_w = w * min(plan, free) / total
        p.fillRect(
            QRectF(r.left() + used_w, r.top(), plan_w, r.height()), pal.color(QPalette.ColorRole.Highlight)
        )
        if plan > free:
            over_w = min(w, w * (plan - free) / total)
            brush = QBrush(status_color(pal, ok=False), Qt.BrushStyle.BDiagPattern)
            p.fillRect(QRectF(r.right() - over_w, r.top(), over_w, r.height()), brush)
    p.setPen(pal.color(QPalette.ColorRole.Dark))
    p.setBrush(Qt.BrushStyle.NoBrush)
    p.drawRect(r)
