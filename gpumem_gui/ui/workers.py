"""Running a slow call off the GUI thread and getting its result back as a queued signal.

:class:`BackgroundRunner` owns a :class:`QThreadPool`. ``submit(fn)`` returns a job id; the result arrives in
the GUI thread as ``finished(job_id, result)`` or ``failed(job_id, message)``. The window keeps the id of its
latest job and ignores older ones, so a slow answer never overwrites a newer one. The runnable is a plain
``QRunnable`` (no ``QObject`` multiple inheritance); it emits on a relay object that lives in the GUI
thread. A job that raises :class:`~gpumem_gui.core.Superseded` (its answer no longer wanted) emits nothing.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable

from PySide6.QtCore import QObject, QRunnable, QThreadPool, Signal, Slot

from gpumem_gui.core import Superseded
from gpumem_gui.ui.messages import error_line


class _Relay(QObject):
    finished = Signal(int, object)
    failed = Signal(int, str)


class _Job(QRunnable):
    def __init__(self, relay: _Relay, job_id: int, fn: Callable[[], object]) -> None:
        super().__init__()
        self._relay = relay
        self._id = job_id
        self._fn = fn
        self.setAutoDelete(True)

    def run(self) -> None:
        try:
            result = self._fn()
        except Superseded:  # stopped because newer inputs replaced it (core/cancel.py): no answer, no error
            return
        except Exception as e:  # a bug must not kill the worker thread silently; one line, never raw pydantic
            self._emit_failed(error_line(e))
        else:
            with contextlib.suppress(RuntimeError):  # the window went away while we worked
                self._relay.finished.emit(self._id, result)

    def _emit_failed(self, message: str) -> None:
        with contextlib.suppress(RuntimeError):
            self._relay.failed.emit(self._id, message)


class BackgroundRunner(QObject):
    """A small thread pool whose results come back to the GUI thread.

    Signals:
        finished(int, object): job id and its result.
        failed(int, str): job id and a one-line reason.
    """

    finished = Signal(int, object)
    failed = Signal(int, str)

    def __init__(self, name: str, max_threads: int = 1, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._pool = QThreadPool(self)
        self._pool.setObjectName(name)
        self._pool.setMaxThreadCount(max_threads)
        self._relay = _Relay(self)
        self._relay.finished.connect(self._on_finished)
        self._relay.failed.connect(self._on_failed)
        self._ids = itertools.count(1)
        self.latest = 0

    def submit(self, fn: Callable[[], object], *, drop_pending: bool = True) -> int:
        """Run ``fn`` in the pool; with ``drop_pending`` jobs not started yet are dropped first."""
        if drop_pending:
            self._pool.clear()
        job_id = next(self._ids)
        self.latest = job_id
        self._pool.start(_Job(self._relay, job_id, fn))
        return job_id

    def wait(self, timeout_ms: int = 5000) -> bool:
        return self._pool.waitForDone(timeout_ms)

    def shutdown(self, timeout_ms: int = 3000) -> bool:
        self._pool.clear()
        return self._pool.waitForDone(timeout_ms)

    @Slot(int, object)
    def _on_finished(self, job_id: int, result: object) -> None:
        self.finished.emit(job_id, result)

    @Slot(int, str)
    def _on_failed(self, job_id: int, message: str) -> None:
        self.failed.emit(job_id, message)
