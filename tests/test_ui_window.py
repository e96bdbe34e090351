"""The main window, driven offscreen: live updates, inline errors, the fit changes, units, drops, settings."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDropEvent

from gpumem_gui.core import reported_for
from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.readers.loader import load_model
from gpumem_gui.core.runtimes.inference import InferenceRun
from gpumem_gui.core.units import SizeUnit
from gpumem_gui.ui.main_window import MainWindow
from gpumem_gui.ui.target_form import GpuChoice

pytestmark = [pytest.mark.no_qt_log, pytest.mark.usefixtures("qt_warnings_fail")]

GiB = 1 << 30

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 8,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def test_starts_with_the_default_model_and_draws_everything(main_window: MainWindow) -> None:
    w = main_window
    assert w.model is not None and w.model.source == "meta-llama/Llama-3.1-8B"
    est = w.estimate
    assert est is not None
    weights = est.component("weights")
    assert weights is not None
    assert w.results.breakdown.bars.heights("weights") == pytest.approx([weights.bytes / GiB])
    assert w.results.phases.phase_names == list(est.phases)
    # the components, the total, then what a GPU with room shows (reserved, nvidia-smi): plain rows
    rep = reported_for(est)
    assert rep is not None and w.results.table.rowCount() == len(est.components) + 3
    last = w.results.table.rowCount() - 1
    assert w.results.table.item(last, 1).text() == f"{rep.nvidia_smi_bytes:,}"
    assert "nvidia-smi" in w.results.table.item(last, 0).text() and w.results.table.item(last, 3).text() == ""
    assert not w.results.table.item(last, 0).flags() & Qt.ItemFlag.ItemIsSelectable
    assert len(w.results.sweep.data) >= 40
    assert w.report is not None
    assert "weights" in w.results.explain.toPlainText().lower()
    assert w.mode_tabs.tabText(1) == "Training"


def test_a_field_change_updates_the_bars_after_the_debounce(main_window: MainWindow, qtbot) -> None:
    w = main_window
    kv_before = w.results.breakdown.bars.heights("kv_cache")[0]
    with qtbot.waitSignal(w.estimate_updated, timeout=3000):
        w.run_form.widget("batch").setValue(4)
    kv_after = w.results.breakdown.bars.heights("kv_cache")[0]
    assert kv_after == pytest.approx(4 * kv_before, rel=1e-6)
    assert w.run is not None and w.run.batch == 4
    assert not w.results.changes._rows_box.isEnabled()  # the old changes are greyed out until the new ones
    w.flush_background()
    assert w.results.changes._rows_box.isEnabled() and w.report is not None and w.report.estimate.facts


def test_edits_are_debounced_into_one_estimate(main_window: MainWindow, qtbot) -> None:
    w = main_window
    seen: list[int] = []
    w.estimate_updated.connect(lambda: seen.append(1))
    for b in (2, 3, 4, 5, 6):
        w.run_form.widget("batch").setValue(b)
    qtbot.waitUntil(lambda: len(seen) == 1, timeout=3000)
    qtbot.wait(300)
    assert len(seen) == 1 and w.run is not None and w.run.batch == 6


def test_a_bad_value_shows_inline_and_keeps_the_last_estimate(main_window: MainWindow) -> None:
    w = main_window
    good = w.estimate
    heights = w.results.breakdown.bars.heights("weights")
    w.run_form.widget("tp").setValue(3)  # does not divide Llama-3.1-8B's 32 heads
    w.recompute_now()
    assert "does not divide" in w.run_form.error_text("tp")
    assert w.estimate is good
    assert w.results.breakdown.bars.heights("weights") == heights
    assert w.results.banner.state == "stale"
    w.run_form.widget("tp").setValue(1)
    w.recompute_now()
    assert w.run_form.error_text("tp") == ""
    assert w.results.banner.state in ("fits", "misses")


def test_a_cross_field_error_shows_next_to_its_field(main_window: MainWindow) -> None:
    w = main_window
    w.run_form.set_value(InferenceRun(engine="llama.cpp", weights="gguf-Q4_K_M", n_batch=512, n_ubatch=512))
    w.run_form.widget("n_ubatch").setValue(1024)
    w.recompute_now()
    assert "n_ubatch" in w.run_form.error_text("n_ubatch")
    assert w.results.banner.state == "stale"


def test_does_not_fit_offers_ranked_changes_and_apply_updates_the_form(main_window: MainWindow) -> None:
    w = main_window
    w.load_source("meta-llama/Llama-3.1-70B-Instruct")
    w.target_form.set_value(GpuChoice(gpu_id="RTX-4090"))
    w.run_form.set_value(InferenceRun(seq=8192, new_tokens=256))
    w.recompute_now()
    w.flush_background()
    assert w.results.banner.state == "misses"
    assert "misses by" in w.results.banner.title.text()
    rep = w.report
    assert rep is not None and not rep.fits and rep.changes
    assert len(w.results.changes.buttons) == len(rep.changes)
    first = rep.changes[0]
    w.results.changes.buttons[0].click()
    w.flush_background()
    run = w.run_form.value()
    for key, value in first.update.items():
        assert getattr(run, key) == value
    assert w.target_form.value().count >= run.gpus


def test_units_switch_everywhere(main_window: MainWindow) -> None:
    w = main_window
    gib = w.results.breakdown.bars.heights("weights")[0]
    w.set_unit(SizeUnit.GB)
    assert w.results.breakdown.bars.heights("weights")[0] == pytest.approx(gib * GiB / 1e9)
    assert w.results.table.horizontalHeaderItem(2).text() == "GB"
    assert " GB" in w.results.banner.title.text() or " GB" in w.results.banner.detail.text()
    assert w.unit_actions[SizeUnit.GB].isChecked()


def test_presets_fill_the_form(main_window: MainWindow) -> None:
    w = main_window
    w.target_form.set_value(GpuChoice(gpu_id="RTX-4090"))
    index = w.presets.findData("chat on one 24 GB card (llama.cpp Q4_K_M)")
    w.presets.activated.emit(index)
    run = w.run_form.value()
    assert run.engine == "llama.cpp" and run.weights == "gguf-Q4_K_M"
    assert w.estimate is not None and w.estimate.engine == "llama.cpp"
    w.presets.activated.emit(w.presets.findData("serve with vLLM"))
    assert w.run_form.value().engine == "vllm"
    assert w.target_form.value().gpu_id == "H100-SXM-80GB"


def test_drop_of_a_config_file_loads_it(main_window: MainWindow, tmp_path: Path) -> None:
    cfg = tmp_path / "tiny" / "config.json"
    cfg.parent.mkdir()
    cfg.write_text(json.dumps(TINY_LLAMA))
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(cfg))])
    event = QDropEvent(
        QPointF(10, 10),
        Qt.DropAction.CopyAction,
        mime,
        Qt.MouseButton.LeftButton,
        Qt.KeyboardModifier.NoModifier,
    )
    main_window.dropEvent(event)
    assert main_window.model is not None and main_window.model.source == str(cfg)
    assert main_window.model.source_kind == "config.json"
    assert main_window.estimate is not None and main_window.estimate.facts["params_total"] > 0
    assert main_window.model_panel.title.text() == main_window.model.name


def test_a_bad_dropped_file_shows_its_reason_and_keeps_the_model(
    main_window: MainWindow, tmp_path: Path
) -> None:
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    before = main_window.model
    main_window.open_path(bad)
    assert main_window.model is before
    assert "config.json" in main_window.model_panel.error.text()


def test_catalog_filter_and_exact_counts(main_window: MainWindow, qtbot) -> None:
    from gpumem_gui.core.readers.catalog import find_model
    from gpumem_gui.core.spec.params import count_params

    panel = main_window.model_panel
    role = Qt.ItemDataRole.UserRole
    rows = range(panel.table.rowCount())
    qtbot.waitUntil(
        lambda: all(panel.table.item(r, 4).data(role + 1) is not None for r in rows), timeout=10000
    )
    for r in rows:
        entry = find_model(panel.table.item(r, 4).data(role))
        assert panel.table.item(r, 4).data(role + 1) == count_params(entry.spec).total
    panel.filter.setText("qwen3 moe")
    ids = panel.visible_catalog_ids()
    assert ids and all("Qwen3" in i for i in ids)
    assert "Qwen/Qwen3-30B-A3B" in ids and "Qwen/Qwen3-8B" not in ids
    panel.filter.clear()
    assert len(panel.visible_catalog_ids()) == panel.table.rowCount()


def test_hub_id_loads_in_a_worker_and_shows_the_offline_error(
    qt_warnings_fail, qtbot, isolated_settings
) -> None:
    calls: list[str] = []

    def loader(source: str):
        calls.append(source)
        if source == "someorg/some-model":
            raise GpumemInputError("the Hugging Face Hub is not reachable (offline?)", source=source)
        return load_model(source)

    w = MainWindow(settings=isolated_settings, loader=loader, restore=False, dialogs=False)
    qtbot.addWidget(w)
    w.model_panel.hub.setText("someorg/some-model")
    with qtbot.waitSignal(w.model_panel.load_failed, timeout=5000):
        w.model_panel.fetch_button.click()
    assert "not reachable" in w.model_panel.error.text()
    assert w.model is not None and w.model.source == "meta-llama/Llama-3.1-8B"
    assert "someorg/some-model" in calls
    w.shutdown()


def test_command_line_round_trips_through_the_cli_parser(main_window: MainWindow) -> None:
    from gpumem_gui.cli import build_parser, run_from_args

    w = main_window
    run = InferenceRun(engine="vllm", batch=8, seq=4096, new_tokens=256, kv_dtype="fp8", tp=2)
    w.run_form.set_value(run)
    w.target_form.set_value(GpuChoice(gpu_id="H100-SXM-80GB", count=2, margin_mib=512))
    w.recompute_now()
    line = w.command_line()
    args = build_parser().parse_args(shlex.split(line)[1:])
    assert run_from_args(args, w.model) == run
    assert args.gpu == "H100-SXM-80GB:2" and args.margin_mib == 512
    flags = w.runtime_flags_text()
    # the first line names what vLLM's command cannot carry (the requests: batch, prompt, new tokens)
    note, command = flags.split("\n", 1)
    assert note.startswith("# gpumem, not in this command: batch 8")
    assert command.startswith("vllm serve meta-llama/Llama-3.1-8B")
    for part in (
        "--max-model-len",
        "--gpu-memory-utilization 0.9",
        "--kv-cache-dtype fp8",
        "--tensor-parallel-size 2",
    ):
        assert part in flags

    w.run_form.set_value(InferenceRun(engine="llama.cpp", weights="gguf-Q4_K_M", seq=8192, kv_dtype="q8_0"))
    w.recompute_now()
    # meta-llama's repository holds no GGUF file: llama.cpp has nothing to load, and the flags say so
    flags = w.runtime_flags_text()
    assert flags.startswith("# no llama.cpp command:") and "not a Hugging Face GGUF repository" in flags


def test_geometry_unit_and_last_scenario_are_remembered(qt_warnings_fail, qtbot, isolated_settings) -> None:
    w = MainWindow(settings=isolated_settings, restore=True, dialogs=False)
    qtbot.addWidget(w)
    w.load_source("Qwen/Qwen3-8B")
    run = InferenceRun(batch=3, seq=1000, new_tokens=100, weights="nf4")
    w.run_form.set_value(run)
    w.target_form.set_value(GpuChoice(gpu_id="A100-80GB", count=2))
    w.set_unit(SizeUnit.GB)
    w.resize(790, 590)  # within the offscreen screen (800 x 600), so nothing clamps it
    w.close()

    w2 = MainWindow(settings=isolated_settings, restore=True, dialogs=False)
    qtbot.addWidget(w2)
    assert w2.model is not None and w2.model.source == "Qwen/Qwen3-8B"
    assert w2.run_form.value() == run
    assert w2.target_form.value() == GpuChoice(gpu_id="A100-80GB", count=2)
    assert w2.unit is SizeUnit.GB
    assert (w2.width(), w2.height()) == (790, 590)
    w2.flush_background()


def test_a_step_recomputes_at_once_but_typing_waits_for_the_keys(main_window: MainWindow, qtbot) -> None:
    from PySide6.QtCore import Qt

    from gpumem_gui.ui.main_window import DEBOUNCE_MS, STEP_DEBOUNCE_MS

    w = main_window
    spin = w.run_form.widget("batch")
    spin.stepBy(1)  # an arrow button or key, the wheel
    assert w._debounce.isActive() and w._debounce.interval() == STEP_DEBOUNCE_MS
    qtbot.waitUntil(lambda: w.run is not None and w.run.batch == 2, timeout=3000)
    w.flush_background()
    spin.setFocus()
    spin.selectAll()
    qtbot.keyClicks(spin, "12")  # spin boxes take typed numbers on Enter (no keyboard tracking)
    assert not w._debounce.isActive()
    qtbot.keyClick(spin, Qt.Key.Key_Return)
    assert w._debounce.isActive() and w._debounce.interval() == STEP_DEBOUNCE_MS
    qtbot.waitUntil(lambda: w.run is not None and w.run.batch == 12, timeout=3000)
    w.flush_background()
    targets = w.train_form.widget("lora_targets")  # an editable list: every key changes it
    targets.setFocus()
    qtbot.keyClicks(targets, "q")
    assert w._debounce.isActive() and w._debounce.interval() == DEBOUNCE_MS
    w.run_form.widget("engine").setCurrentIndex(1)  # a pick from a list
    assert w._debounce.interval() == STEP_DEBOUNCE_MS
    w._debounce.setInterval(0)  # what benchmarks/bench_ui.py does: no wait at all, steps included
    spin.stepBy(1)
    assert w._debounce.interval() == 0


def test_the_explanation_patched_in_place_reads_as_if_set_anew(main_window: MainWindow, qtbot) -> None:
    from PySide6.QtWidgets import QTextBrowser

    from gpumem_gui.ui.report import explanation_html

    w = main_window
    fresh = QTextBrowser()
    qtbot.addWidget(fresh)
    assert w.estimate is not None
    for key in [c.key for c in w.estimate.components][:3]:
        assert w.results.table.select_key(key)
        for batch in (2, 5, 1):
            w.run_form.widget("batch").setValue(batch)
            w.recompute_now()
            est = w.estimate
            comp = est.component(key)
            assert comp is not None
            fresh.setHtml(explanation_html(comp, w.unit, est.total_bytes))
            assert w.results.explain.toHtml() == fresh.toHtml()
