"""The window as a user goes through it (issue 33 item 1 and "Done when"): a model's own published weight
format is its default and never carries over to the next model; a format the user chose stays for the models
it applies to; switching between inference and training and back keeps both."""

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import QSettings

from gpumem_gui.core import Estimate, InferenceRun, TrainingRun
from gpumem_gui.ui.main_window import MainWindow

pytestmark = [pytest.mark.no_qt_log, pytest.mark.usefixtures("qt_warnings_fail")]

GIB = 2**30
DEEPSEEK, QWEN, GPT_OSS = "deepseek-ai/DeepSeek-V3", "Qwen/Qwen3-8B", "openai/gpt-oss-20b"


def _weights(w: MainWindow) -> tuple[str, float]:
    """The form's weight format and the weights on screen, GiB to 0.01."""
    est = w.estimate
    assert isinstance(est, Estimate) and est.mode == "inference"
    comp = est.component("weights")
    assert comp is not None
    return w.run_form.value().weights, round(comp.bytes / GIB, 2)


def _click_catalog(w: MainWindow, model_id: str) -> None:
    """Pick ``model_id`` in the catalog table, as a click on its row does."""
    table = w.model_panel.table
    row = next(r for r in range(table.rowCount()) if table.item(r, 0).data(256) == model_id)  # UserRole
    table.selectRow(row)
    assert w.model is not None and w.model.source == model_id


def _pick_weights(w: MainWindow, fmt: str) -> None:
    box = w.run_form.widget("weights")
    box.setCurrentIndex(box.findData(fmt))  # emits the form's changed, as a pick from the list does
    w.recompute_now()


def test_open_two_models_of_other_formats_then_train_and_back(main_window: MainWindow) -> None:
    w = main_window
    assert _weights(w) == ("bf16", 14.96)  # Llama-3.1-8B at start
    _click_catalog(w, DEEPSEEK)
    assert _weights(w) == ("fp8-block", 626.92)  # as published: quantization_config fp8, 128x128 blocks
    _click_catalog(w, QWEN)
    assert _weights(w) == ("bf16", 15.26)  # Qwen3-8B is published in bf16: DeepSeek's fp8 stays behind
    w.mode_tabs.setCurrentIndex(1)  # the Training tab
    assert w.mode == "train" and isinstance(w.run, TrainingRun)
    est = w.estimate
    assert est is not None and est.mode == "train" and est.facts["params_total"] == w.model.params.total
    w.mode_tabs.setCurrentIndex(0)  # back to Inference
    assert w.mode == "infer" and isinstance(w.run, InferenceRun)
    assert _weights(w) == ("bf16", 15.26)
    _click_catalog(w, GPT_OSS)
    assert _weights(w) == ("mxfp4-moe", 12.82)  # gpt-oss's MXFP4 experts (12.8 GiB, arXiv:2508.10925)
    _click_catalog(w, QWEN)
    assert _weights(w) == ("bf16", 15.26)


def test_a_chosen_format_stays_where_it_applies(main_window: MainWindow) -> None:
    """A format the user picked is kept for the next model published unquantized; a quantized checkpoint opens
    in its own format, and the choice comes back after it."""
    w = main_window
    _pick_weights(w, "nf4")
    _click_catalog(w, QWEN)
    assert _weights(w) == ("nf4", 5.96)
    _click_catalog(w, DEEPSEEK)
    assert _weights(w)[0] == "fp8-block"
    _click_catalog(w, QWEN)
    assert _weights(w) == ("nf4", 5.96)
    _pick_weights(w, "bf16")  # back to the model's own: nothing chosen any more
    _click_catalog(w, GPT_OSS)
    _click_catalog(w, QWEN)
    assert _weights(w) == ("bf16", 15.26)


def test_a_scenario_of_a_quantized_checkpoint_does_not_leak_its_format(
    main_window: MainWindow, tmp_path: Path
) -> None:
    """The scenario's form holds DeepSeek's published fp8; the next model opened is estimated in its own."""
    w = main_window
    w.load_source(DEEPSEEK)
    assert w.save_scenario(tmp_path / "deepseek.json")
    w.load_source(QWEN)
    assert w.open_scenario(tmp_path / "deepseek.json")
    assert w.model is not None and w.model.source == DEEPSEEK and _weights(w)[0] == "fp8-block"
    w.load_source(QWEN)
    assert _weights(w) == ("bf16", 15.26)


def test_a_restored_session_of_a_quantized_checkpoint_does_not_leak_its_format(
    qt_warnings_fail, qtbot, isolated_settings: QSettings
) -> None:
    """The window restores the last session (DeepSeek-V3 as published); opening Qwen3-8B then is bf16, not
    fp8 (8.79 GiB): the issue as a user met it."""
    first = MainWindow(settings=isolated_settings, restore=False, dialogs=False, snapshot_interval_ms=0)
    qtbot.addWidget(first)
    first.load_source(DEEPSEEK)
    first.flush_background()
    first.close()
    w = MainWindow(settings=isolated_settings, restore=True, dialogs=False, snapshot_interval_ms=0)
    qtbot.addWidget(w)
    w.show()
    qtbot.waitUntil(lambda: w.estimate is not None, timeout=5000)
    assert w.model is not None and w.model.source == DEEPSEEK and _weights(w)[0] == "fp8-block"
    w.load_source(QWEN)
    assert _weights(w) == ("bf16", 15.26)
    w.flush_background()


def test_the_maxima_line_shows_the_phrases_as_written(qtbot) -> None:
    """The fit panel's maxima are core phrases in plain text: "the model's context window" shows its
    apostrophe, not the HTML entity the label printed when it escaped text it then showed as plain text."""
    from gpumem_gui.core import GpuTarget, find_model, fit_report, make_run, maxima_phrases
    from gpumem_gui.ui.changes_panel import ChangesPanel

    spec = find_model("google-bert/bert-base-uncased").spec
    rep = fit_report(spec, make_run(seq=512), GpuTarget(name="big", capacity_bytes=80 << 30))
    panel = ChangesPanel()
    qtbot.addWidget(panel)
    panel.show_report(rep, "GiB")
    assert "(the model's context window)" in panel.maxima.text()
    assert panel.maxima.text() == " · ".join(maxima_phrases(rep))


def _lengths(w: MainWindow) -> tuple[int, int, int]:
    run, train = w.run_form.value(), w.train_form.value()
    return run.seq, run.new_tokens, train.seq


def test_an_encoders_length_caps_do_not_carry_over_to_the_next_decoder(main_window: MainWindow) -> None:
    """BERT reads at most 512 positions and generates nothing, so opening it caps the prompt and drops the new
    tokens; the decoder opened next gets the user's lengths back (as the published format comes back, item 1),
    but not once the user has edited the capped values."""
    w = main_window
    w.run_form.set_value(w.run_form.value().model_copy(update={"seq": 4096, "new_tokens": 512}))
    w.train_form.set_value(w.train_form.value().model_copy(update={"seq": 8192}))
    w.recompute_now()
    _click_catalog(w, "google-bert/bert-base-uncased")
    assert _lengths(w) == (512, 0, 512)
    _click_catalog(w, "FacebookAI/roberta-base")  # another encoder: still capped, the user's lengths kept
    assert _lengths(w)[:2] == (512, 0)
    _click_catalog(w, QWEN)
    assert _lengths(w) == (4096, 512, 8192)
    _click_catalog(w, "google-bert/bert-base-uncased")
    w.run_form.set_value(w.run_form.value().model_copy(update={"seq": 256}))  # the user edits the cap
    _click_catalog(w, QWEN)
    assert _lengths(w) == (256, 0, 512)
