""" "Verify exactly": the plan traced by PyTorch itself, in the background, beside the estimate.

:class:`TraceRunner` runs :func:`gpumem_gui.trace.trace` on a thread (the trace itself in a subprocess of the
chosen Python, so it can be cancelled) and hands back an immutable :class:`~gpumem_gui.trace.TraceReport` or
a failure (one line, its field, the worker's log). :class:`TraceDialog` shows progress with a Cancel button,
then traced vs estimated per phase and per category at the peak, or a state that says what to do: no torch
in the chosen Python (choose another), the model needs its own code (run it?), the trace failed (the reason
and the log). Which Python traces is a setting (``trace/python``); by default this one when it has torch.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import QObject, QSettings, Qt, QTimer, Signal, Slot
from PySide6.QtWidgets import (
    QDialog,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QMessageBox,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QStackedWidget,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from gpumem_gui.core import (
    CATEGORIES,
    GpumemError,
    InferenceRun,
    LoadedModel,
    SizeUnit,
    TrainingRun,
    fmt_bytes,
)
from gpumem_gui.trace import (
    NO_ESTIMATE_NOTE,
    TraceFailure,
    TraceJob,
    TraceReport,
    in_process_available,
    trace,
)
from gpumem_gui.ui.workers import BackgroundRunner

PYTHON_KEY = "trace/python"


def default_python(settings: QSettings) -> str | None:
    """The Python to trace with: the setting, else this one when it has torch (not in the frozen binary)."""
    chosen = settings.value(PYTHON_KEY, "", type=str)
    if chosen:
        return chosen
    if not getattr(sys, "frozen", False) and in_process_available():
        return sys.executable
    return None


def choose_trace_python(parent: QWidget, settings: QSettings) -> bool:
    """Ask for the Python to trace with and keep it (setting ``trace/python``); False when cancelled."""
    path, _ = QFileDialog.getOpenFileName(parent, "The Python of an environment with torch and transformers")
    if path:
        settings.setValue(PYTHON_KEY, path)
    return bool(path)


@dataclass(frozen=True)
class TraceOutcome:
    """What one trace job hands back to the GUI thread: the report, or a failure (one line, its field, the
    worker's log)."""

    report: TraceReport | None = None
    message: str = ""
    field: str = ""
    log: str = ""


class _Attempt:
    """One start of a trace: the subprocess job once it exists, and whether it was cancelled."""

    def __init__(self) -> None:
        self.job: TraceJob | None = None
        self.cancelled = threading.Event()

    def keep(self, job: TraceJob) -> None:
        self.job = job
        if self.cancelled.is_set():
            job.cancel()

    def cancel(self) -> None:
        self.cancelled.set()
        if self.job is not None:
            self.job.cancel()


class TraceRunner(QObject):
    """One trace at a time on a :class:`~gpumem_gui.ui.workers.BackgroundRunner`; ``finished(TraceReport)``
    or ``failed(message, field, log)``. The answer of a cancelled or superseded start is dropped."""

    finished = Signal(object)
    failed = Signal(str, str, str)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._runner = BackgroundRunner("gpumem-trace", parent=self)
        self._runner.finished.connect(self._done)
        self._runner.failed.connect(lambda job_id, message: self._done(job_id, TraceOutcome(message=message)))
        self._attempt = _Attempt()

    def start(
        self,
        model: LoadedModel,
        run: InferenceRun | TrainingRun,
        python: str,
        trust: bool,
        fresh: bool = False,
    ) -> None:
        """Trace on a thread; ``fresh``: ignore a cached result."""
        self._attempt.cancel()
        attempt = self._attempt = _Attempt()

        def work() -> TraceOutcome:
            try:
                rep = trace(
                    model,
                    run,
                    python=python,
                    trust_remote_code=trust,
                    use_cache=not fresh,
                    on_job=attempt.keep,
                )
            except TraceFailure as e:
                return TraceOutcome(message=e.message, field=e.field or "", log=e.log)
            except GpumemError as e:
                return TraceOutcome(
                    message=getattr(e, "message", str(e)), field=getattr(e, "field", "") or ""
                )
            return TraceOutcome(report=rep)

        self._runner.submit(work)

    @Slot(int, object)
    def _done(self, job_id: int, outcome: TraceOutcome) -> None:
        if job_id != self._runner.latest or self._attempt.cancelled.is_set():
            return
        if outcome.report is not None:
            self.finished.emit(outcome.report)
        else:
            self.failed.emit(outcome.message, outcome.field, outcome.log)

    def cancel(self) -> None:
        self._attempt.cancel()

    def wait(self, timeout_s: float = 10) -> None:
        self._runner.wait(int(timeout_s * 1000))


def _item(text: str, right: bool = False) -> QTableWidgetItem:
    it = QTableWidgetItem(text)
    if right:
        it.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
    return it


def _table(headers: list[str], rows: list[list[str]]) -> QTableWidget:
    t = QTableWidget(len(rows), len(headers))
    t.setHorizontalHeaderLabels(headers)
    t.verticalHeader().setVisible(False)
    t.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
    for r, row in enumerate(rows):
        for c, text in enumerate(row):
            t.setItem(r, c, _item(text, right=c > 0))
    t.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Stretch)
    return t


class TraceDialog(QDialog):
    """Progress, then the result or what went wrong (see module docstring)."""

    def __init__(
        self,
        model: LoadedModel,
        run: InferenceRun | TrainingRun,
        settings: QSettings,
        unit: SizeUnit = SizeUnit.GIB,
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self.setWindowTitle("Verify exactly: traced by PyTorch")
        self.resize(720, 520)
        self.model, self.run, self.settings, self.unit = model, run, settings, unit
        self.report: TraceReport | None = None
        self.runner = TraceRunner(self)
        self.runner.finished.connect(self._on_finished)
        self.runner.failed.connect(self._on_failed)
        self._t0 = 0.0
        self._trusted = False
        self._status_text = ""
        self._timer = QTimer(self, interval=200)
        self._timer.timeout.connect(self._tick)
        self.stack = QStackedWidget()
        self.progress_page, self.result_page, self.problem_page = QWidget(), QWidget(), QWidget()
        for page in (self.progress_page, self.result_page, self.problem_page):
            QVBoxLayout(page)
            self.stack.addWidget(page)
        self.title = QLabel(
            f"<b>{model.name}</b>: {'training' if isinstance(run, TrainingRun) else 'inference'}"
        )
        self._build_progress()
        self.problem = QLabel()
        self.problem.setWordWrap(True)
        self.problem.setObjectName("trace_problem")
        self.log = QPlainTextEdit(readOnly=True)
        self.log.setVisible(False)
        self.actions = QHBoxLayout()
        layout = QVBoxLayout(self)
        layout.addWidget(self.title)
        layout.addWidget(self.stack, 1)
        layout.addLayout(self.actions)
        self._buttons()

    # ---- pages ---------------------------------------------------------------------------------------------
    def _build_progress(self) -> None:
        lay = self.progress_page.layout()
        self.status = QLabel("Starting…")
        bar = QProgressBar()
        bar.setRange(0, 0)  # busy: a trace has no known length
        lay.addWidget(self.status)
        lay.addWidget(bar)
        lay.addStretch(1)

    def _buttons(self) -> None:
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.clicked.connect(self.cancel)
        self.python_button = QPushButton("Choose Python…")
        self.python_button.clicked.connect(self.choose_python)
        self.again_button = QPushButton("Trace again")
        self.again_button.clicked.connect(lambda: self.start(fresh=True))
        self.log_button = QPushButton("Show log")
        self.log_button.clicked.connect(lambda: self.log.setVisible(not self.log.isVisible()))
        close = QPushButton("Close")
        close.clicked.connect(self.close)
        for b in (self.python_button, self.log_button, self.again_button):
            self.actions.addWidget(b)
        self.actions.addStretch(1)
        self.actions.addWidget(self.cancel_button)
        self.actions.addWidget(close)

    def _show(self, page: QWidget, *, running: bool = False) -> None:
        self.stack.setCurrentWidget(page)
        self.cancel_button.setVisible(running)
        self.again_button.setVisible(not running)
        self.log_button.setVisible(bool(self.log.toPlainText()) and not running)

    # ---- running -------------------------------------------------------------------------------------------
    def start(self, trust: bool = False, fresh: bool = False) -> None:
        """Trace the plan (a cached answer comes back at once unless ``fresh``)."""
        python = default_python(self.settings)
        if python is None:
            self._problem(
                "No Python with torch and transformers is set for tracing. Choose the Python of the "
                "environment you train or serve in (for example …/venv/bin/python).",
                "",
            )
            return
        self._t0 = time.monotonic()
        self._trusted = trust
        self._status_text = f"Tracing with {python}: building the real model under fake tensors…"
        self.status.setText(self._status_text)
        self._show(self.progress_page, running=True)
        self._timer.start()
        self.runner.start(self.model, self.run, python, trust, fresh)

    @Slot()
    def cancel(self) -> None:
        self.runner.cancel()
        self._timer.stop()
        self._problem("Cancelled.", "")

    def _tick(self) -> None:
        self.status.setText(f"{self._status_text} ({time.monotonic() - self._t0:.0f} s)")

    @Slot(object)
    def _on_finished(self, rep: TraceReport) -> None:
        self._timer.stop()
        self.report = rep
        self._fill_result(rep)
        self._show(self.result_page)

    @Slot(str, str, str)
    def _on_failed(self, message: str, field: str, log: str) -> None:
        self._timer.stop()
        if field == "trust_remote_code" and not self._trusted and self._ask_remote_code():
            self.start(trust=True)
            return
        self._problem(message, log)

    def _ask_remote_code(self) -> bool:
        answer = QMessageBox.question(
            self,
            "Run the model's own code?",
            "This config needs the model's own Python code, which would run in your environment. Run it?",
        )
        return answer == QMessageBox.StandardButton.Yes

    def _problem(self, message: str, log: str) -> None:
        lay = self.problem_page.layout()
        if lay.count() == 0:
            lay.addWidget(self.problem)
            lay.addWidget(self.log, 1)
        self.problem.setText(message)
        self.log.setPlainText(log)
        self.log.setVisible(False)
        self._show(self.problem_page)

    @Slot()
    def choose_python(self) -> None:
        if choose_trace_python(self, self.settings):
            self.start()

    # ---- the result ----------------------------------------------------------------------------------------
    def _fill_result(self, rep: TraceReport) -> None:
        lay = self.result_page.layout()
        while lay.count():
            w = lay.takeAt(0).widget()
            if w is not None:
                w.deleteLater()
        r = rep.result
        head = QLabel(
            f"Traced {r.how} ({r.environment}). Peak {fmt_bytes(r.peak_bytes, self.unit)} in {r.peak_phase}."
        )
        head.setWordWrap(True)
        lay.addWidget(head)
        rows = [
            [
                p.phase,
                fmt_bytes(p.traced_bytes, self.unit, 3),
                *self._est(p.estimated_bytes),
                p.difference_text,
            ]
            for p in rep.phases
        ]
        self.phase_table = _table(["phase", "traced", "estimated", "estimate vs trace"], rows)
        self.phase_table.setObjectName("trace_phases")
        lay.addWidget(self.phase_table)
        peak = rep.peak
        rows = [
            [
                c,
                fmt_bytes(peak.traced[c], self.unit, 3),
                *self._est(peak.estimated[c] if peak.estimated else None),
            ]
            for c in CATEGORIES
        ]
        lay.addWidget(QLabel(f"At the peak ({r.peak_phase}), by category"))
        self.category_table = _table(["category", "traced", "estimated"], rows)
        lay.addWidget(self.category_table)
        notes = [*([NO_ESTIMATE_NOTE] if rep.estimate is None else []), *rep.notes]
        if notes:
            label = QLabel("\n".join(f"• {n}" for n in notes))
            label.setWordWrap(True)
            lay.addWidget(label)

    def _est(self, n: int | None) -> list[str]:
        return ["—" if n is None else fmt_bytes(n, self.unit, 3)]

    def closeEvent(self, event: Any) -> None:
        self.runner.cancel()
        self._timer.stop()
        super().closeEvent(event)
