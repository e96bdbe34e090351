"""Test-wide set-up: headless Qt, isolated settings, and the reference data."""

from __future__ import annotations

import json
import os
from pathlib import Path

# Before any QApplication exists: no display here, and no platform + no display aborts the whole process.
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest

REPO = Path(__file__).resolve().parents[1]


def reference_dir() -> Path:
    env = os.environ.get("GPUMEM_REFERENCE")
    if env:
        return Path(env)
    shared = REPO.parent / "shared" / "reference"
    if (shared / "groundtruth.json").is_file():
        return shared
    return REPO / "tests" / "reference"


@pytest.fixture(scope="session")
def reference() -> Path:
    return reference_dir()


@pytest.fixture(scope="session")
def groundtruth(reference: Path) -> dict:
    return json.loads((reference / "groundtruth.json").read_text())


@pytest.fixture(autouse=True)
def _isolated_dirs(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test gets its own config/cache/data dirs, so nothing a test writes leaks into the user's."""
    base = tmp_path_factory.mktemp("xdg")
    for var in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "HF_HOME"):
        monkeypatch.setenv(var, str(base / var.lower()))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
