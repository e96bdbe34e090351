"""``gpumem-gui --self-test``: drive the real window once, check what it shows, and quit with a status.

Steps: load the default catalog model, estimate, check the breakdown bars, wait for the fit report and the
48-point sweep from the worker thread, wait for one GPU reading, grab the charts as an image. A watchdog timer
ends the test with a failure after ``timeout_s`` seconds, so it can never hang.
"""

from __future__ import annotations

import sys

from PySide6.QtCore import QObject, QTimer, Slot
from PySide6.QtWidgets import QApplication

from gpumem_gui.ui.main_window import DEFAULT_MODEL, MainWindow


class SelfTest(QObject):
    """Runs the checks from the event loop; ``result`` is the exit status (0: passed)."""

    def __init__(
        self, app: QApplication, window: MainWindow, failures: list[str], timeout_s: float = 60
    ) -> None:
        super().__init__()
        self._app = app
        self._window = window
        self._failures = failures  # exceptions the excepthook saw in slots
        self.result = 1
        self._done = False
        self._watchdog = QTimer(self)
        self._watchdog.setSingleShot(True)
        self._watchdog.setInterval(int(timeout_s * 1000))
        self._watchdog.timeout.connect(lambda: self._finish(False, f"timed out after {timeout_s:g} s"))
        self._poll = QTimer(self)
        self._poll.setInterval(50)
        self._poll.timeout.connect(self._check_ready)
        self._deadline_polls = int(timeout_s * 1000 / 50)

    def start(self) -> None:
        self._watchdog.start()
        QTimer.singleShot(0, self._step_estimate)

    def _finish(self, ok: bool, message: str) -> None:
        if self._done:
            return
        self._done = True
        self._watchdog.stop()
        self._poll.stop()
        if ok and self._failures:
            ok, message = False, f"an exception escaped a slot: {self._failures[0]}"
        self.result = 0 if ok else 1
        print(
            f"gpumem-gui self-test: {'ok' if ok else 'FAILED'}: {message}",
            file=sys.stdout if ok else sys.stderr,
        )
        sys.stdout.flush()
        QTimer.singleShot(0, self._app.quit)

    @Slot()
    def _step_estimate(self) -> None:
        w = self._window
        try:
            if (w.model is None or w.model.source != DEFAULT_MODEL) and not w.load_source(DEFAULT_MODEL):
                raise RuntimeError(f"could not load {DEFAULT_MODEL}: {w.model_panel.error.text()}")
            w.recompute_now()
            est = w.estimate
            if est is None or est.total_bytes <= 0:
                raise RuntimeError("no estimate after recompute")
            heights = w.results.breakdown.bars.heights("weights")
            if not heights or heights[0] <= 0:
                raise RuntimeError("the breakdown chart has no weights bar")
        except Exception as e:
            self._finish(False, f"{type(e).__name__}: {e}")
            return
        self._poll.start()

    @Slot()
    def _check_ready(self) -> None:
        w = self._window
        if w.results.sweep.data and w.gpu_panel.snapshot is not None and w.report is not None:
            self._poll.stop()
            self._step_draw()

    def _step_draw(self) -> None:
        w = self._window
        try:
            w.repaint()
            image = w.results.charts.grab()
            if image.isNull() or image.width() < 100 or image.height() < 100:
                raise RuntimeError(f"the charts did not draw ({image.width()}x{image.height()})")
            est = w.estimate
            assert est is not None and w.report is not None
            snap = w.gpu_panel.snapshot
            assert snap is not None
            message = (
                f"{w.model.name if w.model else '?'}: {est.total_bytes / 2**30:.2f} GiB per GPU, "
                f"{'fits' if w.report.fits else 'does not fit'} on {w.report.target.name}; "
                f"{len(w.results.sweep.data)} sweep points; GPUs: {snap.backend} "
                f"({len(snap.devices)} device(s)); charts {image.width()}x{image.height()}"
            )
        except Exception as e:
            self._finish(False, f"{type(e).__name__}: {e}")
            return
        self._finish(True, message)
