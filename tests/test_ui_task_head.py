"""An encoder's task head in the window (issue 33 item 2): one declaration (core TaskHead) makes the CLI's
``--task`` / ``--num-labels`` and the form, shown only for encoders, filled with the config's head, changing
the estimate and the counts as the CLI does, and kept in scenario files and the copied command."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from gpumem_gui.cli.flags import add_task_flags, with_task
from gpumem_gui.core import TaskHead, count_params, load_model, run_fields
from gpumem_gui.ui.main_window import MainWindow

pytestmark = [pytest.mark.no_qt_log, pytest.mark.usefixtures("qt_warnings_fail")]

BERT = "google-bert/bert-base-uncased"  # config: BertForMaskedLM


def _cli_params(*flags: str) -> int:
    """The parameter count the CLI gives ``gpumem inspect BERT <flags>``."""
    parser = argparse.ArgumentParser()
    add_task_flags(parser)
    m = with_task(load_model(BERT), parser.parse_args(list(flags)))
    assert m.params is not None
    return m.params.total


def _params(w: MainWindow) -> int:
    assert w.estimate is not None
    return w.estimate.facts["params_total"]


def test_the_cli_and_the_window_read_one_declaration() -> None:
    assert [f.flag for f in run_fields(TaskHead)] == ["--task", "--num-labels"]
    parser = argparse.ArgumentParser()
    add_task_flags(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--num-labels", "0"])  # the declared range: 1 to 1,048,576


def test_the_task_head_form_shows_for_encoders_and_changes_the_estimate(main_window: MainWindow) -> None:
    w = main_window
    form = w.run_panel.task_form
    assert form.isHidden()  # Llama-3.1-8B has no task head to choose
    assert w.load_source(BERT)
    assert not form.isHidden() and form.value() == TaskHead(task="masked_lm", num_labels=2)
    assert not form.row_visible("num_labels")  # a masked LM has no labels
    assert _params(w) == count_params(load_model(BERT).spec).total == _cli_params()

    form.widget("task").setCurrentIndex(form.widget("task").findData("token_classification"))
    assert form.row_visible("num_labels")
    form.widget("num_labels").setValue(9)
    w.recompute_now()
    assert _params(w) == _cli_params("--task", "token_classification", "--num-labels", "9") == 108_898_569
    assert "--task token_classification --num-labels 9" in w.command_line()
    assert w.model_panel.subtitle.text().startswith("catalog · 108.90 M parameters")  # counted again

    assert w.load_source("Qwen/Qwen3-8B")  # a decoder: the form goes, the estimate is Qwen's own
    assert form.isHidden() and _params(w) == count_params(load_model("Qwen/Qwen3-8B").spec).total
    assert w.load_source(BERT)  # the next encoder starts from its config's head
    assert form.value() == TaskHead(task="masked_lm", num_labels=2)


def test_the_task_head_round_trips_through_a_scenario(main_window: MainWindow, tmp_path: Path) -> None:
    w = main_window
    assert w.load_source(BERT)
    form = w.run_panel.task_form
    form.set_value(TaskHead(task="sequence_classification", num_labels=5))
    form.changed.emit()  # as an edit does
    w.recompute_now()
    expected = _cli_params("--task", "sequence_classification", "--num-labels", "5")
    assert _params(w) == expected
    path = tmp_path / "bert.json"
    assert w.save_scenario(path)
    saved = json.loads(path.read_text())["model"]
    assert saved == {"source": BERT, "task": {"task": "sequence_classification", "num_labels": 5}}

    assert w.load_source("Qwen/Qwen3-8B")
    assert w.open_scenario(path)
    assert form.value() == TaskHead(task="sequence_classification", num_labels=5)
    assert _params(w) == expected
