"""Test-wide set-up: headless Qt, isolated settings, and the reference data."""

from __future__ import annotations

import json
import os
from pathlib import Path

# Before any QApplication exists: no display here, and no platform + no display aborts the whole process.
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest

REPO = Path(__file__).resolve().parents[1]

# the real-Prometheus fixtures (prometheus_cluster, fresh_cluster, prometheus_tls, ...) for every test module
pytest_plugins = ["tests.prom_fixtures"]


def reference_dir() -> Path:
    env = os.environ.get("GPUMEM_REFERENCE")
    if env:
        return Path(env)
    shared = REPO.parent / "shared" / "reference"
    if (shared / "groundtruth.json").is_file():
        return shared
    return REPO / "tests" / "reference"


@pytest.fixture(scope="session")
def reference() -> Path:
    return reference_dir()


@pytest.fixture(scope="session")
def groundtruth(reference: Path) -> dict:
    return json.loads((reference / "groundtruth.json").read_text())


@pytest.fixture(autouse=True)
def _isolated_dirs(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test gets its own config/cache/data dirs, so nothing a test writes leaks into the user's."""
    base = tmp_path_factory.mktemp("xdg")
    for var in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "HF_HOME"):
        monkeypatch.setenv(var, str(base / var.lower()))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv("GPUMEM_CALIBRATIONS", raising=False)  # the calibrations store: under XDG_CONFIG_HOME


# ---- Qt fixtures for the window's tests (tests/test_ui_*.py) ---------------------------------------------

# The offscreen platform prints this once per top-level window; harmless (what-works-here.md, pitfall 10).
HARMLESS_QT_MESSAGES = ("This plugin does not support propagateSizeHints()",)


@pytest.fixture
def qt_warnings_fail():
    """Fail the test if Qt logs a warning or a critical message (bar the known harmless offscreen line).

    Use it with ``pytest.mark.no_qt_log`` (pytest-qt's own capture stops before teardown, where windows close)
    and request it before ``qtbot`` so it is torn down last. It chains to any handler installed before it.
    """
    from PySide6.QtCore import QtMsgType, qInstallMessageHandler

    bad: list[str] = []
    serious = (QtMsgType.QtWarningMsg, QtMsgType.QtCriticalMsg, QtMsgType.QtFatalMsg)
    previous = None

    def handler(mode, context, message):
        if mode in serious and not any(h in message for h in HARMLESS_QT_MESSAGES):
            bad.append(f"{mode.name}: {message}")
        if previous is not None:
            previous(mode, context, message)

    previous = qInstallMessageHandler(handler)
    yield bad
    qInstallMessageHandler(previous)
    assert bad == [], f"Qt warned: {bad}"


@pytest.fixture
def isolated_settings(tmp_path: Path):
    """A QSettings file in the test's own folder; QSettings' default paths and QStandardPaths point to test
    locations too, so nothing a window test does can read or write the user's real settings."""
    from PySide6.QtCore import QSettings, QStandardPaths

    QStandardPaths.setTestModeEnabled(True)
    folder = tmp_path / "qsettings"
    folder.mkdir()
    for fmt in (QSettings.Format.IniFormat, QSettings.Format.NativeFormat):
        QSettings.setPath(fmt, QSettings.Scope.UserScope, str(folder))
    settings = QSettings(str(folder / "gpumem.ini"), QSettings.Format.IniFormat)
    yield settings
    settings.sync()
    QStandardPaths.setTestModeEnabled(False)


@pytest.fixture
def main_window(qt_warnings_fail, qtbot, isolated_settings):
    """The real main window (offscreen) with isolated settings, no message boxes, the default model loaded
    and its estimate on screen. The test drives it; ``window.flush_background()`` delivers the worker's
    fit report and sweep."""
    from gpumem_gui.ui.main_window import MainWindow

    # readings fed back to back are each drawn at once (the throttle has its own test)
    window = MainWindow(settings=isolated_settings, restore=False, dialogs=False, snapshot_interval_ms=0)
    qtbot.addWidget(window)
    window.show()
    qtbot.waitUntil(lambda: window.estimate is not None, timeout=5000)
    window.flush_background()
    yield window
    window.flush_background()


@pytest.fixture
def fake_snapshots():
    """``fake_snapshots(scenario, steps=1)``: that many snapshots of a fake-GPU scenario (name, file or
    dict), taken straight from a FakeBackend (no poller, no thread)."""
    from gpumem_gui.hardware import FakeBackend

    def take(scenario, steps: int = 1):
        backend = FakeBackend(scenario, cuda_visible_devices=None)
        try:
            return [backend.snapshot() for _ in range(steps)]
        finally:
            backend.close()

    return take
