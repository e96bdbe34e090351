"""Running the trace worker: in this process when torch and transformers import here, otherwise in a
subprocess of the Python the user names (their own ML environment), speaking JSON over stdin/stdout.

A subprocess can be stopped (``timeout``, or :meth:`TraceJob.cancel` from the window); an in-process trace
is bounded by ``SIGALRM`` when it runs on the main thread (the CLI). Every failure is a :class:`TraceFailure`:
one line naming the cause, with the worker's log kept for whoever wants to see it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpumem_gui.core import GpumemInputError
from gpumem_gui.trace.request import TraceRequest

# the folder holding the gpumem_trace_worker package (shipped as plain files in the binary too)
WORKER_DIR = Path(__file__).resolve().parent
DEFAULT_TIMEOUT_S = 300
# the worker's package_versions() in another Python (metadata only: answers in well under a second)
_VERSIONS_SCRIPT = "\n".join(
    (
        "import json",
        "from gpumem_trace_worker.building import package_versions",
        "print(json.dumps(package_versions()))",
    )
)


class TraceFailure(GpumemInputError):
    """A trace that did not run: ``message`` is one line; ``log`` is the worker's stderr (may be empty)."""

    def __init__(self, message: str, log: str = "", field: str | None = None) -> None:
        super().__init__(message, field=field)
        self.log = log


def in_process_available() -> bool:
    """Whether torch and transformers can be imported by this Python (without importing them)."""
    return all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))


def _worker() -> Any:
    """The worker package, imported from :data:`WORKER_DIR` (as the subprocess does, never statically: the
    product side imports no torch, and the worker imports it only inside its functions)."""
    if str(WORKER_DIR) not in sys.path:
        sys.path.insert(0, str(WORKER_DIR))
    import gpumem_trace_worker

    return gpumem_trace_worker


def _worker_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(WORKER_DIR), env.get("PYTHONPATH", "")) if p)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


_known_versions: dict[
    str, dict[str, str]
] = {}  # per Python path, once it answered with torch and transformers


def environment_versions(python: str | None) -> dict[str, str]:
    """torch / transformers / peft versions of ``python`` (None or this interpreter: this process), read
    from package metadata without importing them. A Python that cannot run, or lacks torch or
    transformers, is a TraceFailure."""
    if python is None or python == sys.executable:
        found, where = _worker().building.package_versions(), "this Python"
    else:
        try:
            p = subprocess.run(
                [python, "-c", _VERSIONS_SCRIPT],
                capture_output=True,
                text=True,
                timeout=60,
                env=_worker_env(),
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise TraceFailure(f"cannot run the Python {python!r}: {e}", field="python") from None
        if p.returncode != 0:
            raise TraceFailure(f"the Python {python!r} failed: {_last_line(p.stderr)}", p.stderr, "python")
        found, where = json.loads(p.stdout), f"the Python at {python}"
    missing = [m for m in ("torch", "transformers") if m not in found]
    if missing:
        raise TraceFailure(
            f"{where} has no {' or '.join(missing)}: trace mode needs torch and transformers "
            "(pip install torch==2.13.0 transformers; peft for LoRA), or name the Python of an environment "
            "that has them (--python PATH, or the window's trace setting)",
            field="python",
        )
    return found


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "no output"


class TraceJob:
    """One trace in a subprocess; :meth:`result` waits for it, :meth:`cancel` stops it (another thread)."""

    def __init__(self, request: TraceRequest, python: str, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.python, self.timeout = python, timeout
        self.cancelled = threading.Event()
        try:
            self.proc = subprocess.Popen(
                [python, "-m", "gpumem_trace_worker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=_worker_env(),
            )
        except OSError as e:
            raise TraceFailure(f"cannot run the Python {python!r}: {e}", field="python") from None
        self._request = json.dumps(request.payload())

    def cancel(self) -> None:
        self.cancelled.set()
        with contextlib.suppress(OSError):
            self.proc.kill()

    def result(self) -> dict[str, Any]:
        try:
            out, err = self.proc.communicate(self._request, timeout=self.timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            raise TraceFailure(
                f"the trace took longer than {self.timeout:g} s and was stopped (--timeout)", err, "timeout"
            ) from None
        if self.cancelled.is_set():
            raise TraceFailure("the trace was cancelled", err)
        return _parse(out, err, self.proc.returncode, self.python)


def _parse(out: str, err: str, code: int | None, python: str) -> dict[str, Any]:
    try:
        doc = json.loads(out) if out.strip() else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise TraceFailure(f"the trace worker in {python} failed (exit {code}): {_last_line(err)}", err)
    if "error" in doc:
        raise TraceFailure(f"trace: {doc['error']}", err, doc.get("field"))
    return doc


@contextlib.contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    """SIGALRM after ``seconds`` on the main thread (elsewhere: no bound)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "SIGALRM"):
        yield
        return

    def expired(signum: int, frame: Any) -> None:
        raise TimeoutError

    old = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run_in_process(request: TraceRequest, timeout: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
    worker = _worker()
    try:
        # the model code's deprecation warnings are its own business (a subprocess prints them to its log);
        # filters that turn warnings into errors (pytest's) must not stop the trace
        with _alarm(timeout), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return worker.handle(request.payload(), quiet=True)
    except worker.TraceError as e:
        raise TraceFailure(f"trace: {e}", field=e.field) from None
    except TimeoutError:
        raise TraceFailure(
            f"the trace took longer than {timeout:g} s and was stopped (--timeout)", field="timeout"
        ) from None


def run_trace(
    request: TraceRequest, python: str | None = None, timeout: float = DEFAULT_TIMEOUT_S
) -> dict[str, Any]:
    """The worker's result for ``request``: in this process when ``python`` is None and torch imports here,
    else in a subprocess of ``python`` (which must be given when this Python has no torch)."""
    if python is None:
        environment_versions(None)  # this Python must have torch and transformers
        return run_in_process(request, timeout)
    return TraceJob(request, python, timeout).result()
