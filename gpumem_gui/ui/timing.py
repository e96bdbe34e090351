"""The session's two timers: the debounce behind every recompute, and the start of the background work a
moment after the window has painted the new plan. Timers only, no widgets."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QObject, QTimer

DEBOUNCE_MS = 120  # while typing into a field: one estimate when the keys stop
# a spin-box step, a pick from a list, a click: on the next pass of the event loop (changes made in one pass,
# a wheel burst delivered at once, still merge); a fixed wait here put the redraw a frame late (issue 18)
STEP_DEBOUNCE_MS = 0
BACKGROUND_DELAY_MS = 10  # after the paint that shows the estimate
BACKGROUND_FALLBACK_MS = 250  # when no paint comes (a hidden window, nothing on screen changed)


class Debounce(QTimer):
    """The single-shot timer behind every recompute. :meth:`restart` waits ``typing_ms`` after a key typed
    into a field and ``step_ms`` after any other change. :meth:`setInterval` sets the typing wait, and the
    step wait never exceeds it: ``setInterval(0)`` turns both off (benchmarks/bench_ui.py does that)."""

    def __init__(self, typing_ms: int, step_ms: int, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.setSingleShot(True)
        self.typing_ms = typing_ms
        self.step_ms = min(step_ms, typing_ms)
        super().setInterval(typing_ms)

    def setInterval(self, msec: int) -> None:
        self.typing_ms = msec
        self.step_ms = min(self.step_ms, msec)
        super().setInterval(msec)

    def restart(self, typing: bool = True) -> None:
        self.start(self.typing_ms if typing else self.step_ms)


class AfterPaint(QObject):
    """Runs ``action`` once the window's next paint pass is over (``delay_ms`` after it), or after
    ``fallback_ms`` when no paint comes (a hidden window, nothing on screen changed).

    The background worker holds the GIL while it runs: started before the paint, it would slow the paint
    down. The window reports each paint pass with :meth:`paint_pass` (its ``UpdateRequest`` event); an armed
    gate then starts a zero-interval timer, which fires when that pass is over and shortens the wait.
    """

    def __init__(
        self,
        action: Callable[[], object],
        *,
        delay_ms: int = BACKGROUND_DELAY_MS,
        fallback_ms: int = BACKGROUND_FALLBACK_MS,
        parent: QObject | None = None,
    ) -> None:
        super().__init__(parent)
        self._delay_ms = delay_ms
        self._fallback_ms = fallback_ms
        self._waiting_paint = False
        self._delay = QTimer(self)
        self._delay.setSingleShot(True)
        self._delay.setInterval(fallback_ms)
        self._delay.timeout.connect(action)
        self._painted = QTimer(self)
        self._painted.setSingleShot(True)
        self._painted.setInterval(0)
        self._painted.timeout.connect(self._on_painted)

    @property
    def pending(self) -> bool:
        return self._delay.isActive()

    def arm(self) -> None:
        """Run the action after the next paint (or the fallback interval)."""
        self._waiting_paint = True
        self._delay.start(self._fallback_ms)

    def cancel(self) -> None:
        self._delay.stop()
        self._waiting_paint = False

    def paint_pass(self) -> None:
        """A paint pass is about to run."""
        if self._waiting_paint:
            self._waiting_paint = False
            self._painted.start()

    def _on_painted(self) -> None:
        if self._delay.isActive():
            self._delay.start(self._delay_ms)

    def stop(self) -> None:
        self.cancel()
        self._painted.stop()
