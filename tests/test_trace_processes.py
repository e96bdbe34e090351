"""The program named by ``--python`` (or the window's trace setting) is only ever run, never trusted: whatever
it prints is one line and exit 2, and a wrapper script that starts Python without ``exec`` is stopped as a
whole (its process group) on ``--timeout`` and on Cancel (issue 33 item 10). The "interpreters" here are
small shell scripts; no torch is needed."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from gpumem_gui.core import load_model, make_run
from gpumem_gui.trace import TraceFailure, TraceJob, environment_versions, make_request

# a version probe answer that lets the trace itself start (runner.environment_versions)
VERSIONS = '{"torch": "2.13.0", "transformers": "4.57.0"}'


def _script(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def _interpreter(tmp_path: Path, worker_body: str) -> str:
    """A fake Python: answers the version probe (``-c ...``), runs ``worker_body`` as the worker (``-m``)."""
    return _script(
        tmp_path,
        "python",
        f"if [ \"$1\" = -c ]; then echo '{VERSIONS}'; exit 0; fi\ncat > /dev/null\n{worker_body}\n",
    )


NOT_PYTHONS = {
    "true": "exit 0\n",
    "echo": 'echo "$@"\n',
    "not-utf8": "printf '\\377\\376{}'\n",
    "null": "echo null\n",
    "nested": "i=0; while [ $i -lt 3000 ]; do printf '['; i=$((i+1)); done; echo\n",
    "list": "echo '[1, 2]'\n",
    "odd-versions": 'echo \'{"torch": 2, "transformers": null}\'\n',
}


def _one_line(e: pytest.ExceptionInfo[TraceFailure]) -> str:
    text = str(e.value)
    assert "\n" not in text and len(text) < 400
    return text


@pytest.mark.parametrize("kind", sorted(NOT_PYTHONS))
def test_a_program_that_is_not_python_is_one_line_naming_python(tmp_path: Path, kind: str) -> None:
    with pytest.raises(TraceFailure) as e:
        environment_versions(_script(tmp_path, kind, NOT_PYTHONS[kind]))
    assert "is not a Python gpumem can trace with" in _one_line(e) and e.value.field == "python"


@pytest.mark.parametrize("kind", ["true", "echo", "not-utf8", "null", "nested", "list"])
def test_a_worker_that_does_not_answer_json_is_one_line(tmp_path: Path, kind: str) -> None:
    python = _interpreter(tmp_path, NOT_PYTHONS[kind])
    request = make_request(load_model("Llama-3.2-1B"), make_run(seq=64))
    with pytest.raises(TraceFailure) as e:
        TraceJob(request, python, timeout=30).result()
    assert "is not a Python gpumem can trace with" in _one_line(e)


def test_a_worker_error_that_is_not_a_string_is_still_one_line(tmp_path: Path) -> None:
    python = _interpreter(tmp_path, 'echo \'{"error": ["a", "b\\\\nc"], "field": 3}\'')
    request = make_request(load_model("Llama-3.2-1B"), make_run(seq=64))
    with pytest.raises(TraceFailure) as e:
        TraceJob(request, python, timeout=30).result()
    assert _one_line(e).startswith("trace: ") and e.value.field is None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (killed, not yet reaped by its new parent) is dead too
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def _wrapper(tmp_path: Path) -> tuple[str, Path]:
    """A wrapper running its 'Python' (a long sleep) as a child, without exec; it writes the child's pid."""
    pid_file = tmp_path / "child.pid"
    return _interpreter(tmp_path, f"sleep 60 &\necho $! > {pid_file}\nwait\n"), pid_file


def _child_pid(pid_file: Path) -> int:
    for _ in range(500):
        if pid_file.exists() and pid_file.read_text().strip():
            return int(pid_file.read_text())
        time.sleep(0.01)
    raise AssertionError("the wrapper never started its child")


def _gone(pid: int) -> bool:
    for _ in range(200):
        if not _alive(pid):
            return True
        time.sleep(0.01)
    return False


def test_timeout_kills_the_wrappers_child_too(tmp_path: Path) -> None:
    python, pid_file = _wrapper(tmp_path)
    request = make_request(load_model("Llama-3.2-1B"), make_run(seq=64))
    t0 = time.monotonic()
    with pytest.raises(TraceFailure, match="longer than 1 s") as e:
        TraceJob(request, python, timeout=1).result()
    # before: only the wrapper was killed and the answer waited for its child (60 s here)
    assert time.monotonic() - t0 < 30 and e.value.field == "timeout"
    assert _gone(_child_pid(pid_file))


def test_cancel_kills_the_wrappers_child_too(tmp_path: Path) -> None:
    python, pid_file = _wrapper(tmp_path)
    request = make_request(load_model("Llama-3.2-1B"), make_run(seq=64))
    job = TraceJob(request, python, timeout=120)
    outcome: list[BaseException] = []

    def wait() -> None:
        try:
            job.result()
        except TraceFailure as e:
            outcome.append(e)

    waiter = threading.Thread(target=wait)
    waiter.start()
    child = _child_pid(pid_file)
    job.cancel()
    waiter.join(30)
    assert not waiter.is_alive() and "cancelled" in str(outcome[0])
    assert _gone(child)


def test_cli_says_one_line_and_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gpumem_gui.cli import main

    for kind in ("true", "not-utf8", "nested"):
        python = _script(tmp_path, kind, NOT_PYTHONS[kind])
        assert main(["trace", "Llama-3.2-1B", "--seq", "64", "--no-cache", "--python", python]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "python" in err
