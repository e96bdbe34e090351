"""Images in a training step: the frozen vision tower's activations and the image tokens, against the trace.

``tests/reference/vision/training_points.json`` holds training steps with images traced by
``tests/reference/vision/make_points.py --mode train`` (the real transformers model under FakeTensorMode fed
the processor's tensors, the vision tower and projector frozen as LLaMA-Factory's ``freeze_vision_tower``
leaves them, ``gpumem_trace_worker/training.py``; LoRA with the tower left out of the targets,
``lora_vision_tower excluded``). Each phase must match within 3 % (training tolerance), except the optimizer
phase of LoRA with activation checkpointing (:func:`_gap`). LoRA reaching the tower:
tests/test_vision_lora.py.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from gpumem_gui.core import (
    GpumemInputError,
    ModelSpec,
    estimate_training,
    load_config_file,
    make_training_run,
)
from gpumem_gui.core.reference_points import TRACED_TRAINING_TOLERANCE
from gpumem_gui.core.replay.vision import image_tokens
from tests.conftest import REPO

HERE = REPO / "tests" / "reference" / "vision"
POINTS = json.loads((HERE / "training_points.json").read_text())["points"]


@cache
def _spec(key: str) -> ModelSpec:
    return load_config_file(Path(HERE / "configs" / f"{key}.json"))


def _gap(point: dict) -> bool:
    """LoRA with checkpointing: the frozen tower hooked by enable_input_require_grads runs under autograd
    (replay/vision_train_lora.py: forward and backward within 0.9 %, -15 % before); the optimizer phase is
    -10.9 % on gemma3-vision-tiny, as it was before (something of the step, the size of the prompt's
    embeddings, is still alive in the trace's optimizer phase; not the step's peak)."""
    return point["run"]["method"] != "full" and bool(point["run"].get("grad_ckpt"))


@pytest.mark.parametrize("point", POINTS, ids=[f"{p['model']}-{p['run']}" for p in POINTS])
def test_training_step_with_images_matches_the_trace(point: dict) -> None:
    spec, r = _spec(point["model"]), point["run"]
    assert image_tokens(spec, r["images"], r["image_size"]) == point["image_tokens"]
    est = estimate_training(spec, make_training_run(**r))
    errs = {ph: (est.phases[ph].peak_bytes - v["Total"]) / v["Total"] for ph, v in point["phases"].items()}
    if _gap(point):
        assert any("enable_input_require_grads" in w for w in est.warnings)
        assert errs["optimizer"] < -TRACED_TRAINING_TOLERANCE  # the known gap, outside the peak phase
        errs = {ph: e for ph, e in errs.items() if ph != "optimizer"}
        assert est.peak_bytes == pytest.approx(max(v["Total"] for v in point["phases"].values()), rel=0.01)
    assert all(abs(e) < TRACED_TRAINING_TOLERANCE for e in errs.values()), errs
    assert not any("images" in w for w in est.warnings)


def test_every_replayed_tower_is_traced_in_training() -> None:
    models = {p["model"] for p in POINTS}
    assert models == {
        "gemma3-vision-tiny",
        "llama4-vision-tiny",
        "qwen2_5_vl-vision-tiny",
        "qwen3_vl-vision-tiny",
        "qwen3_vl_moe-vision-tiny",  # the tower trained only (the MoE text model with deepstack)
        "mistral3-vision-tiny",
    }
    assert any(p["run"]["method"] == "lora" and not _gap(p) for p in POINTS)


def test_images_add_to_a_training_step() -> None:
    """Two images: 136 more tokens through the language model and the frozen tower's pixels through the
    step; more memory than the text-only step of the same text."""
    spec = _spec("gemma3-vision-tiny")
    text = estimate_training(spec, make_training_run(seq=64))
    images = estimate_training(spec, make_training_run(seq=64, images=2))
    assert images.peak_bytes > text.peak_bytes
    assert not images.warnings


def test_images_on_a_model_without_a_replayed_tower_are_said_so() -> None:
    spec = load_config_file(
        REPO / "tests" / "reference" / "extra" / "configs" / "synthetic__llama4-tiny.json"
    )
    assert (
        spec.vision is not None and spec.vision.tower is None
    )  # 56-px tiles: the adapter's width mismatches
    est = estimate_training(spec, make_training_run(seq=64, images=1))
    assert any("not counted" in w for w in est.warnings)


@pytest.mark.parametrize(("fields", "field"), [({"images": -1}, "images"), ({"image_size": 0}, "image_size")])
def test_bad_training_image_fields_are_one_line_errors(fields: dict, field: str) -> None:
    with pytest.raises(GpumemInputError) as e:
        make_training_run(**fields)
    assert e.value.field == field or field in str(e.value)
    assert "\n" not in str(e.value)


def test_worker_refuses_images_with_data_parallelism() -> None:
    worker = pytest.importorskip("gpumem_gui.trace.gpumem_trace_worker.training")
    from gpumem_gui.trace.gpumem_trace_worker.building import TraceError

    with pytest.raises(TraceError) as e:
        worker.trace_training({}, {"dp": 2, "images": 1})
    assert e.value.field == "images"


def test_gpumem_trace_of_a_training_step_with_images() -> None:
    """``gpumem trace --mode train --images 2``: the product passes the run's images to the worker, which runs
    the whole model on them; the estimate beside it within the training tolerance."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from gpumem_gui.core import load_model
    from gpumem_gui.trace import trace

    model = load_model(str(HERE / "configs" / "gemma3-vision-tiny.json"))
    rep = trace(model, make_training_run(seq=64, images=2, image_size=224), use_cache=False)
    assert any(n.startswith("images: the whole model") for n in rep.result.notes)
    assert rep.peak.estimated_bytes == pytest.approx(rep.peak.traced_bytes, rel=TRACED_TRAINING_TOLERANCE)


# --- a trainable vision tower (train_vision_tower; replay/vision_train.py) -------------------------------
TOWER = [p for p in POINTS if p["run"].get("train_vision_tower")]


def test_trainable_tower_points_are_traced() -> None:
    """gemma3-vision-tiny (SigLIP), qwen2_5_vl-vision-tiny, qwen3_vl-vision-tiny (deepstack mergers),
    mistral3-vision-tiny (Pixtral, its block mask) and llama4-vision-tiny (tiles, the pixel-shuffle adapter)
    with their towers trained: full fine-tuning, with
    checkpointing, in bf16 (each within the tolerance in test_training_step_with_images_matches_the_trace);
    the frozen tower's estimate of the same step is far below the trace (the tower's gradients, optimizer
    states and saved activations)."""
    models = ("gemma3-vision-tiny", "qwen2_5_vl-vision-tiny", "qwen3_vl-vision-tiny", "mistral3-vision-tiny")
    for model in (*models, "llama4-vision-tiny"):
        steps = [p["run"] for p in TOWER if p["model"] == model]
        assert len(steps) >= 4 and any(r.get("grad_ckpt") for r in steps)
        assert any(r.get("precision") == "bf16" for r in steps)
    for p in TOWER:
        r = p["run"]
        frozen = estimate_training(_spec(p["model"]), make_training_run(**{**r, "train_vision_tower": False}))
        traced = max(v["Total"] for v in p["phases"].values())
        assert frozen.peak_bytes < traced * (1 - 3 * TRACED_TRAINING_TOLERANCE)
        assert p["trainable_params"] > _spec(p["model"]).vision.params


def test_trainable_tower_adds_its_states_on_a_real_size_gemma3() -> None:
    """gemma-3-4b-it (a 417M-parameter tower and projector): training it adds at least its fp32 gradients
    and two AdamW states (12 bytes a parameter) to the optimizer phase."""
    spec = load_config_file(REPO / "tests" / "reference" / "configs" / "google__gemma-3-4b-it.json")
    run = {"seq": 512, "images": 1, "grad_ckpt": True}
    frozen = estimate_training(spec, make_training_run(**run))
    trained = estimate_training(spec, make_training_run(**run, train_vision_tower=True))
    grown = trained.phases["optimizer"].peak_bytes - frozen.phases["optimizer"].peak_bytes
    assert grown >= 12 * spec.vision.params


@pytest.mark.parametrize(
    ("config", "fields"),
    [
        ("gemma3-vision-tiny", {"method": "lora"}),  # LoRA reaches the tower by lora_vision_tower instead
        ("qwen3_vl-vision-tiny", {"method": "lora"}),
        ("mistral3-vision-tiny", {"method": "lora"}),
        ("llama4-vision-tiny", {"method": "lora"}),
    ],
)
def test_trainable_tower_refusals_are_one_line(config: str, fields: dict) -> None:
    with pytest.raises(GpumemInputError) as e:
        estimate_training(_spec(config), make_training_run(images=1, train_vision_tower=True, **fields))
    assert e.value.field == "train_vision_tower" and "\n" not in str(e.value)


def test_train_vision_tower_flag_on_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    """The flag is generated from the run field's declaration (training/run_options.py)."""
    from gpumem_gui.cli import main

    config = str(HERE / "configs" / "gemma3-vision-tiny.json")
    args = ["estimate", config, "--mode", "train", "--seq", "64", "--images", "2", "--json"]
    assert main(args) == 0
    frozen = json.loads(capsys.readouterr().out)
    assert main([*args, "--train-vision-tower"]) == 0
    trained = json.loads(capsys.readouterr().out)
    assert trained["run"]["train_vision_tower"] is True
    assert trained["peak_bytes"] > frozen["peak_bytes"]
    assert main([*args, "--train-vision-tower", "--method", "lora"]) == 2
    assert "train_vision_tower" in capsys.readouterr().err


def test_llama_factory_freeze_vision_tower_false(tmp_path: Path) -> None:
    """LLaMA-Factory's FinetuningArguments.freeze_vision_tower: false trains the tower in a full fine-tune
    (train_vision_tower), and with LoRA puts adapters on the tower's linears (lora_vision_tower tower)."""
    from gpumem_gui.core import import_file

    base = "model_name_or_path: google/gemma-3-4b-it\nstage: sft\ncutoff_len: 1024\n"
    p = tmp_path / "full.yaml"
    p.write_text(base + "finetuning_type: full\nfreeze_vision_tower: false\n")
    assert import_file(str(p)).run.train_vision_tower is True
    p.write_text(base + "finetuning_type: lora\nfreeze_vision_tower: false\n")
    imp = import_file(str(p))
    assert imp.run.train_vision_tower is False and imp.run.lora_vision_tower == "tower"
    assert not any("not modelled" in w for w in imp.warnings)
    p.write_text(base + "finetuning_type: full\nfreeze_vision_tower: true\n")
    imp = import_file(str(p))
    assert imp.run.train_vision_tower is False and not any("freeze_vision_tower" in w for w in imp.warnings)


def test_train_vision_tower_without_images_is_noted() -> None:
    """A text-only step gives the tower no gradient: the field changes nothing and says so."""
    est = estimate_training(_spec("gemma3-vision-tiny"), make_training_run(seq=64, train_vision_tower=True))
    text = estimate_training(_spec("gemma3-vision-tiny"), make_training_run(seq=64))
    assert est.peak_bytes == text.peak_bytes
    assert any(w.startswith("train_vision_tower") and w.endswith("ignored") for w in est.warnings)


def test_a_frozen_tower_gets_no_state_room_in_deepspeed() -> None:
    """Images with the tower frozen (requires_grad off, as LLaMA-Factory and the trace worker leave it):
    DeepSpeed's flat partitions hold no optimizer state for it, while a text-only step (the tower trainable
    but without a gradient) keeps them (flat buffers cover every parameter that requires grad)."""
    spec = load_config_file(REPO / "tests" / "reference" / "configs" / "google__gemma-3-4b-it.json")
    ds = {"seq": 512, "grad_ckpt": True, "framework": "deepspeed", "zero": 2, "dp": 8}

    def states(**fields: object) -> int:
        est = estimate_training(spec, make_training_run(**ds, **fields))
        return next(c.bytes for c in est.phases["optimizer"].components if c.key == "optimizer_states")

    text, frozen, trained = states(), states(images=1), states(images=1, train_vision_tower=True)
    assert text - frozen >= 8 * spec.vision.params // 8  # AdamW's two fp32 states, 1/8 of them a rank
    assert trained == text


@pytest.mark.parametrize(
    "config",
    [
        "gemma3-vision-tiny",
        "qwen2_5_vl-vision-tiny",
        "qwen3_vl-vision-tiny",
        "mistral3-vision-tiny",
        "llama4-vision-tiny",
    ],
)
def test_trainable_tower_tensors_add_up_to_the_read_tower(config: str) -> None:
    """The replayed trainable tower's tensors (Qwen3-VL: the learned position table and every deepstack
    merger included; Mistral 3: the projector's biases as multimodal_projector_bias says) are exactly the
    parameters the reader counts for the tower and projector."""
    from math import prod

    from gpumem_gui.core.replay.vision_train import tower_tensors

    spec = _spec(config)
    assert sum(prod(shape) for _, shape in tower_tensors(spec)) == spec.vision.params


def test_mistral3_projector_biases_follow_the_config(tmp_path: Path) -> None:
    """multimodal_projector_bias: true gives linear_1 and linear_2 their biases in the trainable tensors (the
    tiny config has none), still equal to the reader's count."""
    from math import prod

    from gpumem_gui.core.replay.vision_train import tower_tensors

    cfg = json.loads((HERE / "configs" / "mistral3-vision-tiny.json").read_text())
    p = tmp_path / "mistral3-biased.json"
    p.write_text(json.dumps({**cfg, "multimodal_projector_bias": True}))
    spec = load_config_file(p)
    names = {name for name, _ in tower_tensors(spec)}
    assert {"multi_modal_projector.linear_1.bias", "multi_modal_projector.linear_2.bias"} <= names
    assert sum(prod(shape) for _, shape in tower_tensors(spec)) == spec.vision.params


def test_llama4_scout_tower_tensors_add_up_and_train() -> None:
    """Llama-4-Scout's published config: the trainable tower's tensors (the unfold patch linear, class and
    position embeddings, 34 layers, the pixel-shuffle adapter, the projector) are exactly the parameters the
    reader counts; training it adds at least its fp32 gradients and two AdamW states."""
    from math import prod

    from gpumem_gui.core import load_model
    from gpumem_gui.core.replay.vision_train import tower_tensors

    spec = load_model("meta-llama/Llama-4-Scout-17B-16E-Instruct").spec
    assert sum(prod(shape) for _, shape in tower_tensors(spec)) == spec.vision.params == 871_932_416
    run = {"seq": 512, "images": 1, "grad_ckpt": True}
    frozen = estimate_training(spec, make_training_run(**run))
    trained = estimate_training(spec, make_training_run(**run, train_vision_tower=True))
    grown = trained.phases["optimizer"].peak_bytes - frozen.phases["optimizer"].peak_bytes
    assert grown >= 12 * spec.vision.params
