"""Issue 14, group gemma: Gemma 4 (gemma4_text, gemma4) read, counted and cached as transformers 5.24 builds
it (models/gemma4/configuration_gemma4.py Gemma4TextConfig / Gemma4Config, modeling_gemma4.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpumem_gui.core import (
    estimate_inference,
    estimate_training,
    load_config_file,
    make_run,
    make_training_run,
)
from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.formats.accounting import weight_bytes
from gpumem_gui.core.spec.kv import kv_bytes_per_token_per_layer, tokens_kept_transformers
from gpumem_gui.core.spec.params import count_params, text_tensors
from tests.conftest import REPO

CONFIGS = REPO / "tests" / "reference" / "extra" / "configs"
E2B = CONFIGS / "google__gemma-4-E2B-text.json"
A4B = CONFIGS / "google__gemma-4-26B-A4B-text.json"
TINY = CONFIGS / "synthetic__gemma4-tiny.json"
MOE_TINY = CONFIGS / "synthetic__gemma4-moe-tiny.json"
VISION_TINY = CONFIGS / "synthetic__gemma4-vision-tiny.json"
CATALOG = REPO / "resources" / "configs"


def _write(tmp_path: Path, base: Path, **over: object) -> Path:
    cfg = {**json.loads(base.read_text()), **over}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    return p


def test_e2b_full_layers_have_their_own_heads_and_the_last_twenty_share() -> None:
    spec = load_config_file(E2B)
    assert spec.kv_shared_layers == tuple(range(15, 35))
    per = kv_bytes_per_token_per_layer(spec)
    # sliding: 1 KV head x 256 (K and V, bf16); full (every 5th): 1 KV head x global_head_dim 512
    assert per[:5] == (1024, 1024, 1024, 1024, 2048) and per[15:] == (0,) * 20
    assert sum(per) == 18432  # groundtruth_extra.json (transformers' DynamicCache)
    assert tokens_kept_transformers(spec, 4096)[:5] == (511, 511, 511, 511, 4096)


def test_e2b_double_wide_mlp_on_the_shared_layers_and_the_ple_table() -> None:
    spec = load_config_file(E2B)
    shapes = {t.name: t.shape for t in text_tensors(spec)}
    assert shapes["layers.14.mlp.gate_proj.weight"] == (6144, 1536)
    assert shapes["layers.15.mlp.gate_proj.weight"] == (12288, 1536)  # use_double_wide_mlp
    assert "layers.15.self_attn.k_proj.weight" not in shapes and "layers.14.self_attn.v_proj.weight" in shapes
    assert shapes["layers.4.self_attn.q_proj.weight"] == (8 * 512, 1536)  # global_head_dim
    assert shapes["embed_tokens_per_layer.weight"] == (262_144, 35 * 256)
    assert count_params(spec).total == 4_628_569_344  # transformers on the meta device


def test_26b_a4b_k_eq_v_and_the_moe_block() -> None:
    spec = load_config_file(A4B)
    names = {t.name for t in text_tensors(spec)}
    assert "layers.5.self_attn.v_proj.weight" not in names  # full layer, attention_k_eq_v
    assert "layers.4.self_attn.v_proj.weight" in names
    assert "layers.0.mlp.gate_proj.weight" in names and "layers.0.experts.gate_up_proj" in names
    c = count_params(spec)
    assert c.total == 25_233_141_760 and c.active_per_token == 3_822_530_560  # the card: 25.2B, 3.8B active
    # full layers: 2 global KV heads x 512, K and V both cached (values are the normed k projection)
    assert kv_bytes_per_token_per_layer(spec)[4:6] == (2 * 8 * 256 * 2, 2 * 2 * 512 * 2)


@pytest.mark.parametrize(
    ("name", "total", "towers"),
    [
        ("google__gemma-4-E2B-it", 5_104_297_504, 475_728_160),
        ("google__gemma-4-31B-it", 31_273_086_512, 575_741_232),
    ],
)
def test_multimodal_checkpoints_count_the_towers(name: str, total: int, towers: int) -> None:
    """Gemma4ForConditionalGeneration on the meta device: the vision (and audio) towers and embedders."""
    c = count_params(load_config_file(CATALOG / f"{name}.json"))
    assert (c.total, c.vision) == (total, towers)


def test_tiny_wrapper_counts_vision_and_audio() -> None:
    c = count_params(load_config_file(VISION_TINY))
    assert (c.total, c.vision) == (8_581_928, 370_696)


@pytest.mark.parametrize("config", [TINY, MOE_TINY])
def test_format_layout_counts_every_tensor(config: Path) -> None:
    spec = load_config_file(config)
    assert weight_bytes(spec, "bf16").total_bytes == 2 * count_params(spec).total


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"num_kv_shared_layers": 8}, "num_kv_shared_layers"),
        ({"num_global_key_value_heads": 3}, "num_global_key_value_heads"),
        ({"global_head_dim": "wide"}, "global_head_dim"),
        ({"attention_bias": True}, "attention_bias"),
        ({"use_bidirectional_attention": "all"}, "use_bidirectional_attention"),
        ({"per_layer_config": {"0": {"head_dim": 128}}}, "per_layer_config"),
    ],
)
def test_bad_values_name_the_field(tmp_path: Path, over: dict, field: str) -> None:
    with pytest.raises(GpumemInputError) as e:
        load_config_file(_write(tmp_path, TINY, **over))
    assert e.value.field == field and "\n" not in str(e.value)


def test_bad_tower_value_names_the_field(tmp_path: Path) -> None:
    cfg = json.loads(VISION_TINY.read_text())
    cfg["audio_config"]["subsampling_conv_channels"] = [32]
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    with pytest.raises(GpumemInputError) as e:
        load_config_file(p)
    assert e.value.field == "subsampling_conv_channels"


def test_estimates_run_on_transformers_and_the_rest_is_refused_in_one_line() -> None:
    spec = load_config_file(TINY)
    assert estimate_inference(spec, make_run(batch=1, seq=512)).kv_cache_bytes > 0
    assert estimate_training(spec, make_training_run(batch=1, seq=256)).total_bytes > 0
    for run, field in (
        (make_run(batch=1, seq=512, engine="vllm"), "engine"),
        (make_run(batch=1, seq=512, tp=2), "tp"),
    ):
        with pytest.raises(GpumemInputError) as e:
            estimate_inference(spec, run)
        assert e.value.field == field and "\n" not in str(e.value)
    with pytest.raises(GpumemInputError) as e:
        estimate_training(spec, make_training_run(batch=1, seq=256, pp=2))
    assert e.value.field == "pp"


def test_the_window_opens_each_gemma4_checkpoint(main_window) -> None:  # type: ignore[no-untyped-def]
    panel = main_window.model_panel
    ids = [i for i in panel.visible_catalog_ids() if i.startswith("google/gemma-4-")]
    assert len(ids) == 4
    for model_id in ids:
        panel.load_source(model_id)
        main_window.flush_background()
        assert main_window.model is not None and main_window.model.source == model_id
        total = count_params(main_window.model.spec).total
        assert main_window.estimate is not None and main_window.estimate.facts["params_total"] == total
