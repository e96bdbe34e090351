"""Soak test of the GPU poller: does polling for a long time leak memory?

Runs the real threaded poller (:class:`~gpumem_gui.ui.gpu_poller.PollerController`) against a
:class:`~gpumem_gui.hardware.fake.FakeBackend` at 20 Hz, feeds every snapshot to a
:class:`~gpumem_gui.hardware.history.MemoryHistory` in the GUI thread (as the window will), and prints RSS
(from ``/proc/self/statm``), tracemalloc's traced memory and the reference count of ``True`` over time, then
the allocation sites that grew most. (``refs(True)`` must stay flat: PySide6 6.12.0's ``Signal.emit`` loses
one per call, which aborts Python 3.11 after a few thousand emits; see ``gpumem_gui.ui.gpu_poller``.)
The history's window (``--history-seconds``, default 5 minutes) fills first, so growth until then is
expected; after that memory should be flat. ``--history-seconds 10`` reaches that steady state quickly.

    .venv/bin/python benchmarks/soak_poller.py                 # 600 s
    .venv/bin/python benchmarks/soak_poller.py --seconds 60 --scenario a100_mig

Never run by the test suite.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
import tracemalloc

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from PySide6.QtCore import QCoreApplication, QObject, QTimer, Slot

from gpumem_gui.hardware import FakeBackend, GpuSnapshot, MemoryHistory
from gpumem_gui.ui.gpu_poller import PollerController

MiB = 1 << 20


def rss_bytes() -> int:
    """Resident set size of this process, from /proc/self/statm (pages)."""
    with open("/proc/self/statm") as f:
        resident_pages = int(f.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


class Sink(QObject):
    """Receives snapshots in the GUI thread and keeps a history, as the window will."""

    def __init__(self, history_s: float) -> None:
        super().__init__()
        self.history = MemoryHistory(max_age_s=history_s)
        self.snapshots = 0
        self.errors = 0

    @Slot(object)
    def on_snapshot(self, snapshot: GpuSnapshot) -> None:
        self.snapshots += 1
        self.history.add(snapshot)

    @Slot(str)
    def on_error(self, _reason: str) -> None:
        self.errors += 1


def print_summary(
    rows: list[tuple[float, int, int, int, int, int]],
    sink: Sink,
    ok: bool,
    snap0: tracemalloc.Snapshot | None,
) -> None:
    """The totals, the growth over the second half, and the allocation sites that grew most."""
    elapsed = rows[-1][0]
    print(
        f"\n{sink.snapshots} snapshots in {elapsed:.1f} s ({sink.snapshots / elapsed:.1f} Hz), "
        f"{sink.errors} errors, "
        f"shutdown {'clean' if ok else 'TIMED OUT'}"
    )
    if len(rows) >= 3:
        # growth over the second half, when the history window (if shorter than the run) is full
        mid = rows[len(rows) // 2]
        last = rows[-1]
        span = max(1e-9, last[0] - mid[0])
        d_rss, d_traced = last[3] - mid[3], last[4] - mid[4]
        print(
            f"second half: RSS {d_rss / MiB:+.2f} MiB ({d_rss / 1024 / span * 60:+.1f} KiB/min), "
            f"traced {d_traced / 1024:+.1f} KiB ({d_traced / 1024 / span * 60:+.1f} KiB/min)"
        )
    if snap0 is not None:
        top = tracemalloc.take_snapshot().compare_to(snap0, "lineno")[:8]
        print("\nlargest allocation growth since start (tracemalloc):")
        for stat in top:
            frame = stat.traceback[0]
            print(
                f"  {stat.size_diff / 1024:+9.1f} KiB {stat.count_diff:+7d} blocks"
                f"  {frame.filename}:{frame.lineno}"
            )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=600.0, help="how long to poll (default 600)")
    ap.add_argument("--hz", type=float, default=20.0, help="polls per second (default 20)")
    ap.add_argument("--scenario", default="8xh100_busy", help="shipped scenario name or JSON file")
    ap.add_argument(
        "--report-every", type=float, default=None, help="seconds between rows (default: 10 rows)"
    )
    ap.add_argument("--history-seconds", type=float, default=300.0, help="history window (default 300)")
    ap.add_argument("--no-tracemalloc", action="store_true", help="RSS only (tracemalloc slows Python down)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    every = args.report_every or max(1.0, args.seconds / 10)
    app = QCoreApplication(sys.argv[:1])
    if not args.no_tracemalloc:
        tracemalloc.start(10)
    backend = FakeBackend(args.scenario, cuda_visible_devices=None)
    controller = PollerController(backend, interval_ms=max(1, round(1000 / args.hz)))
    sink = Sink(args.history_seconds)
    controller.poller.snapshot_ready.connect(sink.on_snapshot)
    controller.poller.error.connect(sink.on_error)

    gc.collect()
    t0 = time.monotonic()
    rss0 = rss_bytes()
    traced0 = tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else 0
    snap0 = tracemalloc.take_snapshot() if tracemalloc.is_tracing() else None
    rows: list[tuple[float, int, int, int, int, int]] = []

    print(
        f"soak: {args.scenario} at {args.hz:g} Hz for {args.seconds:g} s, "
        f"history window {args.history_seconds:g} s"
        f" (pid {os.getpid()})",
        flush=True,
    )
    header = (
        f"{'t (s)':>7} {'polls':>7} {'hist pts':>8} {'RSS MiB':>8} {'dRSS MiB':>9}"
        f" {'traced MiB':>10} {'dTraced KiB':>11} {'refs(True)':>10}"
    )
    print(header)

    def report() -> None:
        gc.collect()
        t = time.monotonic() - t0
        rss = rss_bytes()
        traced = tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else 0
        rows.append((t, sink.snapshots, len(sink.history), rss, traced, sink.errors))
        print(
            f"{t:7.1f} {sink.snapshots:7d} {len(sink.history):8d} {rss / MiB:8.1f} {(rss - rss0) / MiB:+9.2f}"
            f" {traced / MiB:10.2f} {(traced - traced0) / 1024:+11.1f} {sys.getrefcount(True):10d}",
            flush=True,
        )

    ticker = QTimer()
    ticker.setInterval(int(every * 1000))
    ticker.timeout.connect(report)
    QTimer.singleShot(int(args.seconds * 1000), app.quit)
    controller.start()
    ticker.start()
    app.exec()
    ticker.stop()
    ok = controller.shutdown()
    report()

    print_summary(rows, sink, ok, snap0)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
