"""Composition root of the desktop app (``gpumem-gui``): parse the flags, build the objects, wire them, run.

It creates the QApplication, the GPU backend (NVML, or a fake scenario with ``--fake-gpus``), the poller in
its own thread, the settings store and the main window, and connects the poller's signals to the window. No
widget reaches for a global: each gets what it needs here. On quit the poller is stopped and its thread
joined, then the backend is closed.

``--self-test`` starts the real window, computes an estimate, waits for the fit report and the sweep, draws
the charts, and exits 0; any failure prints one line and exits 1. Its watchdog
(:class:`~gpumem_gui.ui.watchdog.Watchdog`) starts first, in its own thread, and ends the process with one
line after ``SELF_TEST_TIMEOUT_S`` whatever the GUI thread is busy with, so it never hangs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gpumem_gui import __version__

if TYPE_CHECKING:
    from PySide6.QtCore import QObject
    from PySide6.QtWidgets import QApplication

    from gpumem_gui.hardware import GpuBackend
    from gpumem_gui.ui.main_window import MainWindow
    from gpumem_gui.ui.watchdog import Watchdog

EXIT_OK = 0
EXIT_SELF_TEST_FAILED = 1
EXIT_BAD_INPUT = 2
SELF_TEST_TIMEOUT_S = 60


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpumem-gui", description="Will this model, in this setup, fit on my GPUs? (desktop window)"
    )
    p.add_argument(
        "path",
        nargs="?",
        help="a model to open (config.json, model folder, .safetensors, .gguf, catalog or hub id) "
        "or a saved scenario (.json)",
    )
    p.add_argument("--version", action="store_true", help="print the version and exit")
    p.add_argument(
        "--fake-gpus",
        metavar="FILE|NAME",
        help="read GPUs from a fake scenario (a JSON file, or a shipped name such as rtx4090_browser, "
        "8xh100_busy, a100_mig, gpu_lost, no_driver) instead of NVML",
    )
    p.add_argument(
        "--self-test",
        action="store_true",
        help="start the window, compute an estimate, draw the charts, and exit 0 (non-zero on failure)",
    )
    p.add_argument("--poll-ms", type=int, default=1000, help="GPU polling interval in ms (default 1000)")
    # tests shorten the self-test's watchdog (tests/test_rough_ui.py)
    p.add_argument("--self-test-timeout", type=float, default=SELF_TEST_TIMEOUT_S, help=argparse.SUPPRESS)
    # for benchmarks/bench_ui.py: print the wall-clock time of the first paint and quit
    p.add_argument("--quit-after-paint", action="store_true", help=argparse.SUPPRESS)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args, qt_args = build_parser().parse_known_args(list(sys.argv[1:] if argv is None else argv))
    if args.version:
        print(f"gpumem-gui {__version__}")
        return EXIT_OK
    watchdog = None
    if args.self_test:  # first: it must cover the imports and the GPU backend's start too
        from gpumem_gui.ui.watchdog import Watchdog

        watchdog = Watchdog(args.self_test_timeout).start()
    try:
        return _main(args, qt_args, watchdog)
    finally:
        if watchdog is not None:
            watchdog.disarm()


def _main(args: argparse.Namespace, qt_args: list[str], watchdog: Watchdog | None) -> int:
    """The GPU backend, the QApplication and the window; the exit status."""
    # gpumem_gui.ui imports PySide6 before anything imports pyqtgraph (the charts, after the first paint)
    import gpumem_gui.ui  # noqa: F401
    from gpumem_gui.core import GpumemError
    from gpumem_gui.hardware import default_backend

    try:
        backend = default_backend(args.fake_gpus)
    except GpumemError as e:
        print(f"gpumem-gui: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    app = _application(qt_args)
    temp_settings = None
    if args.self_test or args.quit_after_paint:  # never touch the user's settings in a test run
        temp_settings = tempfile.TemporaryDirectory(prefix="gpumem-gui-")
    failures: list[str] = []
    old_hook = sys.excepthook
    sys.excepthook = _recording_excepthook(failures)
    try:
        return _run(app, args, backend, temp_settings, failures, watchdog)
    finally:
        sys.excepthook = old_hook
        if temp_settings is not None:
            temp_settings.cleanup()


def _application(qt_args: list[str]) -> QApplication:
    """The QApplication (PySide6 is imported by now), named for QSettings. pyqtgraph is not imported here: the
    charts import it after the first paint (gpumem_gui.ui.chart_slots), and set its options then."""
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication([sys.argv[0], *qt_args])
    app.setOrganizationName("gpumem")
    app.setApplicationName("gpumem")
    app.setApplicationVersion(__version__)
    return app  # type: ignore[return-value]


def _recording_excepthook(failures: list[str]) -> Callable[..., None]:
    """An excepthook that records what escaped a slot (the self-test fails on it) and prints it."""

    def excepthook(exc_type: type[BaseException], exc: BaseException, tb: object) -> None:
        failures.append(f"{exc_type.__name__}: {exc}")
        traceback.print_exception(exc_type, exc, tb)  # type: ignore[arg-type]

    return excepthook


def _run(
    app: QApplication,
    args: argparse.Namespace,
    backend: GpuBackend,
    temp_settings: tempfile.TemporaryDirectory | None,
    failures: list[str],
    watchdog: Watchdog | None = None,
) -> int:
    """Build the poller and the window, wire them, run the event loop; the exit status."""
    from PySide6.QtCore import QCoreApplication, QEvent, QSettings

    from gpumem_gui.ui.gpu_poller import PollerController
    from gpumem_gui.ui.main_window import MainWindow

    if temp_settings is not None:
        settings = QSettings(str(Path(temp_settings.name) / "gpumem.ini"), QSettings.Format.IniFormat)
    else:
        settings = QSettings("gpumem", "gpumem")
    controller = PollerController(backend, interval_ms=args.poll_ms)
    window = MainWindow(settings=settings, restore=temp_settings is None, dialogs=not args.self_test)
    controller.poller.snapshot_ready.connect(window.on_snapshot)
    controller.poller.error.connect(window.on_gpu_error)

    def shutdown() -> None:
        window.shutdown()
        controller.shutdown()
        backend.close()

    app.aboutToQuit.connect(shutdown)
    self_test = None
    if args.self_test and watchdog is not None:
        from gpumem_gui.ui.self_test import SelfTest

        self_test = SelfTest(app, window, failures, watchdog)
        self_test.watch_gpus(controller.poller.snapshot_ready, controller.poller.error)
    _first_paint = _quit_after_first_paint(app, window) if args.quit_after_paint else None  # kept alive
    if args.path and not args.self_test:
        _open_at_start(window, args.path)
    window.show()
    window.gpu_glue.cluster.attach_local(controller)  # starts it unless the saved source is a cluster
    if self_test is not None:
        self_test.start()
    try:
        rc = app.exec()
    finally:
        if controller.thread_running:
            shutdown()
        # delete the window now, while the application exists: left to the interpreter's exit, the
        # widgets' C++ objects could be destroyed after the QApplication (a segfault at exit, seen on the
        # self-test's early-failure path)
        window.deleteLater()
        QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
        del settings
    return self_test.result if self_test is not None else int(rc)


def _open_at_start(window: MainWindow, path: str) -> None:
    """Open the model or scenario given on the command line with the guard the window's own Open has: a
    file that cannot be read is one line on stderr and in the window, and the window starts anyway."""
    from gpumem_gui.files import FileReadError, path_kind

    try:
        exists = path_kind(path) != "missing"
    except FileReadError:
        exists = True  # there, but unreadable: open_path says why
    try:
        opened = window.open_path(path) if exists else window.load_source(path)
    except Exception as e:  # a reader's bug must not keep the window from starting
        window.notify("Not opened", f"{path}: could not be read ({type(e).__name__}: {e})")
        opened = False
    if not opened:
        print(f"gpumem-gui: could not open {path}: {window.last_message}", file=sys.stderr)


def _quit_after_first_paint(app: QApplication, window: MainWindow) -> QObject:
    """Print the wall-clock times of the window's first paint (``first-paint``) and of the first paint of the
    breakdown chart with the estimate drawn in it (``charts-painted``: the charts are built after the first
    paint), then quit (benchmarks/bench_ui.py). Filters on the window and on the chart's viewport only: one on
    the whole application would run in Python for every event before those paints. Keep the returned object
    alive."""
    from PySide6.QtCore import QEvent, QObject, QTimer

    slots = window.results.slots

    class _Paints(QObject):
        window_painted = False
        watching_chart = False

        def eventFilter(self, obj: QObject, event: QEvent) -> bool:
            if event.type() != QEvent.Type.Paint:
                return False
            if obj is window and not self.window_painted:
                self.window_painted = True
                print(f"first-paint {time.time():.6f}", flush=True)
                self._watch_chart()
            elif obj is not window and slots.built:
                print(f"charts-painted {time.time():.6f}", flush=True)
                obj.removeEventFilter(self)
                QTimer.singleShot(0, app.quit)
            return False

        def _watch_chart(self) -> None:
            if self.watching_chart:
                return
            if not slots.built:  # built right after this paint pass: look again then
                QTimer.singleShot(0, self._watch_chart)
                return
            self.watching_chart = True
            viewport = window.results.breakdown.view.viewport()
            viewport.installEventFilter(self)
            viewport.update()

    paints = _Paints()
    window.installEventFilter(paints)
    return paints


if __name__ == "__main__":
    raise SystemExit(main())
