"""Tools > What the GPU said…: paste or drop what a GPU reported (a CUDA out-of-memory message, an nvidia-smi
table, ``torch.cuda.memory_summary()``, an engine's memory lines, a memory snapshot pickle), and see it read,
drawn beside the estimate of the plan on screen, explained in parts, with the changes that would have made it
fit.

The reading is the core's (:func:`gpumem_gui.core.read_observed`), the explanation too
(:func:`gpumem_gui.core.diagnose`, the same as ``gpumem diagnose``); the diagnosis re-estimates the run's
changes on the observed GPU, so it runs off the GUI thread like the fit report.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSplitter,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from gpumem_gui.core import (
    Component,
    Diagnosis,
    GpumemError,
    ObservedMemory,
    ObservedReport,
    SizeUnit,
    TrainingRun,
    diagnose,
    fmt_bytes,
    latest_record,
    observed_file_bytes,
    read_observed,
    read_observed_bytes,
)
from gpumem_gui.ui.chart_base import Chart, ChartLegend, StackedBars, nice_ceil, ref_line, set_line, set_ticks
from gpumem_gui.ui.messages import error_line
from gpumem_gui.ui.theme import CAPACITY_COLOR
from gpumem_gui.ui.workers import BackgroundRunner

if TYPE_CHECKING:
    from gpumem_gui.ui.main_window import MainWindow

# what a dropped or opened report file may be: text a runtime printed, or a memory snapshot pickle
REPORT_SUFFIXES = (".txt", ".log", ".out", ".err", ".csv", ".pickle", ".pkl")
PASTE_HINT = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
    "79.15 GiB of which 1.19 GiB is free. ...\n"
    "or an nvidia-smi table, nvidia-smi --query-gpu=... --format=csv, torch.cuda.memory_summary(), "
    "vLLM / SGLang / llama.cpp memory lines; or drop a file (a torch.cuda.memory._snapshot() pickle too)"
)


def record_title(i: int, o: ObservedMemory) -> str:
    """How one record is named in the picker: its place, its format and its GPU."""
    gpu = f"GPU {o.gpu_index}" if o.gpu_index is not None else "GPU ?"
    name = f" ({o.gpu_name})" if o.gpu_name else ""
    return f"{i + 1}. {o.source_format}, {gpu}{name}"


class _ReportEdit(QPlainTextEdit):
    """The paste box: text as usual; a dropped file is read as a report (snapshot pickles included)."""

    file_dropped = Signal(str)

    def dragEnterEvent(self, e: QDragEnterEvent) -> None:
        if e.mimeData().hasUrls():
            e.acceptProposedAction()
        else:
            super().dragEnterEvent(e)

    def dropEvent(self, e: QDropEvent) -> None:
        urls = [u for u in e.mimeData().urls() if u.isLocalFile()] if e.mimeData().hasUrls() else []
        if urls:
            e.acceptProposedAction()
            self.file_dropped.emit(urls[0].toLocalFile())
            return
        super().dropEvent(e)


class DiagnoseDialog(QDialog):
    """Paste, read, explain: the observed memory beside the plan's estimate (a bar each), the parts, the
    verdict and the ranked changes."""

    def __init__(self, window: MainWindow) -> None:
        super().__init__(window)
        self.window = window
        self.setWindowTitle("What the GPU said")
        self.report: ObservedReport | None = None
        self.diagnosis: Diagnosis | None = None
        self._job = -1
        self.runner = BackgroundRunner("diagnose", parent=self)
        self.runner.finished.connect(self._on_done)
        self.runner.failed.connect(self._on_failed)
        layout = QVBoxLayout(self)
        layout.addWidget(QLabel("Paste what the GPU said, or drop a file:"))
        self.edit = _ReportEdit()
        self.edit.setPlaceholderText(PASTE_HINT)
        self.edit.setMinimumHeight(110)
        self.edit.file_dropped.connect(lambda p: self.window.guard(lambda: self.load_file(p)))
        layout.addWidget(self.edit)
        layout.addLayout(self._buttons())
        self.status = QLabel("")
        self.status.setWordWrap(True)
        layout.addWidget(self.status)
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(self._chart_box())
        self.text = QTextBrowser()
        self.text.setOpenExternalLinks(False)
        split.addWidget(self.text)
        split.setSizes([380, 620])
        layout.addWidget(split, 1)
        self.resize(1100, 720)

    def _buttons(self) -> QHBoxLayout:
        row = QHBoxLayout()
        self.open_button = QPushButton("Open file…")
        self.open_button.clicked.connect(self._open_dialog)
        self.explain_button = QPushButton("Explain")
        self.explain_button.setDefault(True)
        self.explain_button.clicked.connect(lambda: self.window.guard(self.read_text))
        self.records = QComboBox()
        self.records.setMinimumWidth(260)
        self.records.setToolTip("the report the explanation is about, where the paste holds several")
        self.records.currentIndexChanged.connect(lambda _i: self.explain())
        row.addWidget(self.open_button)
        row.addWidget(self.explain_button)
        row.addWidget(QLabel("Report:"))
        row.addWidget(self.records, 1)
        return row

    def _chart_box(self) -> QWidget:
        box = QWidget()
        row = QHBoxLayout(box)
        row.setContentsMargins(0, 0, 0, 0)
        self.chart = Chart()
        self.legend = ChartLegend()
        self.bars = StackedBars(self.chart.plot, self.legend)
        self.capacity = ref_line(CAPACITY_COLOR, "capacity", fill=self.chart.palette().base().color())
        self.chart.plot.addItem(self.capacity)
        row.addWidget(self.chart, 1)
        row.addWidget(self.legend)
        return box

    # ---- reading -------------------------------------------------------------------------------------------

    def _open_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self,
            "Open a GPU report",
            "",
            "Reports (*.txt *.log *.out *.err *.csv *.pickle *.pkl);;All files (*)",
        )
        if path:
            self.window.guard(lambda: self.load_file(path))

    def load_file(self, path: Path | str) -> bool:
        """Read a report file; text is shown in the box (a snapshot pickle is not: it is binary)."""
        try:
            data = observed_file_bytes(path)
            report = read_observed_bytes(data)
        except GpumemError as e:
            self._fail(error_line(e))
            return False
        if Path(path).suffix.lower() not in (".pickle", ".pkl"):
            self.edit.setPlainText(data.decode("utf-8", errors="replace"))
        self.set_report(report)
        return True

    def read_text(self) -> bool:
        """Read the box's text; a text that is no report leaves the last explanation and says why."""
        try:
            report = read_observed(self.edit.toPlainText())
        except GpumemError as e:
            self._fail(error_line(e))
            return False
        self.set_report(report)
        return True

    def set_text(self, text: str) -> bool:
        """Put ``text`` in the box and read it (a text dropped on the window)."""
        self.edit.setPlainText(text)
        return self.read_text()

    def set_report(self, report: ObservedReport) -> None:
        self.report = report
        self.records.blockSignals(True)
        self.records.clear()
        self.records.addItems([record_title(i, o) for i, o in enumerate(report.records)])
        self.records.setCurrentIndex(latest_record(report.records))
        self.records.blockSignals(False)
        self.explain()

    # ---- explaining ----------------------------------------------------------------------------------------

    def explain(self) -> None:
        """Diagnose the chosen record against the plan on screen, off the GUI thread."""
        if self.report is None or not 0 <= self.records.currentIndex() < len(self.report.records):
            return
        observed = self.report.records[self.records.currentIndex()]
        model, run, rep = self.window.model, self.window.run, self.window.report
        spec = model.spec if model is not None else None
        weights = model.weights if model is not None and not isinstance(run, TrainingRun) else None
        target = rep.target if rep is not None else None
        what = f"against {model.name}" if model is not None and spec is not None and run is not None else ""
        self.status.setText(f"explaining {self.records.currentText()} {what}…".strip())
        self._job = self.runner.submit(
            lambda: diagnose(observed, spec=spec, run=run, file_weights=weights, target=target)
        )

    def done(self, result: int) -> None:
        self.runner.shutdown()
        super().done(result)

    def _on_done(self, job: int, d: object) -> None:
        if job != self._job or not isinstance(d, Diagnosis):
            return
        self.diagnosis = d
        unit = self.window.unit
        self._draw(d, unit)
        self.text.setHtml(diagnosis_html(d, unit))
        self.status.setText(_headline(d))

    def _on_failed(self, job: int, message: str) -> None:
        if job == self._job:
            self._fail(message)

    def _fail(self, message: str) -> None:
        self.status.setText(f"<b>Not read</b>: {html.escape(message)}")

    def _draw(self, d: Diagnosis, unit: SizeUnit) -> None:
        factor = float(unit.factor)
        observed = [
            Component(key=f"observed_{p.key}", label=f"observed: {p.label}", bytes=p.bytes, explain=p.explain)
            for p in d.parts
            if p.bytes is not None
        ]
        stacks: list[list[Component]] = [observed]
        names = ["observed"]
        if d.estimate is not None:
            stacks.append(list(d.estimate.components))
            names.append("estimate")
        self.bars.set_data(stacks, factor)
        capacity = d.prediction.capacity_bytes if d.prediction else d.observed.total_bytes
        top = max([*self.bars.tops, (capacity or 0) / factor, 1e-9])
        self.chart.plot.setYRange(0, nice_ceil(top * 1.05), padding=0)
        self.chart.plot.setXRange(-0.6, len(stacks) - 0.4, padding=0)
        set_ticks(self.chart.plot, list(enumerate(names)), [])
        self.chart.plot.setLabel("left", unit.value)
        if capacity:
            set_line(self.capacity, capacity / factor, f"capacity {fmt_bytes(capacity, unit)}")
        else:
            self.capacity.hide()


def _headline(d: Diagnosis) -> str:
    if d.prediction is not None:
        return html.escape(d.prediction.summary)
    if d.causes.lines:
        return html.escape(d.causes.lines[0])
    return html.escape(d.no_prediction or "read")


def diagnosis_html(d: Diagnosis, unit: SizeUnit) -> str:
    """The explanation as rich text: the observed parts with their formulas, the verdicts, the estimate beside
    the observed, the ranked changes."""

    def size(n: int | None) -> str:
        return "not stated" if n is None else html.escape(fmt_bytes(n, unit))

    o = d.observed
    out = [
        f"<h3>{html.escape(o.source_format)}" + (f", GPU {o.gpu_index}" if o.gpu_index is not None else "")
    ]
    out[0] += "</h3><table cellspacing=4>"
    for p in d.parts:
        tip = html.escape(p.explain.formula)
        note = f" <i>({html.escape(p.note)})</i>" if p.note else ""
        out.append(f"<tr><td title='{tip}'>{html.escape(p.label)}</td><td align=right>{size(p.bytes)}</td>")
        out.append(f"<td><small>{tip}</small>{note}</td></tr>")
    out.append("</table>")
    if d.causes.lines:
        out.append("<ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in d.causes.lines) + "</ul>")
    if d.prediction is not None:
        out.append(f"<p><b>{html.escape(d.prediction.summary)}</b></p>")
    elif d.no_prediction:
        out.append(f"<p><i>No prediction: {html.escape(d.no_prediction)}</i></p>")
    if d.compared:
        out.append("<h4>Estimate beside the observed</h4><table cellspacing=4>")
        out.append(
            "<tr><th align=left></th><th>estimate</th><th>observed</th><th>observed - estimate</th></tr>"
        )
        for c in d.compared:
            diff = "" if c.difference_bytes is None else html.escape(fmt_bytes(c.difference_bytes, unit))
            out.append(
                f"<tr><td title='{html.escape(c.explain.formula)}'>{html.escape(c.label)}</td>"
                f"<td align=right>{size(c.estimated_bytes)}</td><td align=right>{size(c.observed_bytes)}</td>"
                f"<td align=right>{diff}</td></tr>"
            )
        out.append("</table>")
    if d.changes:
        out.append("<h4>What would have made it fit</h4><ol>")
        for ch in d.changes:
            total = f": {size(ch.total_bytes)}" if ch.total_bytes is not None else ""
            fits = "" if ch.fits is None else (" (fits)" if ch.fits else " (does not fit)")
            out.append(f"<li>{html.escape(ch.description)}{total}{fits}</li>")
        out.append("</ol>")
    if o.unread:
        out.append("<p><small>Not read: " + html.escape("; ".join(o.unread)) + "</small></p>")
    return "".join(out)
