"""A progress bar on stderr for long sweeps: only where a person watches (stderr is a terminal) and the
output is a table (not ``--json`` or ``--csv``, which scripts read)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from gpumem_gui.core import POINT_COST_S, InferenceRun

# A sweep whose points may take this long at the slowest measured cost per point (core.POINT_COST_S) gets a
# bar: 20 training points or 800 inference points (a definition: a shorter wait needs no bar).
LONG_SWEEP_S = 2.0
BAR_WIDTH = 30  # characters of the bar itself; the whole line stays under 80


class ProgressBar:
    """``progress(done, total)`` for :func:`gpumem_gui.core.sweep`: redraws one line when the whole percent
    changes (at most 101 times a sweep, whatever its length) and clears it at the end."""

    def __init__(self, stream: TextIO, label: str) -> None:
        self.stream = stream
        self.label = label
        self.shown = -1

    def __call__(self, done: int, total: int) -> None:
        percent = 100 * done // max(1, total)
        if percent == self.shown:
            return
        self.shown = percent
        filled = BAR_WIDTH * done // max(1, total)
        bar = "#" * filled + "." * (BAR_WIDTH - filled)
        self.stream.write(f"\r{self.label} [{bar}] {percent:3d}% {done:,}/{total:,}")
        self.stream.flush()

    def clear(self) -> None:
        if self.shown >= 0:
            self.stream.write("\r\x1b[K")  # carriage return, erase to the end of the line
            self.stream.flush()


def wants_bar(run: Any, points: int, quiet: bool, stream: TextIO) -> bool:
    """Whether a sweep of ``points`` points of ``run`` shows a bar on ``stream``."""
    mode = "inference" if isinstance(run, InferenceRun) else "train"
    return not quiet and points * POINT_COST_S[mode] >= LONG_SWEEP_S and stream.isatty()


@contextmanager
def sweep_progress(run: Any, points: int, quiet: bool) -> Iterator[Callable[[int, int], None] | None]:
    """The progress callback for a sweep (None where no bar is wanted); the bar is cleared on the way out,
    also when the sweep fails or is interrupted."""
    stream = sys.stderr
    if not wants_bar(run, points, quiet, stream):
        yield None
        return
    bar = ProgressBar(stream, "sweep")
    try:
        yield bar
    finally:
        bar.clear()
