"""The Training tab: the form's contract, the window in training mode, scenarios v2, exports, local
targets."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from gpumem_gui.core.fit.documents import estimate_document
from gpumem_gui.core.runtimes.inference import InferenceRun
from gpumem_gui.core.training import TrainingRun
from gpumem_gui.ui.main_window import MainWindow
from gpumem_gui.ui.scenario import ModelRef, Scenario, read_scenario, save_scenario
from gpumem_gui.ui.target_form import GpuChoice
from gpumem_gui.ui.train_form import TRAINING_PRESETS, TrainingForm

pytestmark = [pytest.mark.no_qt_log, pytest.mark.usefixtures("qt_warnings_fail")]

RUNS = [
    TrainingRun(),
    TrainingRun(
        method="lora",
        lora_rank=64,
        lora_alpha=128,
        lora_targets=("q_proj", "v_proj"),
        lora_dropout=0.05,
        dropout=0.1,
        precision="bf16",
        optimizer="adamw-fused",
        batch=4,
        seq=4096,
        grad_accum=8,
        attn="eager",
        frozen_layers=4,
        first_step=True,
    ),
    TrainingRun(method="qlora", qlora_base="nf4", optimizer="paged-adamw-8bit", grad_ckpt=True, attn="flash"),
    TrainingRun(fsdp="hybrid_shard", dp=16, gpus_per_node=4, offload="optimizer+params", tp=2, pp=2, cp=2),
    TrainingRun(zero=2, dp=4, offload="optimizer", precision="megatron-bf16", optimizer="sgd-momentum"),
    TrainingRun(fsdp="full_shard", dp=1, ep=2, cuda_context_mib=300),  # fsdp with dp 1 stays visible
    *(p.run for p in TRAINING_PRESETS),
]


@pytest.fixture
def form(qtbot) -> TrainingForm:
    f = TrainingForm()
    qtbot.addWidget(f)
    return f


@pytest.mark.parametrize("run", RUNS, ids=lambda r: f"{r.method}-{r.precision}-z{r.zero}-{r.fsdp}")
def test_training_form_round_trip(form: TrainingForm, qtbot, run: TrainingRun) -> None:
    with qtbot.assertNotEmitted(form.changed):
        form.set_value(run)
    assert form.value() == run


def test_every_training_field_has_a_tooltip(form: TrainingForm) -> None:
    for name in TrainingRun.model_fields:
        if name == "gpus":  # derived: dp x tp x pp x cp, shown as a label
            continue
        assert form.widget(name).toolTip(), name


def test_fields_show_only_when_relevant(form: TrainingForm) -> None:
    form.show()
    form.set_value(TrainingRun())
    assert not form.row_visible("lora_rank") and not form.row_visible("qlora_base")
    assert not form.row_visible("offload") and not form.row_visible("fsdp")
    assert form.row_visible("zero")
    method = form.widget("method")
    method.setCurrentIndex(method.findData("lora"))
    assert form.row_visible("lora_rank") and form.row_visible("lora_targets")
    assert not form.row_visible("qlora_base")
    method.setCurrentIndex(method.findData("qlora"))
    assert form.row_visible("qlora_base")
    form.widget("dp").setValue(4)
    assert form.row_visible("offload") and form.row_visible("fsdp")
    assert not form.row_visible("gpus_per_node")
    fsdp = form.widget("fsdp")
    fsdp.setCurrentIndex(fsdp.findData("hybrid_shard"))
    assert form.row_visible("gpus_per_node")
    assert "4" in form.world_label.text()


def test_a_bad_combination_shows_next_to_its_field(form: TrainingForm) -> None:
    form.set_value(TrainingRun(dp=2))
    offload = form.widget("offload")
    offload.setCurrentIndex(offload.findData("optimizer"))  # needs a ZeRO stage
    assert form.checked_value() is None
    assert "ZeRO" in form.error_text("offload") and "Value error" not in form.error_text("offload")
    zero = form.widget("zero")
    zero.setCurrentIndex(zero.findData(2))
    assert form.checked_value() is not None and form.error_text("offload") == ""


# ---- the window in training mode ---------------------------------------------------------------------------


def _train(w: MainWindow, run: TrainingRun, gpu: GpuChoice) -> None:
    w.train_form.set_value(run)
    w.target_form.set_value(gpu)
    w.set_mode("train")
    w.recompute_now()


def test_switching_tabs_switches_the_estimate(main_window: MainWindow) -> None:
    w = main_window
    assert w.estimate is not None and w.estimate.mode == "inference"
    w.set_mode("train")
    assert w.estimate is not None and w.estimate.mode == "train"
    assert isinstance(w.run, TrainingRun)
    assert w.results.phases.phase_names == ["forward", "backward", "optimizer"]
    assert w.results.phases.peak_index == ["forward", "backward", "optimizer"].index(w.estimate.peak_phase)
    assert w.results.sweep_over.itemText(0) == "against sequence length"
    w.flush_background(60000)  # the fit and the sweep run the caching allocator model at every point
    assert w.report is not None and w.report.estimate.mode == "train"
    assert "micro-batch" in w.results.changes.maxima.text()
    assert w.results.sweep.data and w.results.sweep.plot.titleLabel.text.endswith("sequence tokens")
    w.set_mode("infer")
    assert w.estimate.mode == "inference" and isinstance(w.run, InferenceRun)


def test_a_training_field_change_updates_the_chart_data(main_window: MainWindow, qtbot) -> None:
    w = main_window
    _train(w, TrainingRun(method="lora", grad_ckpt=False, seq=1024), GpuChoice(gpu_id="H100-SXM-80GB"))
    before = w.results.breakdown.bars.heights("activations")
    total_before = w.estimate.total_bytes
    with qtbot.waitSignal(w.estimate_updated, timeout=5000):
        w.train_form.widget("seq").setValue(4096)
    assert w.run.seq == 4096
    assert w.estimate.total_bytes > total_before
    assert w.results.breakdown.bars.heights("activations") != before
    w.flush_background(30000)


def test_a_bad_training_value_shows_inline_and_keeps_the_last_estimate(main_window: MainWindow) -> None:
    w = main_window
    _train(w, TrainingRun(method="lora"), GpuChoice(gpu_id="H100-SXM-80GB"))
    est = w.estimate
    w.train_form.widget("tp").setValue(3)  # does not divide the 32 heads (core check against the model)
    w.recompute_now()
    assert "tensor parallel" in w.train_form.error_text("tp")
    assert w.estimate is est and w.results.banner.state == "stale"
    w.train_form.widget("tp").setValue(1)
    w.recompute_now()
    assert w.estimate is not est and w.results.banner.state in ("fits", "misses")
    w.flush_background(30000)


def test_training_presets_and_ranked_changes(main_window: MainWindow) -> None:
    w = main_window
    w.set_mode("train")
    i = w.train_presets.findData("full fine-tune with ZeRO-3")
    w.train_presets.activated.emit(i)
    assert w.run.zero == 3 and w.run.dp == 8 and w.target_form.value().count == 8
    assert w.estimate.mode == "train" and w.results.banner.state == "fits"
    w.train_presets.activated.emit(w.train_presets.findData("QLoRA on one 24 GB card"))
    assert w.run.method == "qlora" and w.target_form.value().gpu_id == "RTX-4090"
    w.flush_background(30000)
    # a full fine-tune of an 8B model on one 24 GB card: ranked changes, applied with one click
    w.train_form.set_value(TrainingRun())
    w.recompute_now()
    assert w.results.banner.state == "misses"
    w.flush_background(30000)
    buttons = w.results.changes.buttons
    assert buttons and w.report is not None and w.report.changes[0].fits
    buttons[0].click()
    assert w.results.banner.state == "fits"
    w.flush_background(30000)


def test_training_command_line_and_export(main_window: MainWindow, tmp_path: Path) -> None:
    w = main_window
    run = TRAINING_PRESETS[0].run
    _train(w, run, GpuChoice(gpu_id="RTX-4090"))
    args = shlex.split(w.command_line())
    assert args[:5] == ["gpumem", "estimate", "meta-llama/Llama-3.1-8B", "--mode", "train"]
    for flag, value in (("--method", "qlora"), ("--optimizer", "paged-adamw-8bit"), ("--precision", "bf16")):
        assert args[args.index(flag) + 1] == value
    assert "--grad-ckpt" in args and "--gpu" in args
    assert "--qlora-base nf4-dq" in w.command_line()  # every field has its flag (issue 12)
    assert "paged_adamw_8bit" in w.runtime_flags_text()
    written = w.export_report(tmp_path / "train.md")
    doc = json.loads(written[2].read_text())
    assert w.report is not None
    expected = estimate_document(w.model.name, w.model.params, run, w.estimate, w.report)
    assert doc == json.loads(json.dumps(expected))
    md = written[0].read_text()
    assert "training: QLoRA r16" in md and "--mode train" in md and "micro-batch" in md


# ---- scenarios -------------------------------------------------------------------------------------------


def test_scenario_v2_round_trip_with_a_training_run(main_window: MainWindow, tmp_path: Path) -> None:
    w = main_window
    run = TrainingRun(method="lora", lora_rank=8, batch=2, seq=1024, zero=2, dp=2)
    gpu = GpuChoice(gpu_id="A100-80GB", count=2)
    _train(w, run, gpu)
    path = tmp_path / "train.json"
    assert w.save_scenario(path)
    doc = json.loads(path.read_text())
    assert doc["version"] == 2 and doc["mode"] == "train" and doc["training"]["lora_rank"] == 8
    assert read_scenario(path).training == run

    w.train_form.set_value(TrainingRun())
    w.set_mode("infer")
    assert w.open_scenario(path)
    assert w.mode == "train" and w.train_form.value() == run and w.run == run
    assert w.target_form.value() == gpu
    assert w.estimate is not None and w.estimate.mode == "train"
    w.flush_background(30000)


def test_a_version_1_file_still_loads(main_window: MainWindow, tmp_path: Path) -> None:
    w = main_window
    w.set_mode("train")
    path = tmp_path / "v1.json"
    v1 = {
        "format": "gpumem-scenario",
        "version": 1,
        "model": {"source": "Qwen/Qwen3-8B"},
        "run": InferenceRun(batch=3).model_dump(mode="json"),
        "gpu": GpuChoice(gpu_id="L40S").model_dump(mode="json"),
    }
    path.write_text(json.dumps(v1))
    sc = read_scenario(path)
    assert sc.mode == "infer" and sc.training is None and sc.version == 2
    assert w.open_scenario(path)
    assert w.mode == "infer" and w.run_form.value().batch == 3 and w.model.source == "Qwen/Qwen3-8B"
    assert w.estimate.mode == "inference"
    v1["training"] = TrainingRun().model_dump(mode="json")
    path.write_text(json.dumps(v1))
    assert not w.open_scenario(path) and "version 1" in w.last_message


def test_compare_a_training_scenario(main_window: MainWindow, tmp_path: Path) -> None:
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    ref = ModelRef(source="meta-llama/Llama-3.2-1B")
    save_scenario(a, Scenario(model=ref, mode="train", training=TrainingRun(grad_ckpt=False)))
    save_scenario(b, Scenario(model=ref, mode="train", training=TrainingRun(grad_ckpt=True)))
    dialog = main_window.compare_files(a, b)
    rows = {key: (na, nb) for key, _label, na, nb in dialog.rows}
    assert rows[""][1] < rows[""][0]
    dialog.close()


# ---- local GPUs ------------------------------------------------------------------------------------------


def test_local_target_leaves_out_changes_needing_more_gpus(main_window: MainWindow, fake_snapshots) -> None:
    w = main_window
    (snap,) = fake_snapshots("rtx4090_browser")
    w.on_snapshot(snap)
    key = next(d.key for d in snap.physical_devices if d.ok)
    # 512 tokens: at 1,024 even tp 8 misses a 24 GB card (each TP rank holds the full-vocabulary logits, and
    # the caching allocator's fragmentation on top, core/allocator)
    _train(w, TrainingRun(seq=512), GpuChoice(kind="local", device=key))
    w.flush_background(30000)
    rep = w.report
    assert rep is not None and any(c.kind == "gpus" for c in rep.changes)
    shown = w.results.changes.changes
    assert all(c.kind != "gpus" for c in shown) and len(shown) < len(rep.changes)
    assert "more GPUs than this machine has" in w.results.changes.status.text()


def test_banner_names_the_local_gpus_to_use(main_window: MainWindow, fake_snapshots) -> None:
    w = main_window
    (snap,) = fake_snapshots("8xh100_busy")
    w.on_snapshot(snap)
    w.set_mode("infer")
    w.run_form.set_value(InferenceRun(weights="bf16", seq=4096, new_tokens=256))
    w.target_form.set_value(GpuChoice(kind="local", device="0", count=8))  # 8 GPUs for an 8B model
    w.recompute_now()
    w.flush_background(60000)
    rep = w.report
    assert rep is not None and rep.local_gpus and len(rep.local_gpus) < 8
    ids = ",".join(str(i) for i in rep.local_gpus)  # devices 0..7 in order: index i is GPU i
    assert f"use local GPU{'s' if len(rep.local_gpus) > 1 else ''} {ids} with tp {rep.local_tp}" in (
        w.results.banner.detail.text()
    )
    # one GPU, already the suggested one: nothing to suggest
    w.target_form.set_value(GpuChoice(kind="local", device=str(rep.local_gpus[0]), count=1))
    w.recompute_now()
    w.flush_background(60000)
    assert "use local" not in w.results.banner.detail.text()


def test_a_framework_profile_says_which_defaults_it_applied(main_window: MainWindow) -> None:
    """The window names the defaults a framework profile applied (torchtune's loss), as information (not a
    warning), and says nothing for plain PyTorch."""
    w = main_window
    _train(w, TrainingRun(framework="torchtune", method="lora"), GpuChoice(gpu_id="A100-80GB", count=1))
    notes = w.results.notes
    assert not notes.isHidden() and "framework default (torchtune): loss" in notes.text()
    assert "framework default" not in w.results.warnings.text()
    _train(w, TrainingRun(method="lora"), GpuChoice(gpu_id="A100-80GB", count=1))
    assert notes.isHidden() and notes.text() == ""
    w.flush_background(30000)
