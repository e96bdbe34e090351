"""Resident memory of the real ``gpumem-gui`` after start and after a long time of GPU polling.

Spawns the app (``gpumem_gui.app.main``, the same code the ``gpumem-gui`` command runs) offscreen with a
fake 8-GPU machine polled every ``--poll-ms`` (default 50 ms, 20 Hz: 20x the app's default rate, so a leak
per poll shows 20x sooner), in a throwaway ``HOME`` so no user settings are read or written. A small wrapper
creates the ``QApplication`` first (``main`` reuses it) and samples RSS from ``/proc/self/statm``: at the
first paint, then every ``--every`` seconds; it quits the app ``--seconds`` after the first paint (the app
shuts its poller thread down as on a normal quit).

    .venv/bin/python benchmarks/app_memory.py --seconds 600 [--json]

Never run by the test suite (``benchmarks/report.py`` runs it for ``docs/performance.md``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MiB = 1 << 20

# Runs inside the spawned interpreter. argv: seconds, every, then the app's own flags. Prints an 'rss' line
# per sample (label, seconds since the first paint, RSS bytes, banner flips so far) and the banner states.
_WRAPPER = r"""
import os, sys, time
import gpumem_gui.ui  # PySide6 (and QtOpenGL) before pyqtgraph, as the app does
from PySide6.QtCore import QEvent, QObject, QTimer
from PySide6.QtWidgets import QApplication

seconds, every = float(sys.argv[1]), float(sys.argv[2])
app = QApplication([sys.argv[0]])
page = os.sysconf("SC_PAGE_SIZE")
t0 = None
flips = {"n": 0, "last": None, "states": set()}

def sample(label):
    with open("/proc/self/statm") as f:
        rss = int(f.read().split()[1]) * page
    print(f"rss {label} {time.monotonic() - t0:.1f} {rss} {flips['n']}", flush=True)

def on_update(window):
    state = window.results.banner.state
    flips["states"].add(state)
    if flips["last"] is not None and state != flips["last"]:
        flips["n"] += 1
    flips["last"] = state

class FirstPaint(QObject):
    done = False
    def eventFilter(self, obj, event):
        global t0
        if event.type() == QEvent.Type.Paint and not self.done:
            self.done = True
            t0 = time.monotonic()
            for w in app.topLevelWidgets():
                if hasattr(w, "results") and hasattr(w, "estimate_updated"):
                    w.estimate_updated.connect(lambda w=w: on_update(w))
            sample("first-paint")
            ticker.start()
            QTimer.singleShot(int(seconds * 1000), finish)
        return False

def finish():
    sample("end")
    print("states " + ",".join(sorted(flips["states"])), flush=True)
    app.quit()

ticker = QTimer()
ticker.setInterval(int(every * 1000))
ticker.timeout.connect(lambda: sample("tick"))
fp = FirstPaint()
app.installEventFilter(fp)
from gpumem_gui.app import main
sys.exit(main(sys.argv[3:]))
"""


def app_samples(
    seconds: float, every: float, app_args: list[str], repo: Path = REPO
) -> tuple[list[dict], list[str]]:
    """Run the app from ``repo`` offscreen in a throwaway HOME with ``app_args``; its RSS samples from the
    first paint on (``label``, ``t_s``, ``rss_bytes``, ``flips``) and the banner states it showed."""
    with tempfile.TemporaryDirectory(prefix="gpumem-appmem-") as home:
        env = {
            **os.environ,
            "QT_QPA_PLATFORM": "offscreen",
            "HOME": home,
            "XDG_CONFIG_HOME": str(Path(home) / ".config"),
        }
        cmd = [sys.executable, "-c", _WRAPPER, str(seconds), str(every), *app_args]
        proc = subprocess.run(
            cmd, capture_output=True, text=True, env=env, cwd=repo, timeout=seconds + 300, check=False
        )
    samples: list[dict] = []
    states: list[str] = []
    for line in proc.stdout.splitlines():
        if line.startswith("states "):
            states = line.split()[1].split(",") if len(line.split()) > 1 else []
        elif line.startswith("rss ") and not (samples and samples[-1]["label"] == "end"):
            _, label, t, rss, flips = line.split()
            samples.append({"label": label, "t_s": float(t), "rss_bytes": int(rss), "flips": int(flips)})
    if proc.returncode != 0 or len(samples) < 2:
        raise SystemExit(f"app run failed (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr[-3000:]}")
    return samples, states


def run(seconds: float, every: float, poll_ms: int, scenario: str) -> dict[str, object]:
    samples, _states = app_samples(seconds, every, ["--fake-gpus", scenario, "--poll-ms", str(poll_ms)])
    start = samples[0]["rss_bytes"]
    settled = next(
        (s["rss_bytes"] for s in samples if s["t_s"] >= min(10.0, seconds)), samples[-1]["rss_bytes"]
    )
    half = [s for s in samples if s["t_s"] >= seconds / 2]
    return {
        "seconds": seconds,
        "poll_ms": poll_ms,
        "scenario": scenario,
        "polls_expected": round(seconds * 1000 / poll_ms),
        "rss_first_paint_bytes": start,
        "rss_after_10s_bytes": settled,
        "rss_end_bytes": samples[-1]["rss_bytes"],
        "rss_max_bytes": max(s["rss_bytes"] for s in samples),
        "rss_second_half_growth_bytes": half[-1]["rss_bytes"] - half[0]["rss_bytes"] if half else 0,
        "samples": samples,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=600.0, help="seconds of polling after first paint")
    ap.add_argument("--every", type=float, default=30.0, help="seconds between RSS samples (default 30)")
    ap.add_argument("--poll-ms", type=int, default=50, help="GPU poll interval (default 50 ms)")
    ap.add_argument("--fake-gpus", default="8xh100_busy")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    r = run(args.seconds, min(args.every, args.seconds), args.poll_ms, args.fake_gpus)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    for s in r["samples"]:  # type: ignore[union-attr]
        print(f"{s['t_s']:7.1f} s  {s['rss_bytes'] / MiB:8.1f} MiB  {s['label']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
