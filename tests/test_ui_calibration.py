"""Issue 32 item 3 in the window: a calibration saved for the target's GPU (as ``gpumem calibrate`` saves it)
applies to the plan, the row under the GPU target says so, and its button removes it."""

from __future__ import annotations

from datetime import date

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox

from gpumem_gui.calibration_store import CalibrationStore
from gpumem_gui.core import Calibration, calibration_from
from gpumem_gui.core.observed import ObservedMemory
from gpumem_gui.ui.target_form import GpuChoice

GiB = 1 << 30


def _cal(name: str, gpu: str) -> Calibration:
    rec = ObservedMemory(
        source_format="torch_oom", process_bytes=21 * GiB, allocated_bytes=18 * GiB, reserved_bytes=19 * GiB
    )
    return calibration_from((rec,), None, name=name, gpu_name=gpu, measured_on=date(2026, 12, 7))


@pytest.fixture
def saved() -> Calibration:
    """A calibration for the window's default GPU (an RTX 4090) under its NVML name, saved before the window
    starts (the store is the test's own: conftest isolates XDG_CONFIG_HOME)."""
    cal = _cal("desk-4090", "NVIDIA GeForce RTX 4090")
    CalibrationStore().save(cal)
    return cal


def test_the_calibration_applies_shows_and_is_removed(
    saved: Calibration, main_window, qtbot, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = main_window
    row = w.run_panel.calibration_row
    assert w.run_panel.target_form.value().gpu_id == "RTX-4090"
    est = w.estimate
    assert est.facts["calibration"] == "desk-4090"
    assert est.component("non_torch").bytes == 2 * GiB  # 21 GiB in use - 19 GiB reserved
    assert row.isVisible() and "desk-4090" in row.label.text() and row.remove_button.isVisible()
    calibrated_total = est.total_bytes
    # another GPU: no calibration, the row hides
    w.run_panel.target_form.set_value(GpuChoice(gpu_id="A100-80GB"))
    w.session.recompute_now()
    qtbot.waitUntil(lambda: "calibration" not in w.estimate.facts, timeout=5000)
    assert not row.isVisible()
    w.run_panel.target_form.set_value(GpuChoice(gpu_id="RTX-4090"))
    w.session.recompute_now()
    qtbot.waitUntil(lambda: w.estimate.facts.get("calibration") == "desk-4090", timeout=5000)
    # removing it (confirmed) takes it out of the store and the plan
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.Yes)
    qtbot.mouseClick(row.remove_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "calibration" not in w.estimate.facts, timeout=5000)
    assert CalibrationStore().load().calibrations == ()
    assert w.estimate.total_bytes != calibrated_total and w.estimate.component("cuda_context") is not None
    assert not row.isVisible()
    w.flush_background()


def test_a_calibration_saved_while_the_window_runs_applies_at_the_next_estimate(main_window, qtbot) -> None:
    w = main_window
    assert "calibration" not in w.estimate.facts
    CalibrationStore().save(_cal("later", "RTX-4090"))
    w.session.recompute_now()
    qtbot.waitUntil(lambda: w.estimate.facts.get("calibration") == "later", timeout=5000)
    assert w.run_panel.calibration_row.isVisible()
    w.flush_background()
