"""The Qt poller: snapshots from a worker thread, errors that never stop polling, a clean shutdown."""

from __future__ import annotations

from typing import Any

import pytest
from PySide6.QtCore import QCoreApplication, QObject, QThread, QtMsgType, Signal, Slot

from gpumem_gui.hardware import FakeBackend, GpuSnapshot, HardwareError
from gpumem_gui.ui.gpu_poller import (
    DEFAULT_INTERVAL_MS,
    GpuPoller,
    PollerController,
)


@pytest.fixture(autouse=True)
def _no_cuda_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


@pytest.fixture(autouse=True)
def _no_qt_warnings(qtlog: Any) -> Any:
    """Every test here, teardown (thread shutdown) included, must leave no Qt warning behind."""
    yield
    QCoreApplication.processEvents()
    assert qt_warnings(qtlog) == []


def scenario(**faults: Any) -> dict:
    return {
        "faults": faults,
        "gpus": [{"name": "NVIDIA GeForce RTX 4090", "total_mib": 24564, "used_mib": [1, 2]}],
    }


class BuggyBackend:
    """Raises a non-hardware exception on every second poll."""

    name = "buggy"

    def __init__(self) -> None:
        self.inner = FakeBackend(scenario())
        self.calls = 0

    def snapshot(self) -> GpuSnapshot:
        self.calls += 1
        if self.calls % 2 == 0:
            raise ZeroDivisionError("oops")
        return self.inner.snapshot()

    def close(self) -> None:
        pass


class Relay(QObject):
    """Lives in the GUI thread, like the real panel: the poller's signals arrive here queued.

    ``qtbot.waitSignal`` must watch these, not the poller's own signals: its blocker is a plain callable, so a
    signal emitted in the worker thread would run it there and it would stop its GUI-thread timer from the
    wrong thread (a Qt warning that is pytest-qt's, not ours).
    """

    snapshot = Signal(object)
    error = Signal(str)
    stopped = Signal()

    def __init__(self, poller: GpuPoller) -> None:
        super().__init__()
        self.snapshots: list[GpuSnapshot] = []
        self.errors: list[str] = []
        self.threads: list[bool] = []
        poller.snapshot_ready.connect(self._on_snapshot)
        poller.error.connect(self._on_error)
        poller.stopped.connect(self._on_stopped)

    @Slot(object)
    def _on_snapshot(self, snap: GpuSnapshot) -> None:
        self.threads.append(QThread.currentThread() == QCoreApplication.instance().thread())
        self.snapshots.append(snap)
        self.snapshot.emit(snap)

    @Slot(str)
    def _on_error(self, reason: str) -> None:
        self.errors.append(reason)
        self.error.emit(reason)

    @Slot()
    def _on_stopped(self) -> None:
        self.stopped.emit()


@pytest.fixture
def controller(qtbot: Any) -> Any:
    made: list[PollerController] = []

    def make(backend: Any, interval_ms: int = 20) -> PollerController:
        c = PollerController(backend, interval_ms=interval_ms)
        made.append(c)
        return c

    yield make
    for c in made:
        assert c.shutdown()


def qt_warnings(qtlog: Any) -> list[str]:
    return [r.message for r in qtlog.records if r.type in (QtMsgType.QtWarningMsg, QtMsgType.QtCriticalMsg)]


# ---- poll_once, no thread ---------------------------------------------------------------------------------


def test_poll_once_emits_a_snapshot(qtbot: Any) -> None:
    poller = GpuPoller(FakeBackend(scenario()))
    assert poller.interval_ms == DEFAULT_INTERVAL_MS == 1000
    with qtbot.waitSignal(poller.snapshot_ready, timeout=1000) as blocker:
        returned = poller.poll_once()
    (snap,) = blocker.args
    assert isinstance(snap, GpuSnapshot) and snap is returned
    assert snap.devices[0].used_bytes == 1 << 20


def test_hardware_error_is_reported_and_polling_goes_on(qtbot: Any) -> None:
    poller = GpuPoller(FakeBackend(scenario(raise_at_steps=[1])))
    snaps: list[GpuSnapshot] = []
    errors: list[str] = []
    poller.snapshot_ready.connect(snaps.append)
    poller.error.connect(errors.append)
    for _ in range(3):
        poller.poll_once()
    assert len(snaps) == 2
    assert len(errors) == 1 and "injected fault at step 1" in errors[0]
    assert (poller.polls, poller.failures) == (3, 1)


def test_unexpected_backend_exception_is_an_error_signal(qtbot: Any) -> None:
    poller = GpuPoller(BuggyBackend())
    with qtbot.waitSignal(poller.error, timeout=1000) as blocker:
        poller.poll_once()
        poller.poll_once()
    assert "ZeroDivisionError: oops" in blocker.args[0]
    with qtbot.waitSignal(poller.snapshot_ready, timeout=1000):
        poller.poll_once()


def test_interval_has_a_floor(qtbot: Any) -> None:
    poller = GpuPoller(FakeBackend(scenario()), interval_ms=1)
    assert poller.interval_ms == 50
    poller.set_interval_ms(250)
    assert poller.interval_ms == 250


# ---- threaded -------------------------------------------------------------------------------------------


def test_threaded_polling_emits_snapshots(qtbot: Any, controller: Any) -> None:
    c = controller(FakeBackend(scenario()))
    relay = Relay(c.poller)
    with qtbot.waitSignal(relay.snapshot, timeout=3000) as blocker:
        c.start()
    assert isinstance(blocker.args[0], GpuSnapshot)
    assert c.thread_running
    worker = c.worker_thread
    assert worker is not None and worker.objectName() == "gpu-poller"
    assert c.poller.thread() == worker
    assert worker != QCoreApplication.instance().thread()
    # the timer was created inside the worker thread
    assert c.poller._timer is not None and c.poller._timer.thread() == worker
    # and keeps producing, delivered in the GUI thread
    for _ in range(3):
        with qtbot.waitSignal(relay.snapshot, timeout=3000):
            pass
    assert all(relay.threads)


def test_snapshots_are_taken_in_the_worker_thread(qtbot: Any, controller: Any) -> None:
    seen: list[bool] = []

    class Recording(FakeBackend):
        def snapshot(self) -> GpuSnapshot:
            seen.append(QThread.currentThread() == QCoreApplication.instance().thread())
            return super().snapshot()

    c = controller(Recording(scenario()))
    relay = Relay(c.poller)
    with qtbot.waitSignal(relay.snapshot, timeout=3000):
        c.start()
    assert seen and not any(seen)


def test_threaded_polling_survives_errors(qtbot: Any, controller: Any) -> None:
    c = controller(FakeBackend(scenario(raise_at_steps=[0, 2, 3])))
    relay = Relay(c.poller)
    c.start()
    qtbot.waitUntil(lambda: len(relay.snapshots) >= 3, timeout=5000)
    assert len(relay.errors) == 3 and all("injected fault" in e for e in relay.errors)
    assert c.thread_running


def test_unexpected_exception_in_thread_does_not_stop_polling(qtbot: Any, controller: Any) -> None:
    c = controller(BuggyBackend())
    relay = Relay(c.poller)
    c.start()
    qtbot.waitUntil(lambda: len(relay.snapshots) >= 3 and len(relay.errors) >= 2, timeout=5000)
    assert "ZeroDivisionError" in relay.errors[0]


def test_set_interval_while_running(qtbot: Any, controller: Any) -> None:
    c = controller(FakeBackend(scenario()), interval_ms=5000)
    relay = Relay(c.poller)
    with qtbot.waitSignal(relay.snapshot, timeout=3000):
        c.start()  # the first poll is immediate
    c.poller.set_interval_ms(50)
    qtbot.waitUntil(lambda: c.poller._timer is not None and c.poller._timer.interval() == 50, timeout=2000)
    with qtbot.waitSignal(relay.snapshot, timeout=2000):
        pass


def test_shutdown_is_clean_and_restartable(qtbot: Any, qtlog: Any, controller: Any) -> None:
    c = controller(FakeBackend(scenario()))
    relay = Relay(c.poller)
    with qtbot.waitSignal(relay.snapshot, timeout=3000):
        c.start()
    with qtbot.waitSignal(relay.stopped, timeout=3000):
        assert c.shutdown()
    assert not c.thread_running and c.worker_thread is None
    assert not c.poller.active
    app_thread = QCoreApplication.instance().thread()
    assert c.poller.thread() == app_thread  # handed back to the GUI thread
    QCoreApplication.processEvents()
    count = len(relay.snapshots)
    with qtbot.assertNotEmitted(relay.snapshot, wait=200):
        pass
    assert len(relay.snapshots) == count
    assert c.shutdown()  # twice is fine
    # a second start works, in a fresh thread
    with qtbot.waitSignal(relay.snapshot, timeout=3000):
        c.start()
    assert c.shutdown()
    QCoreApplication.processEvents()
    assert qt_warnings(qtlog) == []


def test_stop_from_the_gui_thread_stops_the_timer(qtbot: Any, controller: Any) -> None:
    c = controller(FakeBackend(scenario()))
    relay = Relay(c.poller)
    with qtbot.waitSignal(relay.snapshot, timeout=3000):
        c.start()
    with qtbot.waitSignal(relay.stopped, timeout=3000):
        c.poller.stop()
    assert not c.poller.active


def test_shutdown_before_start(qtbot: Any) -> None:
    c = PollerController(FakeBackend(scenario()))
    assert c.shutdown()


def test_backend_error_type_is_hardware_error() -> None:
    # the poller's contract: backends raise HardwareError, whose reason is what the UI shows
    e = HardwareError("GPU went away")
    assert e.reason == "GPU went away" and str(e) == "GPU went away"
