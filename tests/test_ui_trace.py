"""The window's "Verify exactly": the plan traced in the background, cancel, and the states that say what to
do (a Python without torch, a failing trace)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

if os.environ.get("GPUMEM_REQUIRE_TRACE") != "1":
    pytest.importorskip("torch", reason="trace mode needs torch (make test installs the trace extra)")
    pytest.importorskip("transformers")

from PySide6.QtCore import QSettings, Qt

from gpumem_gui.core import load_model, make_run
from gpumem_gui.ui.trace_view import PYTHON_KEY, TraceDialog, default_python


@pytest.fixture
def settings(tmp_path: Path) -> QSettings:
    return QSettings(str(tmp_path / "gpumem.ini"), QSettings.Format.IniFormat)


def test_default_python_is_this_one_when_it_has_torch(settings: QSettings) -> None:
    assert default_python(settings) == sys.executable
    settings.setValue(PYTHON_KEY, "/opt/ml/bin/python")
    assert default_python(settings) == "/opt/ml/bin/python"


def test_verify_shows_traced_against_estimated(qt_warnings_fail, qtbot, settings: QSettings) -> None:
    d = TraceDialog(load_model("Llama-3.2-1B"), make_run(seq=128, new_tokens=4), settings)
    qtbot.addWidget(d)
    d.start(fresh=True)
    assert d.stack.currentWidget() is d.progress_page and d.cancel_button.isVisibleTo(d)
    qtbot.waitUntil(lambda: d.report is not None, timeout=120_000)
    assert d.stack.currentWidget() is d.result_page
    phases = [d.phase_table.item(r, 0).text() for r in range(d.phase_table.rowCount())]
    assert phases == ["load", "prefill", "decode"]
    assert d.phase_table.item(1, 3).text() == "+0.00 %"  # the replay equals PyTorch here
    assert d.category_table.item(0, 0).text() == "parameters"


def test_cancel_and_a_python_that_cannot_trace(
    qt_warnings_fail, qtbot, settings: QSettings, tmp_path: Path
) -> None:
    d = TraceDialog(load_model("Qwen3-30B-A3B"), make_run(seq=512), settings)
    qtbot.addWidget(d)
    d.start(fresh=True)
    qtbot.wait(300)
    d.cancel()
    assert d.stack.currentWidget() is d.problem_page and d.problem.text() == "Cancelled."
    d.runner.wait()
    qtbot.wait(200)  # the cancelled job's late answer is dropped, not shown over "Cancelled."
    assert d.problem.text() == "Cancelled." and d.report is None
    settings.setValue(PYTHON_KEY, str(tmp_path / "missing-python"))
    d.start(fresh=True)
    qtbot.waitUntil(lambda: d.stack.currentWidget() is d.problem_page, timeout=30_000)
    assert "cannot run the Python" in d.problem.text()


def test_verify_exactly_from_the_window_opens_the_trace(main_window, qtbot, monkeypatch) -> None:
    """The banner's button traces the window's current plan in the dialog."""
    started = []
    monkeypatch.setattr(TraceDialog, "start", lambda self, **kw: started.append((self.model, self.run)))
    w = main_window
    assert w.menus.verify_action.text().startswith("&Verify exactly")
    qtbot.mouseClick(w.results.banner.verify_button, Qt.MouseButton.LeftButton)
    d = w.menus.trace_dialog
    assert d.isVisible() and started == [(w.model, w.run)]
    d.close()
