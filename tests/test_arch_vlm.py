"""Group vlm of issue 14 (Qwen2.5-VL, Qwen3-VL and its MoE): what the reader takes from a config (flat Hub
files and ``text_config``-wrapped transformers-5 saves alike), the vision tower counted into VisionSpec, the
traits the replay reads, one-line errors naming the field for bad values, and the whole-model trace."""

from __future__ import annotations

import copy
import json
import os

import pytest

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.readers.hf_config import spec_from_config
from gpumem_gui.core.spec.params import count_params
from tests.conftest import REPO

CONFIGS = REPO / "tests" / "reference" / "extra" / "configs"
QWEN2_5_VL = json.loads((CONFIGS / "Qwen__Qwen2.5-VL-7B-Instruct.json").read_text())
_TEXT_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
    "max_position_embeddings",
    "use_sliding_window",
    "sliding_window",
    "max_window_layers",
)


def test_qwen2_5_vl_flat_and_wrapped_files_read_alike() -> None:
    flat = spec_from_config(QWEN2_5_VL, name="q")
    wrapped = {k: v for k, v in QWEN2_5_VL.items() if k not in _TEXT_KEYS}
    wrapped["text_config"] = {k: QWEN2_5_VL[k] for k in _TEXT_KEYS}
    assert spec_from_config(wrapped, name="q") == flat
    assert flat.traits.rotary_mrope and flat.qkv_bias and not flat.o_bias
    # groundtruth_extra.json: Qwen2_5_VLForConditionalGeneration, 676,550,144 outside language_model
    assert flat.vision is not None and flat.vision.params == 676_550_144
    assert count_params(flat).total == 8_292_166_656
    assert flat.vision.image_tokens == 12845056 // (28 * 28)


def test_qwen2_5_vl_head_dim_is_hidden_over_heads() -> None:
    cfg = {**QWEN2_5_VL, "head_dim": 256}  # Qwen2_5_VLAttention ignores it
    assert spec_from_config(cfg, name="q").head_dim == 3584 // 28


def test_qwen2_5_vl_tie_from_text_config() -> None:
    cfg = copy.deepcopy(QWEN2_5_VL)
    cfg["text_config"] = {"tie_word_embeddings": True, **{k: cfg.pop(k) for k in _TEXT_KEYS}}
    assert spec_from_config(cfg, name="q").tie_word_embeddings


def test_qwen2_5_vl_tower_scales_with_depth() -> None:
    cfg = copy.deepcopy(QWEN2_5_VL)
    cfg["vision_config"]["depth"] = 31
    one = spec_from_config(QWEN2_5_VL, name="q").vision
    fewer = spec_from_config(cfg, name="q").vision
    h, inter = 1280, 3420
    assert one.tower_params - fewer.tower_params == 2 * h + 4 * h * h + 4 * h + 3 * h * inter + 2 * inter + h


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        ((), ("num_attention_heads", 27), "num_attention_heads"),
        (("vision_config",), ("depth", "x"), "depth"),
        (("vision_config",), ("spatial_merge_size", 0), "spatial_merge_size"),
        ((), ("vision_config", [1]), "vision_config"),
        ((), ("text_config", 3), "text_config"),
        ((), ("tie_word_embeddings", "no"), "tie_word_embeddings"),
    ],
)
def test_qwen2_5_vl_bad_values_name_the_field(path: tuple, value: tuple, field: str) -> None:
    cfg = copy.deepcopy(QWEN2_5_VL)
    target = cfg
    for k in path:
        target = target[k]
    target[value[0]] = value[1]
    with pytest.raises(GpumemInputError) as e:
        spec_from_config(cfg, name="q")
    assert field in str(e.value) and "\n" not in str(e.value)


QWEN3_VL = json.loads((CONFIGS / "Qwen__Qwen3-VL-8B-Instruct.json").read_text())
QWEN3_VL_MOE = json.loads((CONFIGS / "Qwen__Qwen3-VL-30B-A3B-Instruct.json").read_text())


def test_qwen3_vl_text_model_and_tower() -> None:
    spec = spec_from_config(QWEN3_VL, name="q")
    assert spec.traits.rotary_mrope and spec.qk_norm == "per_head" and spec.moe is None
    # groundtruth_extra.json: 8,767,123,696 in all, 8,190,735,360 in language_model + lm_head
    assert count_params(spec).total == 8_767_123_696
    assert spec.vision is not None and spec.vision.params == 8_767_123_696 - 8_190_735_360
    assert spec.vision.position_embedding_params == 2304 * 1152  # Qwen3VLVisionModel.pos_embed
    assert spec.vision.image_tokens == 16777216 // (32 * 32)


def test_qwen3_vl_deepstack_mergers_are_counted() -> None:
    cfg = copy.deepcopy(QWEN3_VL)
    cfg["vision_config"]["deepstack_visual_indexes"] = [8, 16]
    wide, out = 1152 * 4, 4096  # Qwen3VLVisionPatchMerger(use_postshuffle_norm=True): LayerNorm(h m^2)
    one = spec_from_config(QWEN3_VL, name="q").vision
    fewer = spec_from_config(cfg, name="q").vision
    assert one.projector_params - fewer.projector_params == 2 * wide + wide * wide + wide + wide * out + out
    assert one.tower_params == fewer.tower_params


def test_qwen3_vl_without_text_config_takes_the_class_defaults() -> None:
    cfg = {k: v for k, v in QWEN3_VL.items() if k != "text_config"}
    cfg["hidden_size"] = 64  # Qwen3VLConfig does not read top-level text keys
    spec = spec_from_config(cfg, name="q")
    assert (spec.hidden_size, spec.num_layers, spec.num_kv_heads) == (4096, 32, 32)


def test_qwen3_vl_moe_layers() -> None:
    spec = spec_from_config(QWEN3_VL_MOE, name="q")
    assert spec.moe is not None and spec.moe.num_experts == 128 and spec.moe.experts_per_token == 8
    assert spec.traits.router_renormalize  # Qwen3VLMoeTextTopKRouter always renormalises
    cfg = copy.deepcopy(QWEN3_VL_MOE)
    cfg["text_config"]["mlp_only_layers"] = [0, 47]
    assert spec_from_config(cfg, name="q").moe.dense_layers == (0, 47)


@pytest.mark.parametrize(
    ("where", "key", "value"),
    [
        ("vision_config", "deepstack_visual_indexes", 3),
        ("vision_config", "num_position_embeddings", -1),
        ("text_config", "num_experts_per_tok", 500),
        ("text_config", "attention_bias", "yes"),
        ("text_config", "mlp_only_layers", [99]),
    ],
)
def test_qwen3_vl_bad_values_name_the_field(where: str, key: str, value: object) -> None:
    cfg = copy.deepcopy(QWEN3_VL_MOE)
    cfg[where][key] = value
    with pytest.raises(GpumemInputError) as e:
        spec_from_config(cfg, name="q")
    assert key in str(e.value) and "\n" not in str(e.value)


def test_a_model_without_a_text_causal_lm_is_traced_whole() -> None:
    """Qwen2_5_VLTextConfig has no AutoModelForCausalLM class: the trace builds the whole
    Qwen2_5_VLForConditionalGeneration (its tower loaded with it, not added again), runs it with text only,
    and a training step leaves the tower without gradient or optimizer state: the estimate agrees within
    1 %."""
    if os.environ.get("GPUMEM_REQUIRE_TRACE") != "1":  # as tests/test_trace.py
        pytest.importorskip("torch", reason="trace mode needs torch (make test installs the trace extra)")
        pytest.importorskip("transformers")
    from gpumem_gui.core import load_model, make_run, make_training_run
    from gpumem_gui.trace import trace

    model = load_model(str(CONFIGS / "synthetic__qwen2_5_vl-tiny.json"))
    assert model.params is not None
    for run in (make_run(seq=64), make_training_run(seq=64)):
        rep = trace(model, run, use_cache=False)
        assert rep.result.vision_params == model.params.vision
        assert any("whole model" in n for n in rep.result.notes)
        assert rep.peak.estimated_bytes == pytest.approx(rep.peak.traced_bytes, rel=0.01)
