"""Issue 14: the multimodal Gemma 3n checkpoints (``gemma3n``, Gemma3nForConditionalGeneration): the text
model is ``gemma3n_text`` (tests/test_arch_gemma.py); the wrapper adds the timm MobileNetV5 vision tower, the
audio conformer and their embedders, each counted as transformers + timm build them
(tests/reference/extra/gemma3n_towers.json, validation/gemma3n_towers.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpumem_gui.core import estimate_inference, load_config_file, make_run
from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.formats.accounting import weight_bytes
from gpumem_gui.core.readers.hf_new_gemma3n import TIMM_TOWER_PARAMS
from gpumem_gui.core.spec.kv import kv_bytes_per_token_per_layer
from gpumem_gui.core.spec.params import count_params
from tests.conftest import REPO

EXTRA = REPO / "tests" / "reference" / "extra"
MEASURED = json.loads((EXTRA / "gemma3n_towers.json").read_text())
KEYS = ("google__gemma-3n-E2B-it", "google__gemma-3n-E4B-it")


def _cfg(key: str) -> dict[str, Any]:
    return json.loads((EXTRA / "configs" / f"{key}.json").read_text())


def _write(tmp_path: Path, cfg: dict[str, Any]) -> Path:
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    return p


@pytest.mark.parametrize("key", KEYS)
def test_every_part_equals_what_transformers_and_timm_build(key: str) -> None:
    spec = load_config_file(EXTRA / "configs" / f"{key}.json")
    by = MEASURED["models"][key]["by_module"]
    assert spec.vision is not None
    assert spec.vision.tower_params == by["model.vision_tower"] + by["model.audio_tower"]
    assert spec.vision.projector_params == by["model.embed_vision"] + by["model.embed_audio"]
    assert count_params(spec).total == MEASURED["models"][key]["total_params"]
    assert weight_bytes(spec, "bf16").total_bytes == 2 * count_params(spec).total


def test_the_timm_table_is_what_timm_builds() -> None:
    assert MEASURED["timm_towers"] == TIMM_TOWER_PARAMS


def test_the_text_model_and_its_cache_are_the_text_configs() -> None:
    """Gemma3nForConditionalGeneration's language model is the gemma3n_text model of its text_config: the
    same KV per layer (the last ten layers share, no cache) and the same text parameters."""
    wrapped = load_config_file(EXTRA / "configs" / "google__gemma-3n-E2B-it.json")
    text = load_config_file(EXTRA / "configs" / "google__gemma-3n-E2B-text.json")
    assert kv_bytes_per_token_per_layer(wrapped) == kv_bytes_per_token_per_layer(text)
    assert wrapped.vision is not None
    assert count_params(wrapped).total - wrapped.vision.params == count_params(text).total
    run = make_run(batch=1, seq=512)
    est_w, est_t = estimate_inference(wrapped, run), estimate_inference(text, run)
    assert est_w.kv_cache_bytes == est_t.kv_cache_bytes
    assert est_w.peak_bytes - est_t.peak_bytes == 2 * wrapped.vision.params  # the towers' bf16 weights


def test_a_file_without_towers_gets_the_class_defaults(tmp_path: Path) -> None:
    cfg = _cfg("google__gemma-3n-E2B-it")
    del cfg["vision_config"], cfg["audio_config"]
    spec = load_config_file(_write(tmp_path, cfg))
    ref = load_config_file(EXTRA / "configs" / "google__gemma-3n-E2B-it.json")
    assert count_params(spec).total == count_params(ref).total


@pytest.mark.parametrize(
    ("section", "field", "value"),
    [
        ("vision_config", "architecture", "resnet50"),
        ("audio_config", "sscp_conv_kernel_size", [[3, 3]]),
        ("audio_config", "sscp_conv_kernel_size", [[3, 3], [3, 0]]),
        ("audio_config", "sscp_conv_channel_size", [128]),
        ("audio_config", "conf_num_attention_heads", 7),
        ("audio_config", "hidden_size", 0),
        (None, "vision_config", "mobilenet"),
        (None, "text_config", [1, 2]),
    ],
)
def test_bad_values_name_the_field(tmp_path: Path, section: str | None, field: str, value: object) -> None:
    cfg = _cfg("google__gemma-3n-E2B-it")
    if section is None:
        cfg[field] = value
    else:
        cfg[section] = {**cfg[section], field: value}
    with pytest.raises(GpumemInputError) as e:
        load_config_file(_write(tmp_path, cfg))
    msg = str(e.value)
    assert field in msg and "\n" not in msg


def test_no_frequency_bins_left_names_the_field(tmp_path: Path) -> None:
    cfg = _cfg("google__gemma-3n-E2B-it")
    cfg["audio_config"] = {
        **cfg["audio_config"],
        "input_feat_size": 2,
        "sscp_conv_kernel_size": [[3, 5], [3, 5]],
    }
    with pytest.raises(GpumemInputError, match="input_feat_size"):
        load_config_file(_write(tmp_path, cfg))
