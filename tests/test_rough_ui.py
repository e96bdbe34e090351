"""Issue 18, the window's rough edges: icons made once, one error line, a watchdog that fires, the GPU panel
with thousands of GPUs, and the core's formats without gguf-py at import (the charts, the sweep's progress
and the random form values: tests/test_rough_ui_charts.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from PySide6.QtGui import QColor, QPixmap, QPixmapCache

from gpumem_gui.core import GpumemInputError, InferenceRun
from gpumem_gui.ui.main_window import MainWindow
from gpumem_gui.ui.messages import MAX_LINE, error_line, one_line
from tests.app_process import run_app
from tests.conftest import REPO

pytestmark = [pytest.mark.no_qt_log]

MiB = 1 << 20
H100_MIB = 81559  # resources/fake_gpus/8xh100_busy.json


def _h100s(n: int, used: list[int] | int = 1024, **gpu: object) -> dict:
    return {
        "version": 1,
        "gpus": [{"name": "NVIDIA H100 80GB HBM3", "total_mib": H100_MIB, "used_mib": used, **gpu}] * n,
    }


# ---- 1. the icon leak -------------------------------------------------------------------------------------


def test_banner_icons_are_made_once_however_often_the_verdict_flips(qtbot) -> None:
    """Reproducer: every fits/misses flip made a new QIcon whose pixmap went into the global QPixmapCache
    under a new key. A probe pixmap in a small cache is evicted as soon as the cache grows past it."""
    from gpumem_gui.ui.results import VerdictBanner

    banner = VerdictBanner()
    qtbot.addWidget(banner)
    limit = QPixmapCache.cacheLimit()
    QPixmapCache.clear()
    QPixmapCache.setCacheLimit(64)  # KiB: the probe (16 KiB) and the 4 icons fit, 30 more icons do not
    try:
        probe = QPixmap(64, 64)
        probe.fill(QColor("red"))
        assert QPixmapCache.insert("gpumem-probe", probe)
        keys = set()
        for i in range(200):
            banner.set_verdict("fits" if i % 2 else "misses", f"flip {i}")
            keys.add(banner.icon.pixmap().cacheKey())
        assert len(keys) == 2  # one pixmap per state, the same object every time
        assert QPixmapCache.find("gpumem-probe") is not None  # nothing new went into the cache
    finally:
        QPixmapCache.setCacheLimit(limit)
        QPixmapCache.clear()


def test_a_flipping_local_target_reuses_its_icons(main_window: MainWindow, fake_snapshots) -> None:
    """The real path: readings whose free memory alternates make the local target fit and miss by turns."""
    w = main_window
    snaps = fake_snapshots(_h100s(1, used=[2048, 75000]), steps=40)
    keys, states = set(), []
    for snap in snaps:
        w.on_snapshot(snap)
        w.recompute_now()  # what the refresh timer does a moment later
        states.append(w.results.banner.state)
        keys.add(w.results.banner.icon.pixmap().cacheKey())
    assert states.count("fits") >= 15 and states.count("misses") >= 15
    assert len(keys) == 2


# ---- 3. one readable error line --------------------------------------------------------------------------


def test_a_validation_error_is_one_line_naming_the_field() -> None:
    with pytest.raises(Exception) as caught:
        InferenceRun(batch=0, seq=-3)
    assert "\n" in str(caught.value)  # pydantic's own text: several lines
    line = error_line(caught.value)
    assert "\n" not in line and "batch" in line and "greater than or equal to 1" in line
    assert line.startswith("InferenceRun: field 'batch'")


def test_error_lines_are_capped_and_flat() -> None:
    assert error_line(GpumemInputError("bad", source="a.json", field="seq")) == "a.json: field 'seq': bad"
    long = error_line(RuntimeError("x" * 10_000 + "\nsecond line"))
    assert len(long) <= MAX_LINE and "\n" not in long and long.startswith("RuntimeError: x")
    assert one_line("a\n  b\tc") == "a b c"


def test_a_change_the_run_cannot_take_is_one_line_in_the_window(main_window: MainWindow) -> None:
    """Reproducer: applying a change that fails validation showed pydantic's multi-line text."""
    w = main_window
    w.apply_change({"batch": -1})
    assert w.last_message.startswith("cannot apply that change: InferenceRun: field 'batch':")
    assert "\n" not in w.last_message and "errors.pydantic.dev" not in w.last_message


def test_a_worker_failing_with_a_validation_error_reports_one_line(qtbot) -> None:
    """Reproducer: "fit report failed: ValidationError: 1 validation error for ..." (several lines)."""
    from gpumem_gui.ui.workers import BackgroundRunner

    runner = BackgroundRunner("test")
    messages: list[str] = []
    runner.failed.connect(lambda _id, m: messages.append(m))
    runner.submit(lambda: InferenceRun(seq=0))
    qtbot.waitUntil(lambda: bool(messages), timeout=5000)
    assert messages[0].startswith("InferenceRun: field 'seq':") and "\n" not in messages[0]
    runner.shutdown()


# ---- 4. the self-test's watchdog ------------------------------------------------------------------------

_BUSY_SLOT = """
import sys, time
from gpumem_gui.ui.watchdog import Watchdog
watchdog = Watchdog(float(sys.argv[1]), backstop_s=float(sys.argv[2])).start()
watchdog.stage = "spinning in a slot"
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication
app = QApplication([])
def busy():  # a slot that never returns to the event loop: no QTimer can fire
    while True:
        sum(range(1000))
QTimer.singleShot(0, busy)
app.exec()
"""


def test_the_watchdog_ends_a_process_whose_gui_thread_never_returns() -> None:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    proc = subprocess.run(
        [sys.executable, "-c", _BUSY_SLOT, "0.3", "30"],
        capture_output=True, text=True, timeout=60, env=env, cwd=REPO, check=False,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert [x for x in proc.stderr.splitlines() if "self-test:" in x] == [
        "gpumem-gui self-test: FAILED: timed out after 0.3 s while spinning in a slot"
    ]


def test_a_disarmed_watchdog_does_nothing() -> None:
    code = textwrap.dedent("""
        import time
        from gpumem_gui.ui.watchdog import Watchdog
        w = Watchdog(0.2).start()
        w.disarm()
        time.sleep(0.6)
        print("alive", w.armed)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0 and proc.stdout.strip() == "alive False", proc.stderr


def test_the_self_test_never_outlives_its_watchdog() -> None:
    proc = run_app("--self-test", "--self-test-timeout", "0.001", "--fake-gpus", "rtx4090_browser")
    assert proc.returncode == 1
    assert "self-test: FAILED: timed out after 0.001 s while" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_self_test_whose_every_gpu_reading_fails_reports_the_gpu_error(tmp_path: Path) -> None:
    """Reproducer: a scenario whose every reading fails reported a timeout after 60 s."""
    scenario = tmp_path / "all_fail.json"
    scenario.write_text(
        json.dumps({**_h100s(1), "at_end": "hold", "faults": {"raise_at_steps": list(range(500))}})
    )
    proc = run_app("--self-test", "--poll-ms", "100", "--fake-gpus", str(scenario))
    assert proc.returncode == 1
    (line,) = [x for x in proc.stderr.splitlines() if "self-test:" in x]
    assert line.startswith("gpumem-gui self-test: FAILED: GPU readings failed 3 times in a row: ")
    assert "injected fault" in line and "timed out" not in proc.stderr


def test_a_self_test_with_4096_fake_gpus_finishes(tmp_path: Path) -> None:
    """Reproducer: 4,097 fake GPUs ran past 400 s (one plot widget per card); the panel now draws at most
    MAX_CARDS cards, each without a plot widget."""
    scenario = tmp_path / "many.json"
    scenario.write_text(json.dumps(_h100s(4096)))
    proc = run_app("--self-test", "--fake-gpus", str(scenario))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "4096 device(s)" in proc.stdout


def test_the_panel_draws_at_most_max_cards(qtbot, fake_snapshots) -> None:
    from gpumem_gui.ui.gpu_panel import MAX_CARDS, GpuPanel

    panel = GpuPanel()
    qtbot.addWidget(panel)
    (snap,) = fake_snapshots(_h100s(MAX_CARDS + 72))
    panel.show_snapshot(snap)
    assert len(panel.cards) == MAX_CARDS
    assert panel.header.text().startswith(f"{MAX_CARDS + 72} devices (cards for the first {MAX_CARDS})")


def test_the_sparkline_breaks_where_a_reading_has_no_value(qtbot) -> None:
    import numpy as np

    from gpumem_gui.ui.gpu_card import Sparkline

    spark = Sparkline()
    qtbot.addWidget(spark)
    spark.resize(200, 30)
    spark.set_data(np.array([-3.0, -2.0, -1.0, 0.0]), np.array([1.0, np.nan, 2.0, 3.0]), 4.0)
    runs = spark.polylines()
    assert [r.size() for r in runs] == [1, 2]
    assert runs[1].at(1).x() == pytest.approx(199.0) and runs[1].at(1).y() < runs[1].at(0).y()
    spark.grab()  # paints


# ---- the core's formats do not import gguf-py to answer an HF-side format ---------------------------------


def test_ggml_kv_block_sizes_match_gguf() -> None:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    from gpumem_gui.core.formats.kv import _GGML_KV_BLOCKS

    assert {n: tuple(GGML_QUANT_SIZES[GGMLQuantizationType[n]]) for n in _GGML_KV_BLOCKS} == _GGML_KV_BLOCKS


def test_an_hf_format_is_found_without_building_the_gguf_formats() -> None:
    code = textwrap.dedent("""
        from gpumem_gui.core.formats import registry
        assert registry.get_weight_format("bf16").id == "bf16"
        assert registry.get_weight_format("nf4").id == "nf4"
        print(registry._build_registry.cache_info().currsize)
        print(registry.get_weight_format("GGUF-q4_k_m").id, registry._build_registry.cache_info().currsize)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.stdout.split() == ["0", "gguf-Q4_K_M", "1"], proc.stderr
