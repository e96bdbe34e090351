"""A watchdog that a busy GUI thread cannot starve: ``gpumem-gui --self-test`` never runs past its limit.

A ``QTimer`` fires only when the GUI thread returns to its event loop; one slot that works for minutes (the
GPU panel building 4,097 cards from one reading) kept the self-test's old 60 s timer from ever firing (issue
18: past 400 s). This one waits in its own Python thread, which gets the interpreter at least every
``sys.getswitchinterval()`` (5 ms) while the GUI thread runs Python code: at the limit it prints one line
(what the test was doing) and ends the process at once with ``os._exit``. Should the GUI thread sit in one
C++ call that never lets go of the interpreter, :mod:`faulthandler`'s own C thread ends the process
``backstop_s`` later, printing where each thread was.

No Qt here, so it can start before Qt and the window are imported.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import sys
import threading
from typing import TextIO

BACKSTOP_S = 30.0  # after the limit: faulthandler ends a process whose GUI thread never lets go of the GIL


class Watchdog:
    """Ends the process with ``exit_code`` and ``prefix: timed out after N s while <stage>`` unless
    :meth:`disarm` is called within ``timeout_s`` of :meth:`start`. ``stage`` says what is being waited for
    (set it as the work goes on; a plain attribute, read by the watchdog's thread)."""

    def __init__(
        self,
        timeout_s: float,
        *,
        prefix: str = "gpumem-gui self-test: FAILED",
        exit_code: int = 1,
        backstop_s: float = BACKSTOP_S,
        stream: TextIO | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self.prefix = prefix
        self.exit_code = exit_code
        self.backstop_s = backstop_s
        self.stage = "starting"
        self._stream = stream
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._wait, name="gpumem-watchdog", daemon=True)
        self._backstop = False

    def start(self) -> Watchdog:
        self._thread.start()
        stderr = sys.__stderr__
        if self.backstop_s > 0 and stderr is not None:
            with contextlib.suppress(ValueError, OSError, AttributeError):  # no usable stderr: no backstop
                faulthandler.dump_traceback_later(self.timeout_s + self.backstop_s, exit=True, file=stderr)
                self._backstop = True
        return self

    def disarm(self) -> None:
        """The work finished in time: the watchdog does nothing."""
        self._done.set()
        if self._backstop:
            faulthandler.cancel_dump_traceback_later()
            self._backstop = False

    @property
    def armed(self) -> bool:
        return self._thread.is_alive() and not self._done.is_set()

    def message(self) -> str:
        return f"{self.prefix}: timed out after {self.timeout_s:g} s while {self.stage}"

    def _wait(self) -> None:
        if self._done.wait(self.timeout_s):
            return
        line = self.message() + "\n"
        stream = self._stream or sys.__stderr__
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        with contextlib.suppress(Exception):
            if stream is not None:
                stream.write(line)
                stream.flush()
        os._exit(self.exit_code)
