"""UI latency benchmarks for ``gpumem-gui``.

1. Cold start to the first painted window: ``gpumem-gui --quit-after-paint`` in a fresh subprocess (Python
   start, imports, window, first estimate, first paint), median of 5 after one warm-up run, with byte-code
   caches as an installed app has them; and to the first paint of the charts with the estimate in them (the
   charts are built right after the first paint: pyqtgraph is slow to import).
2. Form change to redrawn charts: in one process, with the window at 1600 x 1000 (what a 1920 x 1200 screen
   gives it) and idle (no paint pending), change the batch spin box and time (QElapsedTimer) until both charts
   a form change redraws (the breakdown and the phases) have been repainted with the new estimate, pumping
   events with ``processEvents``; median of 50. Measured with the window's real debounce (none for a step
   such as this one: the next pass of the event loop; 120 ms while typing) and with the debounce set to 0
   (the cost of estimate + redraw alone). Also: time until the worker's fit report and sweep are on screen.

Run: ``QT_QPA_PLATFORM=offscreen .venv/bin/python benchmarks/bench_ui.py [--runs 5] [--changes 50] [--json]``
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def cold_start(runs: int, fake: str) -> dict[str, object]:
    code = "import sys; from gpumem_gui.app import main; sys.exit(main(sys.argv[1:]))"
    env = {**os.environ, "QT_QPA_PLATFORM": os.environ.get("QT_QPA_PLATFORM", "offscreen")}
    # as an installed app starts, with byte-code caches (the warm-up run writes them); where the environment
    # forbids them (PYTHONDONTWRITEBYTECODE, as on this machine) every start would recompile our sources
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    to_paint: list[float] = []
    to_charts: list[float] = []
    to_exit: list[float] = []
    for i in range(runs + 1):  # the first run warms the disk cache and is not counted
        t0 = time.time()
        proc = subprocess.run(
            [sys.executable, "-c", code, "--quit-after-paint", "--fake-gpus", fake],
            capture_output=True,
            text=True,
            env=env,
            cwd=REPO,
            timeout=120,
            check=False,
        )
        t_exit = time.time()
        pairs = (x.partition(" ") for x in proc.stdout.splitlines())
        marks = {k: v for k, _, v in pairs if k in ("first-paint", "charts-painted")}
        marks.setdefault("first-paint", "")
        # before issue 18 the charts were drawn in the first paint (no "charts-painted" line)
        marks.setdefault("charts-painted", marks["first-paint"])
        if proc.returncode != 0 or not marks["first-paint"]:
            raise SystemExit(f"cold start run failed (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        if i == 0:
            continue
        to_paint.append(float(marks["first-paint"]) - t0)
        to_charts.append(float(marks["charts-painted"]) - t0)
        to_exit.append(t_exit - t0)
    return {
        "runs": runs,
        "first_paint_s_median": round(statistics.median(to_paint), 3),
        "first_paint_s_all": [round(x, 3) for x in to_paint],
        "charts_painted_s_median": round(statistics.median(to_charts), 3),
        "process_exit_s_median": round(statistics.median(to_exit), 3),
        "platform": env["QT_QPA_PLATFORM"],
    }


def _settle(app: Any, counters: list[Any], quiet_ms: int = 30) -> None:
    """Pump events until no chart has painted for ``quiet_ms`` (a paint still pending from the last change
    would otherwise be timed as part of the next one)."""
    from PySide6.QtCore import QElapsedTimer

    quiet = QElapsedTimer()
    quiet.start()
    seen = [c.count for c in counters]
    while quiet.elapsed() < quiet_ms:
        app.processEvents()
        now = [c.count for c in counters]
        if now != seen:
            seen = now
            quiet.restart()


def _time_changes(
    app: Any, window: Any, spin: Any, counters: list[Any], state: dict[str, int], n: int
) -> tuple[list[float], list[float]]:
    """``n`` changes of the batch spin box: ms until every chart in ``counters`` is repainted with the new
    estimate, and until the worker's fit report and sweep are on screen."""
    from PySide6.QtCore import QElapsedTimer

    redraw_ms: list[float] = []
    background_ms: list[float] = []
    timer = QElapsedTimer()
    for i in range(n):
        window.flush_background()
        _settle(app, counters)
        updated, bg = state["updated"], state["background"]
        spin_value = 2 + (i % 2)  # alternate 2 and 3: every change is a real change
        if spin.value() == spin_value:
            spin_value = 4
        timer.start()
        spin.setValue(spin_value)
        at_update: list[int] | None = None
        while True:
            app.processEvents()
            if at_update is None and state["updated"] > updated:
                at_update = [c.count for c in counters]
            if at_update is not None and all(c.count > a for c, a in zip(counters, at_update, strict=True)):
                redraw_ms.append(timer.nsecsElapsed() / 1e6)
                break
            if timer.elapsed() > 10_000:
                raise SystemExit("the charts were not redrawn within 10 s")
        while state["background"] == bg:
            app.processEvents()
            if timer.elapsed() > 20_000:
                raise SystemExit("the fit report did not arrive within 20 s")
        background_ms.append(timer.nsecsElapsed() / 1e6)
    return redraw_ms, background_ms


WINDOW_SIZE = (1600, 1000)  # what MainWindow takes on a 1920 x 1200 screen (the offscreen screen is smaller)


def form_to_chart(changes: int) -> dict[str, object]:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QEvent, QObject, QSettings
    from PySide6.QtWidgets import QApplication

    import gpumem_gui.ui  # noqa: F401  (PySide6 before pyqtgraph)
    from gpumem_gui.ui.main_window import MainWindow

    app = QApplication.instance() or QApplication([sys.argv[0]])
    tmp = tempfile.TemporaryDirectory(prefix="gpumem-bench-")
    settings = QSettings(str(Path(tmp.name) / "s.ini"), QSettings.Format.IniFormat)
    window = MainWindow(settings=settings, restore=False, dialogs=False)
    window.resize(*WINDOW_SIZE)
    window.show()
    deadline = time.monotonic() + 20
    while window.estimate is None and time.monotonic() < deadline:
        app.processEvents()
    window.flush_background()

    class PaintCounter(QObject):
        count = 0

        def eventFilter(self, obj: QObject, event: QEvent) -> bool:
            if event.type() == QEvent.Type.Paint:
                self.count += 1
            return False

    counters = [PaintCounter(), PaintCounter()]
    for counter, chart in zip(counters, (window.results.breakdown.view, window.results.phases), strict=True):
        chart.viewport().installEventFilter(counter)
    state = {"updated": 0, "background": 0}
    window.estimate_updated.connect(lambda: state.__setitem__("updated", state["updated"] + 1))
    window.background_done.connect(lambda: state.__setitem__("background", state["background"] + 1))
    spin = window.run_form.widget("batch")

    with_debounce, _ = _time_changes(app, window, spin, counters, state, changes)
    window._debounce.setInterval(0)
    without_debounce, bg_without = _time_changes(app, window, spin, counters, state, changes)
    est = window.estimate
    size = window.size()
    window.close()
    tmp.cleanup()
    return {
        "changes": changes,
        "window": f"{size.width()}x{size.height()}",
        "model": window.model.source if window.model else None,
        "plan_total_bytes": est.total_bytes if est else None,
        "redraw_ms_median_with_debounce": round(statistics.median(with_debounce), 1),
        "redraw_ms_median_no_debounce": round(statistics.median(without_debounce), 1),
        "redraw_ms_p90_no_debounce": round(sorted(without_debounce)[int(0.9 * len(without_debounce))], 1),
        "fit_and_sweep_on_screen_ms_median_no_debounce": round(statistics.median(bg_without), 1),
        "estimate_ms_last": round(window.last_estimate_ms, 2),
        "background_ms_last": round(window.last_background_ms, 1),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="cold starts to time (median)")
    ap.add_argument("--changes", type=int, default=50, help="form changes to time (median)")
    ap.add_argument("--fake-gpus", default="rtx4090_browser")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    machine = f"{platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}, Python "
    result = {
        "machine": machine + platform.python_version(),
        "cold_start": cold_start(args.runs, args.fake_gpus),
        "form_change_to_chart": form_to_chart(args.changes),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    cs, fc = result["cold_start"], result["form_change_to_chart"]
    print(f"machine: {result['machine']}")
    print(
        f"cold start to first paint ({cs['platform']}): median {cs['first_paint_s_median']} s of "
        f"{cs['runs']} {cs['first_paint_s_all']}; charts painted {cs['charts_painted_s_median']} s; "
        f"process exit {cs['process_exit_s_median']} s"
    )
    print(
        f"form change to redrawn charts (median of {fc['changes']}, window {fc['window']}): "
        f"{fc['redraw_ms_median_with_debounce']} ms with the window's debounce (none for a step), "
        f"{fc['redraw_ms_median_no_debounce']} ms without (p90 {fc['redraw_ms_p90_no_debounce']} ms)"
    )
    print(
        f"fit report + sweep on screen: median {fc['fit_and_sweep_on_screen_ms_median_no_debounce']} ms "
        "after the change (worker thread)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
