"""validation/validate_report/data.py: the shipped data tables load, and a broken copy of one is a single
DataFileError line naming the file and the field."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO

# validate_report is imported from beside validate.py, with validation/ on sys.path, as validate.py does
VALIDATION = REPO / "validation"
if str(VALIDATION) not in sys.path:
    sys.path.insert(0, str(VALIDATION))

from validate_report import data, published_ooms  # noqa: E402
from validate_report.common import reference_dir  # noqa: E402

SHIPPED = data.DATA_DIR
FILES: dict[str, type] = {
    "published_inference.json": data.PublishedInference,
    "published_training.json": data.PublishedTraining,
    "not_reproduced.json": data.NotReproduced,
    "grid.json": data.Grid,
    "peer_settings.json": data.PeerSettings,
    "published_ooms.json": published_ooms.PublishedOoms,
}


def test_every_data_file_is_covered() -> None:
    assert sorted(p.name for p in SHIPPED.glob("*.json")) == sorted(FILES)


@pytest.mark.parametrize("name", sorted(FILES))
def test_shipped_file_loads(name: str) -> None:
    assert isinstance(data.load(name, FILES[name]), FILES[name])


def test_shipped_tables_fit_together() -> None:
    inference, training, grid = data.published_inference(), data.published_training(), data.grid()
    assert inference.mappings and training.mappings
    # every published point is reproduced (a mapping) or listed with the reason it is not, never both
    entries = json.loads((reference_dir() / "published" / "published.json").read_text())
    mapped = [m.id for m in (*inference.mappings, *training.mappings)]
    listed = set(data.not_reproduced())
    assert not listed & set(mapped)
    training_ids = {
        e["id"] for e in entries if not e["mode"].lower().startswith(("inference", "weights only"))
    }
    assert {e["id"] for e in entries} - training_ids <= set(mapped) | listed
    assert set(grid.subset.published) <= {m.id for m in inference.mappings}
    assert set(grid.subset.published_training) <= {m.id for m in training.mappings}
    assert set(data.peer_settings().llm_analysis_train) <= set(grid.training_modes)


# ---- broken copies, written to tmp_path and read through the loader's DATA_DIR ---------------------------


def _metric0(key: str, value: object) -> Callable[[dict[str, Any]], None]:
    def edit(raw: dict[str, Any]) -> None:
        raw["mappings"][0]["metrics"][0][key] = value

    return edit


def _drop_run(raw: dict[str, Any]) -> None:
    del raw["mappings"][0]["run"]


def _batch_as_text(raw: dict[str, Any]) -> None:
    raw["subset"]["inference"][0]["batch"] = "one"


def _points_as_list(raw: dict[str, Any]) -> None:
    raw["points"] = list(raw["points"])


def _repeat_second(raw: dict[str, Any]) -> None:
    raw["mappings"].append(raw["mappings"][1])


# (file, edit, the field the line names ({id0}/{id1}: the ids of the file's first two mappings), words in it)
BROKEN = [
    pytest.param(
        "published_inference.json", _drop_run, "mappings[0] ({id0}).run", "Field required", id="missing-field"
    ),
    pytest.param("grid.json", _batch_as_text, "subset.inference[0].batch", "valid integer", id="wrong-type"),
    pytest.param("not_reproduced.json", _points_as_list, "points", "valid dictionary", id="wrong-table-type"),
    pytest.param(
        "published_training.json",
        _metric0("unit", "TB"),
        "mappings[0] ({id0}).metrics[0].unit",
        "'GB', 'GiB', 'MiB', 'tokens' or 'verdict'",
        id="unknown-unit",
    ),
    pytest.param(
        "published_training.json",
        _metric0("reason", "ours {nonsense}"),
        "mappings[0] ({id0}).metrics[0].reason",
        "unknown field {nonsense} (known: cached_gib, g, ",
        id="unknown-template-field-training",
    ),
    pytest.param(
        "published_inference.json",
        _metric0("reason", "{oops} off"),
        "mappings[0] ({id0}).metrics[0].reason",
        "unknown field {oops} (known: compute_buffer, ",
        id="unknown-template-field-inference",
    ),
    pytest.param(
        "published_inference.json",
        _metric0("kind", "nope"),
        "mappings[0] ({id0}).metrics[0].kind",
        "unknown kind 'nope'",
        id="unknown-kind",
    ),
    pytest.param(
        "published_training.json",
        _metric0("ours", "nope"),
        "mappings[0] ({id0}).metrics[0].ours",
        "unknown number 'nope' (the file's ours: peak, ",
        id="unknown-ours",
    ),
    # the duplicate check runs on the whole table: the line names the repeated id
    pytest.param(
        "published_inference.json",
        _repeat_second,
        "(top level)",
        "ids appear twice: {id1}",
        id="duplicate-id-inference",
    ),
    pytest.param(
        "published_training.json",
        _repeat_second,
        "(top level)",
        "ids appear twice: {id1}",
        id="duplicate-id-training",
    ),
]


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(data, "DATA_DIR", tmp_path)
    return tmp_path


def _error(name: str) -> str:
    with pytest.raises(data.DataFileError) as info:
        data.load(name, FILES[name])
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def _fill(text: str, ids: dict[str, str]) -> str:
    for key, value in ids.items():
        text = text.replace(f"{{{key}}}", value)
    return text


@pytest.mark.parametrize(("name", "edit", "field", "words"), BROKEN)
def test_broken_copy_names_file_and_field(
    data_dir: Path, name: str, edit: Callable[[dict[str, Any]], None], field: str, words: str
) -> None:
    raw = json.loads((SHIPPED / name).read_text(encoding="utf-8"))
    ids = {f"id{i}": m["id"] for i, m in enumerate(raw.get("mappings", [])[:2])}
    edit(raw)
    (data_dir / name).write_text(json.dumps(raw, indent=1), encoding="utf-8")
    msg = _error(name)
    assert msg.startswith(f"{data_dir / name}: {_fill(field, ids)}: "), msg
    assert _fill(words, ids) in msg, msg


def test_malformed_json_names_file_and_place(data_dir: Path) -> None:
    text = (SHIPPED / "peer_settings.json").read_text(encoding="utf-8")
    (data_dir / "peer_settings.json").write_text(text.replace('"master_bytes": 4,', '"master_bytes": 4,,', 1))
    line = text[: text.index('"master_bytes": 4,')].count("\n") + 1
    msg = _error("peer_settings.json")
    assert msg.startswith(f"{data_dir / 'peer_settings.json'}: not JSON: "), msg
    assert f"at line {line} column " in msg


def test_missing_file_names_it(data_dir: Path) -> None:
    msg = _error("grid.json")
    assert msg.startswith(f"{data_dir / 'grid.json'}: cannot read: "), msg
