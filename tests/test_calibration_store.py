"""Issue 32 item 3: the calibrations store (one JSON file in the settings folder): round trip, replace,
remove, and a corrupt file kept aside with one line, nothing the user had lost."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import pytest

from gpumem_gui.calibration_store import FORMAT, STORE_ENV, CalibrationStore, store_path
from gpumem_gui.core import Calibration, GpumemInputError, calibration_from
from gpumem_gui.core.observed import ObservedMemory

GiB = 1 << 30


def _cal(name: str, gpu: str = "H100") -> Calibration:
    rec = ObservedMemory(
        source_format="torch_oom", process_bytes=20 * GiB, allocated_bytes=18 * GiB, reserved_bytes=19 * GiB
    )
    return calibration_from((rec,), None, name=name, gpu_name=gpu, measured_on=date(2026, 12, 7))


def test_round_trip_replace_and_remove(tmp_path: Path) -> None:
    store = CalibrationStore(tmp_path / "sub" / "calibrations.json")
    assert store.load().calibrations == ()
    store.save(_cal("a"))
    store.save(_cal("b", "RTX-4090"))
    again = CalibrationStore(store.path).load()
    assert again.problem is None and [c.name for c in again.calibrations] == ["a", "b"]
    assert again.calibrations[0] == _cal("a")  # every field survives the file
    store.save(_cal("a", "A100-80GB"))  # the same name replaces
    assert [(c.name, c.gpu_name) for c in store.load().calibrations] == [
        ("b", "RTX-4090"),
        ("a", "A100-80GB"),
    ]
    assert store.remove("b").name == "b"
    assert [c.name for c in store.load().calibrations] == ["a"]
    with pytest.raises(GpumemInputError, match=r"no calibration named 'zz' \(kept: 'a'\)"):
        store.remove("zz")
    assert json.loads(store.path.read_text())["format"] == FORMAT


def test_path_from_the_environment_and_the_settings_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(STORE_ENV, str(tmp_path / "team.json"))
    assert store_path() == tmp_path / "team.json"
    monkeypatch.delenv(STORE_ENV)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    # on Linux the folder of QSettings("gpumem", "gpumem"): $XDG_CONFIG_HOME/gpumem
    assert store_path() == tmp_path / "config" / "gpumem" / "calibrations.json"


def test_a_corrupt_file_is_kept_aside_with_one_line(tmp_path: Path) -> None:
    path = tmp_path / "calibrations.json"
    path.write_text('{"format": "gpumem.calibrations/1", "calibrations": [')
    loaded = CalibrationStore(path).load()
    assert loaded.calibrations == () and loaded.problem is not None and "\n" not in loaded.problem
    assert "malformed JSON" in loaded.problem and "kept aside as calibrations.json.corrupt-" in loaded.problem
    (aside,) = tmp_path.glob("calibrations.json.corrupt-*")
    assert aside.read_text().endswith('"calibrations": [')  # what the user had, as it was
    assert CalibrationStore(path).load().problem is None  # the store is a valid (empty) one again


def test_one_bad_entry_keeps_the_good_ones(tmp_path: Path) -> None:
    path = tmp_path / "calibrations.json"
    good = _cal("good").model_dump(mode="json")
    bad = {**_cal("bad").model_dump(mode="json"), "allocator_ratio": 0.5}
    path.write_text(json.dumps({"format": FORMAT, "calibrations": [good, bad]}))
    loaded = CalibrationStore(path).load()
    assert [c.name for c in loaded.calibrations] == ["good"]
    assert loaded.problem is not None and "entry 2" in loaded.problem and "allocator_ratio" in loaded.problem
    (aside,) = tmp_path.glob("calibrations.json.corrupt-*")
    assert len(json.loads(aside.read_text())["calibrations"]) == 2
    assert [c.name for c in CalibrationStore(path).load().calibrations] == ["good"]


def test_a_file_that_cannot_be_read_is_never_written_over(tmp_path: Path) -> None:
    path = tmp_path / "calibrations.json"
    path.mkdir()
    store = CalibrationStore(path)
    assert store.load().problem is not None and store.load().blocked
    with pytest.raises(GpumemInputError, match="nothing was changed"):
        store.save(_cal("a"))
    assert path.is_dir()
