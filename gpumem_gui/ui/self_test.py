"""``gpumem-gui --self-test``: drive the real window once, check what it shows, and quit with a status.

Steps: load the default catalog model, estimate, check the breakdown bars, wait for the fit report and the
48-point sweep from the worker thread, wait for one GPU reading, grab the charts as an image. GPU readings
that keep failing (``FAILED_READINGS`` in a row, none ever succeeding) end the test with the GPU's error. The
watchdog (:class:`~gpumem_gui.ui.watchdog.Watchdog`, started by ``gpumem_gui.app`` before anything heavy is
imported) ends the process after ``timeout_s`` seconds whatever the GUI thread is doing, so it never hangs;
this object tells it what is being waited for.
"""

from __future__ import annotations

import sys

from PySide6.QtCore import QObject, QTimer, SignalInstance, Slot
from PySide6.QtWidgets import QApplication

from gpumem_gui.ui.main_window import DEFAULT_MODEL, MainWindow
from gpumem_gui.ui.messages import error_line, one_line
from gpumem_gui.ui.watchdog import Watchdog

FAILED_READINGS = 3  # GPU readings failed in a row, none ever read: the GPUs cannot be read


class SelfTest(QObject):
    """Runs the checks from the event loop; ``result`` is the exit status (0: passed)."""

    def __init__(
        self, app: QApplication, window: MainWindow, failures: list[str], watchdog: Watchdog
    ) -> None:
        super().__init__()
        self._app = app
        self._window = window
        self._failures = failures  # exceptions the excepthook saw in slots
        self._watchdog = watchdog
        self.result = 1
        self._done = False
        self._readings = 0  # GPU readings that arrived
        self._failed_in_row = 0
        self._gpu_error = ""
        self._poll = QTimer(self)
        self._poll.setInterval(50)
        self._poll.timeout.connect(self._check_ready)

    def watch_gpus(self, reading: SignalInstance, error: SignalInstance) -> None:
        """Count the poller's readings and failures (``snapshot_ready``, ``error``)."""
        reading.connect(self._on_reading)
        error.connect(self._on_gpu_error)

    @Slot(object)
    def _on_reading(self, _snap: object) -> None:
        self._readings += 1
        self._failed_in_row = 0

    @Slot(str)
    def _on_gpu_error(self, reason: str) -> None:
        self._failed_in_row += 1
        self._gpu_error = one_line(reason)
        if not self._readings:
            self._watchdog.stage = f"waiting for a GPU reading (the last one failed: {self._gpu_error})"
        if not self._readings and self._failed_in_row >= FAILED_READINGS:
            n = self._failed_in_row
            self._finish(False, f"GPU readings failed {n} times in a row: {self._gpu_error}")

    def start(self) -> None:
        self._watchdog.stage = "estimating"
        QTimer.singleShot(0, self._step_estimate)

    def _finish(self, ok: bool, message: str) -> None:
        if self._done:
            return
        self._done = True
        self._watchdog.stage = "shutting down"
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
            self._finish(False, error_line(e))
            return
        self._watchdog.stage = "waiting for the fit report, the sweep and a GPU reading"
        self._poll.start()

    @Slot()
    def _check_ready(self) -> None:
        w = self._window
        if w.results.sweep.data and w.gpu_panel.snapshot is not None and w.report is not None:
            self._poll.stop()
            self._step_draw()

    def _step_draw(self) -> None:
        w = self._window
        self._watchdog.stage = "drawing the charts"
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
            self._finish(False, error_line(e))
            return
        self._finish(True, message)
