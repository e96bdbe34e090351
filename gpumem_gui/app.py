"""Composition root of the desktop app (``gpumem-gui``): parse the flags, build the objects, wire them, run.

It creates the QApplication, the GPU backend (NVML, or a fake scenario with ``--fake-gpus``), the poller in
its own thread, the settings store and the main window, and connects the poller's signals to the window. No
widget reaches for a global: each gets what it needs here. On quit the poller is stopped and its thread
joined, then the backend is closed.

``--self-test`` starts the real window, computes an estimate, waits for the fit report and the sweep, draws
the charts, and exits 0; any failure prints one line and exits 1; a watchdog timer makes sure it never hangs.
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
    from PySide6.QtWidgets import QApplication, QWidget

    from gpumem_gui.hardware import GpuBackend

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
    # for benchmarks/bench_ui.py: print the wall-clock time of the first paint and quit
    p.add_argument("--quit-after-paint", action="store_true", help=argparse.SUPPRESS)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args, qt_args = build_parser().parse_known_args(list(sys.argv[1:] if argv is None else argv))
    if args.version:
        print(f"gpumem-gui {__version__}")
        return EXIT_OK

    # gpumem_gui.ui imports PySide6 (and QtOpenGL, which pyqtgraph needs) before anything imports pyqtgraph
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
        return _run(app, args, backend, temp_settings, failures)
    finally:
        sys.excepthook = old_hook
        if temp_settings is not None:
            temp_settings.cleanup()


def _application(qt_args: list[str]) -> QApplication:
    """The QApplication (PySide6 is imported by now), named for QSettings, with pyqtgraph's options."""
    import pyqtgraph as pg
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance() or QApplication([sys.argv[0], *qt_args])
    app.setOrganizationName("gpumem")
    app.setApplicationName("gpumem")
    app.setApplicationVersion(__version__)
    pg.setConfigOptions(antialias=True)
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
) -> int:
    """Build the poller and the window, wire them, run the event loop; the exit status."""
    from PySide6.QtCore import QSettings

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
    if args.self_test:
        from gpumem_gui.ui.self_test import SelfTest

        self_test = SelfTest(app, window, failures, timeout_s=SELF_TEST_TIMEOUT_S)
    _first_paint = _quit_after_first_paint(app, window) if args.quit_after_paint else None  # kept alive
    if args.path and not args.self_test:
        opened = window.open_path(args.path) if Path(args.path).exists() else window.load_source(args.path)
        if not opened:
            print(f"gpumem-gui: could not open {args.path}: {window.last_message}", file=sys.stderr)
    window.show()
    window.gpu_glue.cluster.attach_local(controller)  # starts it unless the saved source is a cluster
    if self_test is not None:
        self_test.start()
    try:
        rc = app.exec()
    finally:
        if controller.thread_running:
            shutdown()
        window.deleteLater()
        del settings
    return self_test.result if self_test is not None else int(rc)


def _quit_after_first_paint(app: QApplication, window: QWidget) -> QObject:
    """Print the wall-clock time of the window's first paint and quit (benchmarks/bench_ui.py). The window
    is painted first, before its children; a filter on the whole application would run in Python for every
    event before that paint. Keep the returned filter alive."""
    from PySide6.QtCore import QEvent, QObject, QTimer

    class _FirstPaint(QObject):
        done = False

        def eventFilter(self, obj: QObject, event: QEvent) -> bool:
            if event.type() == QEvent.Type.Paint and not self.done:
                self.done = True
                print(f"first-paint {time.time():.6f}", flush=True)
                QTimer.singleShot(0, app.quit)
            return False

    first_paint = _FirstPaint()
    window.installEventFilter(first_paint)
    return first_paint


if __name__ == "__main__":
    raise SystemExit(main())
