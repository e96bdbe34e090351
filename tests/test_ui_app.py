"""The `gpumem-gui` entry point: --version, bad flags, and --self-test on the real window in a subprocess."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpumem_gui.app import main
from tests.app_process import run_app

REPO = Path(__file__).resolve().parents[1]


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("gpumem-gui ")


def test_self_test_passes_with_a_fake_gpu() -> None:
    proc = run_app("--self-test", "--fake-gpus", "rtx4090_browser")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "self-test: ok" in proc.stdout
    assert "fake:rtx4090_browser" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_self_test_passes_without_a_driver() -> None:
    proc = run_app("--self-test", "--fake-gpus", "no_driver")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_bad_fake_gpu_scenario_is_one_line_and_exit_2() -> None:
    proc = run_app("--fake-gpus", "no_such_scenario", timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("gpumem-gui: error:") and "shipped scenarios" in proc.stderr
    assert "Traceback" not in proc.stderr
