"""Polling a GPU backend off the GUI thread: a worker QObject in its own QThread, with a QTimer made there.

``GpuPoller`` calls ``backend.snapshot()`` every ``interval_ms`` and emits the immutable
:class:`~gpumem_gui.hardware.snapshot.GpuSnapshot`; only such snapshots (and error strings) cross threads,
through queued signals, so nothing here needs a lock. A failing backend emits ``error`` and polling goes on.
:class:`PollerController` owns the thread and the worker::

    controller = PollerController(backend, interval_ms=1000)
    controller.poller.snapshot_ready.connect(panel.show_snapshot)
    controller.start()
    ...
    controller.shutdown()          # stops the timer in its thread, ends the thread, waits for it

The timer is created inside the worker thread, in :meth:`GpuPoller.start`, which the thread's ``started``
signal runs after ``moveToThread``; :meth:`GpuPoller.stop` stops it there and hands the worker back to the
GUI thread, so it can be started again or deleted without cross-thread warnings.
"""

from __future__ import annotations

import contextlib

from PySide6.QtCore import QCoreApplication, QObject, Qt, QThread, QTimer, Signal, Slot
from shiboken6 import Shiboken

from gpumem_gui.hardware.backend import GpuBackend, HardwareError
from gpumem_gui.hardware.snapshot import GpuSnapshot
from gpumem_gui.ui.messages import error_line

DEFAULT_INTERVAL_MS = 1000
MIN_INTERVAL_MS = 50


def _same(a: QObject | None, b: QObject | None) -> bool:
    """Whether two wrappers are the same C++ object (PySide may hand out a new wrapper for the same one)."""
    if a is None or b is None:
        return a is b
    return Shiboken.getCppPointer(a)[0] == Shiboken.getCppPointer(b)[0]


class GpuPoller(QObject):
    """Polls a backend on a timer in whatever thread it lives in.

    Signals:
        snapshot_ready(object): a new :class:`GpuSnapshot`.
        error(str): a poll failed; the reason, in words a person understands. Polling continues.
        stopped(): the timer was stopped (emitted in the worker's thread, after :meth:`stop`).
    """

    snapshot_ready = Signal(object)
    error = Signal(str)
    stopped = Signal()

    # requests from other threads, delivered as queued calls into the poller's own thread
    _start_requested = Signal()
    _stop_requested = Signal()
    _interval_requested = Signal(int)

    def __init__(self, backend: GpuBackend, interval_ms: int = DEFAULT_INTERVAL_MS) -> None:
        super().__init__()
        self._backend = backend
        self._interval_ms = max(MIN_INTERVAL_MS, int(interval_ms))
        self._timer: QTimer | None = None
        self.polls = 0
        self.failures = 0
        self._start_requested.connect(self.start)
        self._stop_requested.connect(self._stop_here)
        self._interval_requested.connect(self._set_interval_here)

    @property
    def backend(self) -> GpuBackend:
        return self._backend

    @property
    def interval_ms(self) -> int:
        return self._interval_ms

    @property
    def active(self) -> bool:
        """Whether the timer is running (read from any thread; approximate while a request is in flight)."""
        return self._timer is not None and self._timer.isActive()

    def _in_own_thread(self) -> bool:
        return _same(QThread.currentThread(), self.thread())

    # ---- slots -------------------------------------------------------------------------------------------

    @Slot()
    def start(self) -> None:
        """Create (once) and start the timer in this object's thread, and poll right away."""
        if not self._in_own_thread():
            self._start_requested.emit()
            return
        if self._timer is None:
            self._timer = QTimer(self)
            self._timer.setObjectName("gpu-poller-timer")
            self._timer.timeout.connect(self.poll_once)
        self._timer.setInterval(self._interval_ms)
        self._timer.start()
        self.poll_once()

    def stop(self) -> None:
        """Stop polling; callable from any thread (the work happens in the poller's thread)."""
        if self._in_own_thread():
            self._stop_here()
        else:
            self._stop_requested.emit()

    @Slot()
    def _stop_here(self) -> None:
        if self._timer is not None:
            self._timer.stop()  # a stopped timer moves with its parent, and restarts in the next thread
        app = QCoreApplication.instance()
        if app is not None and not _same(self.thread(), app.thread()):
            self.moveToThread(app.thread())  # give the worker back to the GUI thread before ours ends
        self.stopped.emit()

    def set_interval_ms(self, interval_ms: int) -> None:
        """Change the polling interval (at least 50 ms); callable from any thread."""
        interval_ms = max(MIN_INTERVAL_MS, int(interval_ms))
        self._interval_ms = interval_ms
        if self._in_own_thread():
            self._set_interval_here(interval_ms)
        else:
            self._interval_requested.emit(interval_ms)

    @Slot(int)
    def _set_interval_here(self, interval_ms: int) -> None:
        if self._timer is not None:
            self._timer.setInterval(interval_ms)

    @Slot()
    def poll_once(self) -> GpuSnapshot | None:
        """Take one snapshot and emit it (or ``error``); never raises. Tests call this directly."""
        self.polls += 1
        try:
            snapshot = self._backend.snapshot()
        except HardwareError as e:
            self.failures += 1
            self.error.emit(e.reason)
            return None
        except Exception as e:  # a backend bug must not end polling either
            self.failures += 1
            self.error.emit(f"Reading the GPUs failed unexpectedly: {error_line(e)}")
            return None
        self.snapshot_ready.emit(snapshot)
        return snapshot


class PollerController(QObject):
    """Owns a :class:`GpuPoller` and its QThread; call ``start()`` and ``shutdown()`` in the GUI thread."""

    def __init__(
        self, backend: GpuBackend, interval_ms: int = DEFAULT_INTERVAL_MS, parent: QObject | None = None
    ) -> None:
        super().__init__(parent)
        self.poller = GpuPoller(backend, interval_ms)
        self._thread: QThread | None = None

    @property
    def thread_running(self) -> bool:
        return self._thread is not None and self._thread.isRunning()

    @property
    def worker_thread(self) -> QThread | None:
        return self._thread

    def start(self) -> None:
        """Start polling in a new thread named ``gpu-poller`` (no-op when already running)."""
        if self.thread_running:
            return
        thread = QThread()
        thread.setObjectName("gpu-poller")
        self.poller.moveToThread(thread)
        thread.started.connect(self.poller.start)
        # direct: the GUI thread is blocked in wait() during shutdown, so a queued quit would never run
        self.poller.stopped.connect(thread.quit, Qt.ConnectionType.DirectConnection)
        self._thread = thread
        thread.start()

    def shutdown(self, timeout_ms: int = 5000) -> bool:
        """Stop the timer (in its thread), end the thread and wait for it; True when it ended in time."""
        thread = self._thread
        if thread is None:
            return True
        if thread.isRunning():
            self.poller.stop()
            finished = thread.wait(timeout_ms)
            if not finished:
                return False
        with contextlib.suppress(RuntimeError, TypeError):
            self.poller.stopped.disconnect(thread.quit)
        self._thread = None  # finished; Python owns it and frees it now
        return True
