"""Scenarios (save/load, corrupt files, recent files, compare) and the export of a report."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from gpumem_gui.core.runtimes.inference import InferenceRun
from gpumem_gui.ui.main_window import MainWindow
from gpumem_gui.ui.scenario import (
    SCENARIO_FORMAT,
    ModelRef,
    Scenario,
    ScenarioError,
    read_scenario,
    save_scenario,
)
from gpumem_gui.ui.target_form import GpuChoice

pytestmark = [pytest.mark.no_qt_log, pytest.mark.usefixtures("qt_warnings_fail")]

RUN = InferenceRun(engine="vllm", batch=16, seq=2048, new_tokens=512, max_model_len=32768, kv_dtype="fp8")
GPU = GpuChoice(gpu_id="H100-SXM-80GB", count=2, margin_mib=2048)


def _set_plan(w: MainWindow, source: str = "Qwen/Qwen3-8B") -> None:
    w.load_source(source)
    w.run_form.set_value(RUN)
    w.target_form.set_value(GPU)
    w.recompute_now()


def test_save_and_load_round_trip(main_window: MainWindow, tmp_path: Path) -> None:
    w = main_window
    _set_plan(w)
    folder = tmp_path / "plans"
    folder.mkdir()
    path = folder / "plan.json"
    assert w.save_scenario(path)
    doc = json.loads(path.read_text())
    assert doc["format"] == SCENARIO_FORMAT and doc["version"] == 2 and doc["mode"] == "infer"
    assert doc["model"] == {"source": "Qwen/Qwen3-8B"}
    assert doc["run"]["engine"] == "vllm" and doc["gpu"]["gpu_id"] == "H100-SXM-80GB"
    assert [p.name for p in folder.iterdir()] == ["plan.json"]  # no temporary file left behind

    w.load_source("meta-llama/Llama-3.1-8B")
    w.run_form.set_value(InferenceRun())
    w.target_form.set_value(GpuChoice())
    w.recompute_now()
    assert w.open_scenario(path)
    assert w.model is not None and w.model.source == "Qwen/Qwen3-8B"
    assert w.run_form.value() == RUN
    assert w.target_form.value() == GPU
    assert w.estimate is not None and w.estimate.engine == "vllm"
    assert str(path.resolve()) == w.recent.paths()[0]


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("{not json", "malformed JSON"),
        ("[1, 2]", "JSON object"),
        ('{"format": "something-else", "version": 1}', "not a gpumem scenario"),
        ('{"format": "gpumem-scenario", "version": 9}', "version 9"),
        (
            '{"format": "gpumem-scenario", "version": 1, "model": {"source": "x"}, "run": {"batch": 0}}',
            "batch",
        ),
        (
            '{"format": "gpumem-scenario", "version": 1, "model": {"source": "x"}, "run": {}, "extra": 1}',
            "extra",
        ),
    ],
)
def test_a_corrupt_file_shows_a_clear_message_and_changes_nothing(
    main_window: MainWindow, tmp_path: Path, text: str, words: str
) -> None:
    w = main_window
    path = tmp_path / "bad.json"
    path.write_text(text)
    before = (w.model, w.run_form.value(), w.target_form.value(), w.estimate)
    assert not w.open_scenario(path)
    assert words in w.last_message
    assert (w.model, w.run_form.value(), w.target_form.value(), w.estimate) == before
    with pytest.raises(ScenarioError):
        read_scenario(path)


def test_a_scenario_whose_model_cannot_load_changes_nothing(main_window: MainWindow, tmp_path: Path) -> None:
    w = main_window
    path = tmp_path / "gone.json"
    save_scenario(path, Scenario(model=ModelRef(source=str(tmp_path / "missing" / "config.json")), run=RUN))
    (tmp_path / "missing").mkdir()
    (tmp_path / "missing" / "config.json").write_text("{}")
    before = (w.model, w.run_form.value())
    assert not w.open_scenario(path)
    assert "could not be loaded" in w.last_message
    assert (w.model, w.run_form.value()) == before


def test_open_path_recognises_a_scenario(main_window: MainWindow, tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    save_scenario(path, Scenario(model=ModelRef(source="google/gemma-2-2b"), run=InferenceRun(batch=2)))
    assert main_window.open_path(path)
    assert main_window.model is not None and main_window.model.source == "google/gemma-2-2b"
    assert main_window.run_form.value().batch == 2


def test_recent_files_menu(main_window: MainWindow, tmp_path: Path) -> None:
    w = main_window
    for i in range(3):
        assert w.save_scenario(tmp_path / f"s{i}.json")
    w.menus.fill_recent_menu()
    texts = [a.text() for a in w.recent_menu.actions() if a.text()]
    assert texts[:3] == [str((tmp_path / f"s{i}.json").resolve()) for i in (2, 1, 0)]


def test_compare_two_scenarios(main_window: MainWindow, tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    save_scenario(a, Scenario(model=ModelRef(source="meta-llama/Llama-3.1-8B"), run=InferenceRun(batch=1)))
    save_scenario(b, Scenario(model=ModelRef(source="meta-llama/Llama-3.1-8B"), run=InferenceRun(batch=4)))
    dialog = main_window.compare_files(a, b)
    rows = {key: (na, nb) for key, _label, na, nb in dialog.rows}
    assert rows["weights"][0] == rows["weights"][1]
    assert rows["kv_cache"][1] == 4 * rows["kv_cache"][0]
    assert rows[""][1] > rows[""][0]  # the total row
    assert dialog.table.rowCount() == len(dialog.rows)
    assert dialog.table.item(len(dialog.rows) - 1, 3).text().startswith("+")
    dialog.close()
    current = main_window.compare_files(None, b)
    assert current.rows
    current.close()


def test_export_writes_report_chart_and_the_cli_json(main_window: MainWindow, tmp_path: Path) -> None:
    from gpumem_gui.cli import main as cli_main

    w = main_window
    w.load_source("meta-llama/Llama-3.1-8B")
    w.run_form.set_value(InferenceRun(batch=2, seq=4096, new_tokens=256))
    w.target_form.set_value(GpuChoice(gpu_id="RTX-4090"))
    w.recompute_now()
    written = w.export_report(tmp_path / "report.md")
    assert [p.name for p in written] == ["report.md", "report.png", "report.json"]
    for p in written:
        assert p.is_file() and p.stat().st_size > 0
    assert written[1].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = written[0].read_text()
    for words in ("# gpumem plan", "## Verdict", "## Components at the peak", "How each number is computed"):
        assert words in md
    assert "gpumem estimate meta-llama/Llama-3.1-8B" in md and "report.png" in md
    for c in w.estimate.components:
        assert c.explain.formula in md

    doc = json.loads(written[2].read_text())
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = cli_main(
            ["estimate", "meta-llama/Llama-3.1-8B", "--batch", "2", "--seq", "4096", "--new-tokens", "256",
             "--gpu", "RTX-4090", "--json"]
        )  # fmt: skip
    assert rc == 0
    assert doc == json.loads(buf.getvalue())
