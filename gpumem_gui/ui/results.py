"""The results side: the fit verdict banner, the charts, the component table with explanations, and the ranked
changes that would make the plan fit (each with an Apply button).

Nothing here computes memory: it shows an :class:`~gpumem_gui.core.results.estimate.Estimate`, the core's
verdicts and a :class:`~gpumem_gui.core.fit.FitReport` as the session hands them over
(:mod:`gpumem_gui.ui.plan`), in the unit the window uses.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from PySide6.QtCore import QEvent, QSignalBlocker, Qt, Signal
from PySide6.QtGui import QFont, QPalette, QPixmap
from PySide6.QtWidgets import (
    QComboBox,
    QFrame,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QSplitter,
    QStyle,
    QVBoxLayout,
    QWidget,
)

from gpumem_gui.core import Estimate, SizeUnit, Verdict, fmt_bytes, reported_for
from gpumem_gui.ui.changes_panel import ChangesPanel
from gpumem_gui.ui.chart_slots import ChartSlots
from gpumem_gui.ui.components_view import ComponentTable, ExplanationView
from gpumem_gui.ui.plan import BackgroundView, Plan, ReportView
from gpumem_gui.ui.rank_table import RankTable
from gpumem_gui.ui.report import explanation_html, verdict_words, worst_verdict
from gpumem_gui.ui.theme import ErrorLabel, status_color

if TYPE_CHECKING:
    from gpumem_gui.ui.charts import BreakdownChart, PhaseChart, SweepChart

__all__ = ["ChangesPanel", "ComponentTable", "ExplanationView", "ResultsView", "VerdictBanner"]


# the banner's icon per state ("none": no target, or anything else)
BANNER_ICONS = {
    "fits": QStyle.StandardPixmap.SP_DialogApplyButton,
    "misses": QStyle.StandardPixmap.SP_MessageBoxWarning,
    "stale": QStyle.StandardPixmap.SP_MessageBoxInformation,
    "none": QStyle.StandardPixmap.SP_MessageBoxQuestion,
}


class VerdictBanner(QFrame):
    """One line that answers the question: fits with H headroom, or misses by M; and a detail line."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.setAutoFillBackground(True)
        self.state = "none"
        self._icon_state: str | None = None
        # one pixmap per state, made once (and again only when the style or the font changes): every
        # QStyle.standardIcon() is a new QIcon whose pixmap lands in Qt's global QPixmapCache under a new key,
        # so making one per fit/miss flip grew the process by ~18 MiB over a day (issue 18)
        self._pixmaps: dict[str, QPixmap] = {}
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
        # trace mode: the same plan counted by PyTorch itself (gpumem_gui.ui.trace_view)
        self.verify_button = QPushButton("Verify exactly")
        self.verify_button.setObjectName("verify_exactly")
        self.verify_button.setToolTip(
            "Trace this plan with the real model code under PyTorch's fake tensors and compare it with the "
            "estimate, per phase and per category (needs a Python with torch and transformers)"
        )
        row = QHBoxLayout(self)
        row.setContentsMargins(10, 6, 10, 6)
        row.addWidget(self.icon, 0, Qt.AlignmentFlag.AlignTop)
        row.addLayout(text, 1)
        row.addWidget(self.verify_button, 0, Qt.AlignmentFlag.AlignTop)

    def set_verdict(self, state: str, title: str, detail: str = "") -> None:
        """``state``: 'fits', 'misses', 'none' (no target) or 'stale' (inputs invalid, last result kept)."""
        self.state = state
        self.title.setText(title)
        self.detail.setText(detail)
        self._show_icon(state)
        pal = self.title.palette()
        if state in ("fits", "misses"):
            pal.setColor(QPalette.ColorRole.WindowText, status_color(self.palette(), state == "fits"))
        else:
            pal.setColor(QPalette.ColorRole.WindowText, self.palette().color(QPalette.ColorRole.WindowText))
        self.title.setPalette(pal)

    def _show_icon(self, state: str) -> None:
        key = state if state in BANNER_ICONS else "none"
        if key == self._icon_state:
            return
        if not self._pixmaps:
            size = self.title.fontMetrics().height() + 8
            style = self.style()
            self._pixmaps = {k: style.standardIcon(sp).pixmap(size, size) for k, sp in BANNER_ICONS.items()}
        self.icon.setPixmap(self._pixmaps[key])
        self._icon_state = key

    def changeEvent(self, event: QEvent) -> None:
        if event.type() in (QEvent.Type.StyleChange, QEvent.Type.FontChange) and hasattr(self, "_pixmaps"):
            self._pixmaps = {}  # made again, once, for the new style or size
            state, self._icon_state = self._icon_state, None
            if state is not None:
                self._show_icon(state)
        super().changeEvent(event)

    def add_line(self, text: str) -> None:
        """Append one line to the detail (e.g. the local GPUs the fit report suggests), once."""
        current = self.detail.text()
        if text and text not in current.split("\n"):
            self.detail.setText(f"{current}\n{text}" if current else text)


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
        # the defaults a training framework profile applied (core/training/profiles.py): information, not a
        # warning, so in the ordinary text colour
        self.notes = QLabel()
        self.notes.setWordWrap(True)
        self.notes.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.notes.hide()
        self.sweep_over = QComboBox()
        self.sweep_over.addItem(SWEEP_LABELS["infer"]["seq"], "seq")
        self.sweep_over.addItem(SWEEP_LABELS["infer"]["batch"], "batch")
        self.mode = "infer"
        self.sweep_over.setToolTip("What the sweep chart varies (48 estimates at once)")
        self.sweep_over.currentIndexChanged.connect(
            lambda _i: self.sweep_over_changed.emit(self.sweep_over.currentData())
        )
        self.table = ComponentTable()
        self.explain = ExplanationView()
        self.changes = ChangesPanel()
        self.changes.apply_requested.connect(self.apply_requested)
        self.table.itemSelectionChanged.connect(self._on_table_selection)
        self._est: Estimate | None = None
        self._unit = SizeUnit.GIB

        # the per-rank table of a training run (shown when its ranks differ), under the per-GPU bars
        self.ranks = RankTable()
        # charts in a 2 x 2 grid: breakdown | phases / sweep | the changes that would make it fit; the charts
        # are built after the first paint (pyqtgraph is slow to import) and drawn only while on screen
        self.slots = ChartSlots(self.changes, self.sweep_over, self.ranks)

        bottom = QSplitter(Qt.Orientation.Horizontal)
        bottom.addWidget(self.table)
        bottom.addWidget(self.explain)
        bottom.setStretchFactor(0, 1)
        bottom.setStretchFactor(1, 1)
        bottom.setChildrenCollapsible(False)

        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(self.slots)
        split.addWidget(bottom)
        split.setStretchFactor(0, 5)
        split.setStretchFactor(1, 2)
        split.setChildrenCollapsible(False)
        split.setSizes([640, 260])
        self.splitter = split

        v = QVBoxLayout(self)
        v.setContentsMargins(0, 0, 0, 0)
        v.addWidget(self.banner)
        v.addWidget(self.notes)
        v.addWidget(self.warnings)
        v.addWidget(split, 1)

    # ---- the charts (built on first use: see gpumem_gui.ui.chart_slots) -----------------------------------

    @property
    def charts(self) -> QWidget:
        """The grid of charts, built and up to date (an export or the self-test grabs it)."""
        self.slots.build()
        self.slots.flush(force=True)
        return self.slots

    @property
    def breakdown(self) -> BreakdownChart:
        return self.slots.breakdown

    @property
    def phases(self) -> PhaseChart:
        return self.slots.phases

    @property
    def sweep(self) -> SweepChart:
        return self.slots.sweep

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
        self.slots.show_estimate(est, unit, capacity_bytes, free_bytes)
        self.ranks.show_ranks(est, unit)
        self.table.show_components(est.components, est.total_bytes, unit, reported_for(est))
        applied = est.facts.get("framework_defaults")
        self.notes.setText(str(applied) if applied not in (None, "none") else "")  # profiles.py facts()
        self.notes.setVisible(bool(self.notes.text()))
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
        rank = est.deciding_rank()
        if rank is not None and len(est.ranks) > 1:  # training ranks that differ: name the class
            detail += f" ({rank.role})"
        if "kv_tokens" in est.facts:  # an engine that sizes a KV pool from the GPU (vLLM)
            detail += (
                f"; KV pool {int(est.facts['kv_tokens']):,} tokens for max_model_len "
                f"{int(est.facts.get('max_model_len', 0)):,}"
            )
        self.banner.set_verdict(state, head, detail)

    def show_plan(self, plan: Plan, unit: SizeUnit, no_target: str) -> None:
        """The plan's charts, table and verdict; ``no_target`` says why there is no GPU target."""
        est = plan.estimate
        self.show_estimate(est, unit, capacity_bytes=plan.capacity_bytes, free_bytes=plan.free_now)
        if plan.target is None:
            self.show_no_target(est, no_target, unit)
        elif plan.verdict_error is not None:
            self.show_no_target(est, plan.verdict_error, unit)
        else:
            self.show_verdicts(plan.verdicts, est, plan.target.text, unit)

    def show_report(self, view: ReportView, unit: SizeUnit) -> None:
        """The fit report in the changes panel, and the local GPUs it suggests in the banner."""
        self.changes.show_report(view.report, unit, view.changes, view.note)
        if view.suggestion:
            self.banner.add_line(view.suggestion)

    def show_background(self, view: BackgroundView, unit: SizeUnit) -> None:
        """The worker's answer: the fit report (or why there is none) and the sweep."""
        if view.report is not None:
            self.show_report(view.report, unit)
        else:
            self.changes.clear(view.message)
        s = view.sweep
        self.slots.show_sweep(
            s.over,
            s.points,
            unit,
            capacity_bytes=s.capacity_bytes,
            max_fit=s.max_fit,
            current=s.current,
            what=self.sweep_axis(s.over),
        )

    def show_no_target(self, est: Estimate, reason: str, unit: SizeUnit) -> None:
        self.banner.set_verdict("none", f"Needs {fmt_bytes(est.total_bytes, unit)} per GPU", reason)

    def show_unknown_architecture(self) -> None:
        """The model has no config.json: no estimate until it does."""
        self.banner.set_verdict(
            "stale",
            "The architecture of this model is unknown",
            "Estimates need its config.json: open the folder that holds it, or pick the model in the "
            "catalog.",
        )

    def mark_stale(self, message: str) -> None:
        """The inputs are invalid: keep the last good numbers and say so."""
        self.banner.set_verdict("stale", "Showing the last valid estimate", message)

    def _on_table_selection(self) -> None:
        key = self.table.selected_key()
        est = self._est
        comp = est.component(key) if est is not None and key else None
        text = "" if comp is None else explanation_html(comp, self._unit, est.total_bytes if est else 0)
        self.explain.show_html(text)
