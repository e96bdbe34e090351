"""Tools > What the GPU said (issue 32 item 4): a pasted OOM message or a dropped report file is read, drawn
beside the plan's estimate and explained, with the changes that would have made it fit; what is not a report
says why in one line and keeps the last explanation."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpumem_gui.core import Diagnosis, SizeUnit, diagnose, fmt_bytes, read_observed
from gpumem_gui.ui.diagnose_view import DiagnoseDialog, diagnosis_html
from gpumem_gui.ui.main_window import MainWindow

pytestmark = [pytest.mark.no_qt_log, pytest.mark.usefixtures("qt_warnings_fail")]

FIXTURES = Path(__file__).parent / "reference" / "observed"
OOM = FIXTURES / "torch_oom_current_pytorch16417.txt"  # 22.90 GiB allocated on a 23.65 GiB GPU
SMI = FIXTURES / "nvidia_smi_table_gpustat130.txt"
GIB = 2**30


def _explained(qtbot, dialog: DiagnoseDialog) -> Diagnosis:
    qtbot.waitUntil(lambda: dialog.diagnosis is not None, timeout=20000)
    assert dialog.diagnosis is not None
    return dialog.diagnosis


def test_paste_an_oom_explains_it_against_the_plan(qtbot, main_window: MainWindow) -> None:
    w = main_window
    dialog = w.menus.diagnose()
    assert dialog.isVisible() and w.menus.diagnose() is dialog  # one dialog per window
    assert dialog.set_text(OOM.read_text())
    d = _explained(qtbot, dialog)
    assert d.observed.allocated_bytes == read_observed(OOM.read_text()).records[0].allocated_bytes
    assert d.estimate is not None and d.estimate.total_bytes == w.estimate.total_bytes  # the plan on screen
    assert d.prediction is not None and d.prediction.capacity_bytes == d.observed.total_bytes
    # two bars: the observed parts (adding up to the GPU's total) and the estimate's components
    tops = dialog.bars.tops
    assert len(tops) == 2
    assert tops[0] * GIB == pytest.approx(d.observed.total_bytes, rel=1e-3)
    assert tops[1] * GIB == pytest.approx(d.estimate.total_bytes, rel=1e-9)
    assert dialog.capacity.isVisible() and dialog.capacity.value() * GIB == pytest.approx(
        d.observed.total_bytes
    )
    page = dialog.text.toPlainText()
    assert "tensors (allocated by PyTorch)" in page and "22.90 GiB" in page
    assert d.prediction.summary.split(":")[0] in page
    assert "expandable_segments" in page  # the allocator's own advice is among the changes
    assert d.prediction.summary.split(":")[0] in dialog.status.text()


def test_not_a_report_says_why_and_keeps_the_last_explanation(qtbot, main_window: MainWindow) -> None:
    dialog = main_window.menus.diagnose()
    assert dialog.set_text(OOM.read_text())
    first = _explained(qtbot, dialog)
    assert not dialog.set_text("hello, this is not what a GPU said")
    assert "Not read" in dialog.status.text()
    assert dialog.diagnosis is first and dialog.bars.tops[0] > 0


def test_a_dropped_file_opens_in_the_dialog_and_picks_a_record(
    qtbot, main_window: MainWindow, tmp_path
) -> None:
    w = main_window
    log = tmp_path / "job.log"
    log.write_text(SMI.read_text())
    assert w.open_path(log)  # what a drop on the window does
    dialog = w.menus.diagnose_dialog
    assert dialog is not None and dialog.report is not None
    n = len(dialog.report.records)
    assert dialog.records.count() == n >= 1
    d = _explained(qtbot, dialog)
    assert d.observed.source_format == "nvidia_smi_table"
    if n > 1:  # a second GPU of the table: explained on its own
        dialog.diagnosis = None
        dialog.records.setCurrentIndex(1)
        assert _explained(qtbot, dialog).observed == dialog.report.records[1]
    big = tmp_path / "huge.log"
    big.write_bytes(b"x" * ((64 << 20) + 1))
    assert not dialog.load_file(big)
    assert "at most" in dialog.status.text()


def test_the_page_names_every_part_and_what_was_not_read() -> None:
    d = diagnose(read_observed(OOM.read_text()).records[0])
    page = diagnosis_html(d, SizeUnit.GB)
    assert fmt_bytes(d.observed.allocated_bytes, SizeUnit.GB) in page  # the parts in the window's unit
    for p in d.parts:
        assert p.label.split(" (")[0] in page
    assert "No prediction" in page
