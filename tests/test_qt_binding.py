"""The Qt binding gpumem installs must survive many signal emits.

PySide6-Essentials 6.12.0 on Python 3.11 drops a reference to ``True`` on every ``signal.emit`` from Python;
after a few thousand emits the interpreter aborts ("Fatal Python error: bool_dealloc"). pyproject pins
``PySide6-Essentials<6.12``; this test runs the emits in a child process so that a bad binding fails the test
instead of killing the test run.
"""

from __future__ import annotations

import os
import subprocess
import sys

SNIPPET = """
import sys
from PySide6.QtCore import QObject, Signal
class A(QObject):
    s = Signal(object)
a = A()
before = sys.getrefcount(True)
for i in range(20000):
    a.s.emit(i)
sys.exit(0 if abs(sys.getrefcount(True) - before) < 10 else 3)
"""


def test_signal_emits_do_not_corrupt_refcounts() -> None:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    r = subprocess.run([sys.executable, "-c", SNIPPET], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (
        f"the installed PySide6 corrupts refcounts on emit: {r.returncode} {r.stderr[-500:]}"
    )
