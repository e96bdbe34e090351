"""A text-only LoRA step of a vision-language model whose targets reach the tower (issue 29): PEFT's
``get_peft_model`` adapts the tower's linears all the same, and no image reaches them
(``replay/vision_train_lora.py`` ``unused_adapters``), against the traced text steps of
``tests/reference/vision/lora_tower_points.json`` (the step itself: ``tests/test_vision_lora.py``)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from gpumem_gui.core import ModelSpec, estimate_training, load_config_file, make_training_run
from tests.conftest import REPO

HERE = REPO / "tests" / "reference" / "vision"
POINTS = json.loads((HERE / "lora_tower_points.json").read_text())["points"]


@cache
def _spec(key: str) -> ModelSpec:
    return load_config_file(Path(HERE / "configs" / f"{key}.json"))


def test_a_text_step_counts_the_tower_adapters() -> None:
    """Text only: PEFT still builds the tower's adapters (303,104 parameters on qwen2_5_vl-vision-tiny: PEFT's
    811,008 minus the language model's 507,904), trainable but without a gradient: the estimate counts
    their fp32 parameters only (no gradient, no optimizer state) and says so; traced text steps:
    test_lora_on_the_tower_matches_the_trace."""
    spec = _spec("qwen2_5_vl-vision-tiny")
    est = estimate_training(spec, make_training_run(method="lora", seq=64))
    assert est.facts["trainable_params"] == 811_008
    assert any(
        "a text-only step" in w and "(303104 parameters)" in w and "counted" in w for w in est.warnings
    )
    out = estimate_training(spec, make_training_run(method="lora", seq=64, lora_vision_tower="excluded"))
    assert out.facts["trainable_params"] == 507_904 and not any("text-only" in w for w in out.warnings)
    for ph, phase in est.phases.items():
        assert phase.peak_bytes - out.phases[ph].peak_bytes == 303_104 * 4, ph


def test_a_text_steps_tower_adapters_get_state_only_in_flat_partitions() -> None:
    """Plain torch keeps no optimizer state for the text step's tower adapters (no gradient); DeepSpeed's
    flat partitions hold every trainable parameter's state (replay/step.py states_for_unused): fp32 master
    and both moments, 12 bytes a parameter over the 2 ranks."""
    spec, n = _spec("qwen2_5_vl-vision-tiny"), 303_104
    for extra, states in (({}, 0), ({"zero": 2, "dp": 2}, n * 12 // 2)):
        comp = {}
        for reach in ("targets", "excluded"):
            est = estimate_training(
                spec, make_training_run(method="lora", seq=64, lora_vision_tower=reach, **extra)
            )
            comp[reach] = {c.key: c.bytes for c in est.components}
        grown = comp["targets"]["optimizer_states"] - comp["excluded"]["optimizer_states"]
        assert grown == states, extra


def test_text_steps_are_traced() -> None:
    """A text-only step of every tower's model: built whole (Qwen2.5-VL, Qwen3-VL) or as its language model
    with the tower and its adapters added (Gemma 3, Mistral 3, Llama 4; gpumem_trace_worker/training.py
    _add_tower_adapters)."""
    text = {p["model"] for p in POINTS if not p["run"].get("images")}
    assert text == {
        "gemma3-vision-tiny",
        "qwen2_5_vl-vision-tiny",
        "qwen3_vl-vision-tiny",
        "mistral3-vision-tiny",
        "llama4-vision-tiny",
    }
