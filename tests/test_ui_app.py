"""The `gpumem-gui` entry point: --version, bad flags, and --self-test on the real window in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpumem_gui.app import main

REPO = Path(__file__).resolve().parents[1]


def _run(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    code = "import sys; from gpumem_gui.app import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=REPO,
        check=False,
    )


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("gpumem-gui ")


def test_self_test_passes_with_a_fake_gpu() -> None:
    proc = _run("--self-test", "--fake-gpus", "rtx4090_browser")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "self-test: ok" in proc.stdout
    assert "fake:rtx4090_browser" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_self_test_passes_without_a_driver() -> None:
    proc = _run("--self-test", "--fake-gpus", "no_driver")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_bad_fake_gpu_scenario_is_one_line_and_exit_2() -> None:
    proc = _run("--fake-gpus", "no_such_scenario", timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("gpumem-gui: error:") and "shipped scenarios" in proc.stderr
    assert "Traceback" not in proc.stderr
