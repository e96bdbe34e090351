"""Bring your own command or config in the window: Edit > Paste command…, a training config dropped onto the
window, and Edit > Copy as (each runtime's own command for the run on screen)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDropEvent
from PySide6.QtWidgets import QApplication

from gpumem_gui.core import TrainingRun, import_command
from gpumem_gui.ui.import_glue import PasteDialog, is_training_config
from gpumem_gui.ui.main_window import MainWindow

pytestmark = [pytest.mark.no_qt_log, pytest.mark.usefixtures("qt_warnings_fail")]

DATA = Path(__file__).parent / "data" / "imports"


def _settled(window: MainWindow, qtbot) -> None:
    qtbot.waitUntil(lambda: window.estimate is not None, timeout=5000)
    window.recompute_now()
    window.flush_background()


def test_paste_a_vllm_command(main_window: MainWindow, qtbot) -> None:
    w = main_window
    assert w.imports.apply_command(
        "vllm serve Qwen/Qwen3-8B -tp 2 --max-model-len 16384 --enforce-eager --frob 1"
    )
    qtbot.waitUntil(lambda: w.model is not None and w.model.source == "Qwen/Qwen3-8B", timeout=5000)
    _settled(w, qtbot)
    run = w.run
    assert (run.engine, run.tp, run.max_model_len, run.enforce_eager) == ("vllm", 2, 16384, True)
    assert w.mode == "infer"
    assert w.target_form.value().count == 2  # the target takes the run's GPUs
    lines = w.imports.last_lines
    assert lines[0].startswith("read as: vLLM command")
    assert any(line.startswith("warning: --frob 1") for line in lines)
    assert "Imported the vLLM command" in w.last_message


def test_drop_a_training_config(main_window: MainWindow, qtbot) -> None:
    w = main_window
    path = DATA / "torchtune_llama3_1_8B_qlora_single_device.yaml"  # a catalog model: no network
    assert is_training_config(path) and not is_training_config(DATA / "SOURCES.md")
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(path))])
    event = QDropEvent(
        QPointF(10, 10),
        Qt.DropAction.CopyAction,
        mime,
        Qt.MouseButton.NoButton,
        Qt.KeyboardModifier.NoModifier,
    )
    w.dropEvent(event)
    qtbot.waitUntil(lambda: isinstance(w.run, TrainingRun) and w.run.method == "qlora", timeout=10000)
    run = w.run
    assert (run.framework, run.lora_rank, run.batch, run.grad_accum, run.loss) == (
        "torchtune",
        8,
        2,
        8,
        "chunked",
    )
    assert w.mode == "train" and w.model.source == "meta-llama/Llama-3.1-8B"
    assert any(line.startswith("warning: tokenizer.max_seq_len") for line in w.imports.last_lines)


def test_a_config_without_a_model_applies_to_the_model_on_screen(main_window: MainWindow, qtbot) -> None:
    w = main_window
    source = w.model.source
    assert w.imports.apply_file(DATA / "deepspeed_llamafactory_ds_z2_config.json")
    qtbot.waitUntil(lambda: isinstance(w.run, TrainingRun) and w.run.zero == 2, timeout=10000)
    assert w.model.source == source
    assert w.imports.last_lines[-1] == f"model: {source} (the one on screen)"


def test_a_bad_command_changes_nothing(main_window: MainWindow) -> None:
    w = main_window
    before = (w.model.source, w.run)
    w.guard(lambda: w.imports.apply_command("vllm serve m --max-model-len lots"))
    assert "argument 3 '--max-model-len'" in w.last_message
    assert (w.model.source, w.run) == before


def test_copy_as_each_runtime(main_window: MainWindow, qtbot) -> None:
    w = main_window
    w.imports.apply_command("vllm serve Qwen/Qwen3-8B -tp 2 --max-model-len 8192")
    qtbot.waitUntil(lambda: w.model is not None and w.model.source == "Qwen/Qwen3-8B", timeout=5000)
    _settled(w, qtbot)
    entries = {label: text for label, text, _ in w.imports.commands()}
    vllm = next(t for label, t in entries.items() if label.startswith("vLLM"))
    assert vllm is not None
    # the copied vLLM command reads back as the same run
    back = import_command(vllm).run
    assert (back.tp, back.max_model_len) == (2, 8192)
    assert any(label.startswith("llama.cpp") for label in entries)
    menu = w.menus.copy_as_menu
    w.imports.fill_copy_menu(menu)
    action = next(a for a in menu.actions() if a.text().startswith("vLLM") and a.isEnabled())
    action.trigger()
    assert QApplication.clipboard().text() == vllm
    # a first '# gpumem, not in this command: ...' line names what the command cannot carry
    command = "\n".join(ln for ln in vllm.splitlines() if not ln.startswith("#"))
    assert shlex.split(command)[:3] == ["vllm", "serve", "Qwen/Qwen3-8B"]


def test_paste_dialog_and_menu(main_window: MainWindow, qtbot) -> None:
    w = main_window
    titles = [a.text() for a in w.menuBar().actions()]
    edit = w.menuBar().actions()[titles.index("&Edit")].menu()
    texts = [a.text() for a in edit.actions()]
    assert "&Paste command…" in texts and "Copy &as" in texts
    dialog = PasteDialog(w)
    qtbot.addWidget(dialog)
    dialog.edit.setPlainText("llama-server -m x.gguf -c 4096")
    assert dialog.text == "llama-server -m x.gguf -c 4096"
