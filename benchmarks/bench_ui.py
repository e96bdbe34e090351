"""UI latency benchmarks for ``gpumem-gui``.

1. Cold start to the first painted window: ``gpumem-gui --quit-after-paint`` in a fresh subprocess (Python
   start, imports, window, first estimate, first paint), median of 5 after one warm-up run, with byte-code
   caches as an installed app has them.
2. Form change to redrawn chart: in one process, change the batch spin box and time (QElapsedTimer) until the
   breakdown chart has been repainted with the new estimate, pumping events with ``processEvents``; median of
   50. Measured with the window's real debounce (20 ms for a step such as this one, 120 ms while typing:
   what a user sees) and with the debounce set to 0 (the cost of estimate + redraw alone). Also: time until
   the worker's fit report and sweep are on screen.

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
        line = next((x for x in proc.stdout.splitlines() if x.startswith("first-paint ")), None)
        if proc.returncode != 0 or line is None:
            raise SystemExit(f"cold start run failed (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        if i == 0:
            continue
        to_paint.append(float(line.split()[1]) - t0)
        to_exit.append(t_exit - t0)
    return {
        "runs": runs,
        "first_paint_s_median": round(statistics.median(to_paint), 3),
        "first_paint_s_all": [round(x, 3) for x in to_paint],
        "process_exit_s_median": round(statistics.median(to_exit), 3),
        "platform": env["QT_QPA_PLATFORM"],
    }


def _time_changes(
    app: Any, window: Any, spin: Any, counter: Any, state: dict[str, int], n: int
) -> tuple[list[float], list[float]]:
    """``n`` changes of the batch spin box: ms until the chart is repainted, and until the worker's fit
    report and sweep are on screen."""
    from PySide6.QtCore import QElapsedTimer

    redraw_ms: list[float] = []
    background_ms: list[float] = []
    timer = QElapsedTimer()
    for i in range(n):
        window.flush_background()
        app.processEvents()
        updated, bg = state["updated"], state["background"]
        spin_value = 2 + (i % 2)  # alternate 2 and 3: every change is a real change
        if spin.value() == spin_value:
            spin_value = 4
        timer.start()
        spin.setValue(spin_value)
        paints_at_update = None
        while True:
            app.processEvents()
            if paints_at_update is None and state["updated"] > updated:
                paints_at_update = counter.count
            if paints_at_update is not None and counter.count > paints_at_update:
                redraw_ms.append(timer.nsecsElapsed() / 1e6)
                break
            if timer.elapsed() > 10_000:
                raise SystemExit("the chart was not redrawn within 10 s")
        while state["background"] == bg:
            app.processEvents()
            if timer.elapsed() > 20_000:
                raise SystemExit("the fit report did not arrive within 20 s")
        background_ms.append(timer.nsecsElapsed() / 1e6)
    return redraw_ms, background_ms


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

    counter = PaintCounter()
    viewport = window.results.breakdown.view.viewport()
    viewport.installEventFilter(counter)
    state = {"updated": 0, "background": 0}
    window.estimate_updated.connect(lambda: state.__setitem__("updated", state["updated"] + 1))
    window.background_done.connect(lambda: state.__setitem__("background", state["background"] + 1))
    spin = window.run_form.widget("batch")

    with_debounce, _ = _time_changes(app, window, spin, counter, state, changes)
    window._debounce.setInterval(0)
    without_debounce, bg_without = _time_changes(app, window, spin, counter, state, changes)
    est = window.estimate
    window.close()
    tmp.cleanup()
    return {
        "changes": changes,
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
        f"{cs['runs']} {cs['first_paint_s_all']}; process exit {cs['process_exit_s_median']} s"
    )
    print(
        f"form change to redrawn chart (median of {fc['changes']}): "
        f"{fc['redraw_ms_median_with_debounce']} ms with the window's debounce (20 ms for a step), "
        f"{fc['redraw_ms_median_no_debounce']} ms without (p90 {fc['redraw_ms_p90_no_debounce']} ms)"
    )
    print(
        f"fit report + sweep on screen: median {fc['fit_and_sweep_on_screen_ms_median_no_debounce']} ms "
        "after the change (worker thread)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
