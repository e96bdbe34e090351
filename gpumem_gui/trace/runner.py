"""Running the trace worker: in this process when torch and transformers import here, otherwise in a
subprocess of the Python the user names (their own ML environment), speaking JSON over stdin/stdout.

A subprocess can be stopped (``timeout``, or :meth:`TraceJob.cancel` from the window): it starts in a session
of its own and the whole process group is killed, so a wrapper script that runs Python without ``exec`` does
not leave its Python running and holding the pipes. An in-process trace is bounded by ``SIGALRM`` when it runs
on the main thread (the CLI). Every failure is a :class:`TraceFailure`: one line naming the cause, with the
worker's log kept for whoever wants to see it; whatever the named program prints (nothing, not UTF-8, not a
JSON object, JSON nested past the parser's depth) is such a failure, never a traceback.
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
# the version probe below reads package metadata only: answers in well under a second
_VERSIONS_TIMEOUT_S = 60
# process groups (POSIX): the named program and whatever it starts are killed together
_GROUPS = hasattr(os, "killpg")
_NOT_WORKER = "name a Python interpreter, e.g. /path/to/venv/bin/python"
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
        proc = _start([python, "-c", _VERSIONS_SCRIPT], python)
        out, err = _communicate(proc, b"", _VERSIONS_TIMEOUT_S)
        if out is None:
            raise TraceFailure(
                f"the Python {python!r} did not say its package versions within {_VERSIONS_TIMEOUT_S} s",
                err,
                "python",
            )
        if proc.returncode != 0:
            raise TraceFailure(f"the Python {python!r} failed: {_last_line(err)}", err, "python")
        found = _json_object(out, python, err)
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in found.items()):
            bad = f"{python!r} is not a Python gpumem can trace with: {_NOT_WORKER}"
            raise TraceFailure(bad, err, "python")
        where = f"the Python at {python}"
    missing = [m for m in ("torch", "transformers") if m not in found]
    if missing:
        raise TraceFailure(
            f"{where} has no {' or '.join(missing)}: trace mode needs torch and transformers "
            "(pip install torch==2.13.0 transformers; peft for LoRA), or name the Python of an environment "
            "that has them (--python PATH, or the window's trace setting)",
            field="python",
        )
    return found


def _start(args: list[str], python: str) -> subprocess.Popen[bytes]:
    """``args`` in a session (and process group) of its own, bytes on every pipe."""
    try:
        return subprocess.Popen(
            args,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=_worker_env(),
            start_new_session=_GROUPS,
        )
    except OSError as e:
        raise TraceFailure(f"cannot run the Python {python!r}: {e}", field="python") from None


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """Kill ``proc`` and everything it started in its process group (a wrapper's Python too). Once ``proc``
    has been reaped its pid may be reused, so the group is then left alone (its pipes are closed by then)."""
    if proc.returncode is not None:
        return
    with contextlib.suppress(OSError):
        if _GROUPS:
            os.killpg(proc.pid, signal.SIGKILL)  # the group's id is the leader's pid (start_new_session)
        else:
            proc.kill()


def _communicate(proc: subprocess.Popen[bytes], data: bytes, timeout: float) -> tuple[str | None, str]:
    """(stdout, stderr) of ``proc`` given ``data`` on stdin; stdout is None when it ran past ``timeout``
    (its group is then killed). Only stdout is parsed, so only the log is decoded leniently."""
    try:
        out, err = proc.communicate(data, timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc)
        _out, err = proc.communicate()
        return None, err.decode("utf-8", "replace")
    log = err.decode("utf-8", "replace")
    try:
        return out.decode("utf-8"), log
    except UnicodeDecodeError:
        return "\ufffd", log  # not UTF-8: _json_object says it is not the answer of a Python


def _json_object(out: str, python: str, log: str) -> dict[str, Any]:
    """The one JSON object ``python`` printed; anything else is a TraceFailure naming it."""
    try:
        doc = json.loads(out)
    except (ValueError, RecursionError):  # RecursionError: JSON nested past the parser's depth
        doc = None
    if not isinstance(doc, dict):
        said = "nothing" if not out.strip() else "no JSON object"
        tail = f"; its log: {_last_line(log)}" if log.strip() else ""
        raise TraceFailure(
            f"{python!r} is not a Python gpumem can trace with: it printed {said} ({_NOT_WORKER}){tail}",
            log,
            "python",
        )
    return doc


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "no output"


class TraceJob:
    """One trace in a subprocess; :meth:`result` waits for it, :meth:`cancel` stops it (another thread)."""

    def __init__(self, request: TraceRequest, python: str, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.python, self.timeout = python, timeout
        self.cancelled = threading.Event()
        self.proc = _start([python, "-m", "gpumem_trace_worker"], python)
        self._request = json.dumps(request.payload()).encode()

    def cancel(self) -> None:
        self.cancelled.set()
        _kill(self.proc)

    def result(self) -> dict[str, Any]:
        out, err = _communicate(self.proc, self._request, self.timeout)
        if self.cancelled.is_set():
            raise TraceFailure("the trace was cancelled", err)
        if out is None:
            raise TraceFailure(
                f"the trace took longer than {self.timeout:g} s and was stopped (--timeout)", err, "timeout"
            )
        return _parse(out, err, self.proc.returncode, self.python)


def _parse(out: str, err: str, code: int | None, python: str) -> dict[str, Any]:
    if code != 0 and not out.strip():
        raise TraceFailure(f"the trace worker in {python} failed (exit {code}): {_last_line(err)}", err)
    doc = _json_object(out, python, err)
    if "error" in doc:
        raise TraceFailure(f"trace: {_short(doc['error'])}", err, _field(doc.get("field")))
    return doc


def _short(value: object, limit: int = 300) -> str:
    text = " ".join(str(value).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _field(value: object) -> str | None:
    return value if isinstance(value, str) else None


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
