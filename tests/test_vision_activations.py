"""A prompt's images: the vision tower's activations and the image tokens, against the trace.

``tests/reference/vision/points.json`` holds prefills (and decodes) with images traced by
``tests/reference/vision/make_points.py`` (the real transformers model under FakeTensorMode with the
processor's ``pixel_values`` and grid, ``gpumem_trace_worker/vision.py``). The Qwen2.5-VL and Qwen3-VL towers
, Mistral 3's Pixtral tower, Gemma 3's SigLIP tower and Llama 4's tiled tower are replayed
(``gpumem_gui/core/replay/vision.py``, ``vision_pixtral.py``, ``vision_siglip.py``, ``vision_llama4.py``) and
must match within 1 %.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from gpumem_gui.core import (
    GpumemInputError,
    ModelSpec,
    estimate_inference,
    load_config_file,
    make_run,
    spec_from_config,
)
from gpumem_gui.core.reference_points import TRACED_INFERENCE_TOLERANCE
from gpumem_gui.core.replay.config import ReplayConfig
from gpumem_gui.core.replay.forward import replay_forward, replay_forward_direct
from gpumem_gui.core.replay.vision import has_tower, image_tokens
from gpumem_gui.core.spec.vision import canvas_tiles, image_grid, window_chunks
from tests.conftest import REPO

HERE = REPO / "tests" / "reference" / "vision"
POINTS = json.loads((HERE / "points.json").read_text())["points"]


@cache
def _spec(key: str) -> ModelSpec:
    return load_config_file(Path(HERE / "configs" / f"{key}.json"))


def _run(point: dict) -> object:
    r = point["run"]
    return make_run(
        batch=r["batch"],
        seq=r["seq"],
        new_tokens=r.get("new_tokens", 0),
        attn=r.get("attn", "sdpa"),
        logits=r.get("logits", "last"),
        images=r["images"],
        image_size=r["image_size"],
    )


REPLAYED = [p for p in POINTS if has_tower(_spec(p["model"]))]


@pytest.mark.parametrize("point", REPLAYED, ids=[f"{p['model']}-{p['run']}" for p in REPLAYED])
def test_prefill_and_decode_with_images_match_the_trace(point: dict) -> None:
    """The peaks within 1 % (inference tolerance), the image tokens and the KV cache exactly."""
    spec, run = _spec(point["model"]), _run(point)
    r = point["run"]
    assert image_tokens(spec, r["images"], r["image_size"]) == point["image_tokens"]
    est = estimate_inference(spec, run)
    for phase in ("prefill", "decode"):
        if phase in point["phases"]:
            meas = point["phases"][phase]["Total"]
            err = (est.phases[phase].peak_bytes - meas) / meas
            assert abs(err) < TRACED_INFERENCE_TOLERANCE, f"{phase}: {err:+.3%}"
    assert est.kv_cache_bytes == point["kv_cache_bytes"]
    assert not est.warnings


def test_every_replayed_tower_is_traced() -> None:
    models = {p["model"] for p in REPLAYED}
    assert models == {p["model"] for p in POINTS}
    assert {
        "qwen2_5_vl-vision-tiny",
        "qwen3_vl-vision-tiny",
        "mistral3-vision-tiny",
        "gemma3-vision-tiny",
        "llama4-vision-tiny",
    } <= models
    # the vision tower's stretch is the peak of some points, the text forward's of others
    wheres = {estimate_inference(_spec(p["model"]), _run(p)).phases["prefill"].note for p in REPLAYED}
    assert any("vision" in w for w in wheres) and any("vision" not in w for w in wheres)


def test_the_tape_equals_the_replay_with_images() -> None:
    spec = _spec("qwen2_5_vl-vision-tiny")
    q = 40 + image_tokens(spec, 2, 448)
    for batch in (1, 3):
        cfg = ReplayConfig(batch=batch, q=q, param_dt="bf16", images=2, image_size=448, weights_counted=False)
        assert replay_forward(spec, cfg) == replay_forward_direct(spec, cfg)


def test_a_tower_that_is_not_replayed_is_said_so() -> None:
    """Mistral 3 with several vision feature layers (concatenated): no tower replay, the images are reported
    as not counted."""
    cfg = json.loads((HERE / "configs" / "mistral3-vision-tiny.json").read_text())
    cfg["vision_feature_layer"] = [-1, -2]
    spec = spec_from_config(cfg, name="mistral3-two-feature-layers", source="test")
    assert not has_tower(spec)
    est = estimate_inference(spec, make_run(images=1, image_size=224))
    assert any("images" in w and "not counted" in w for w in est.warnings)


def test_window_and_grid_arithmetic() -> None:
    """Qwen2.5-VL-7B's tower: 448 px -> 32 x 32 patches, 256 image tokens (+ start/end), windows of 8 x 8
    patches (window_size 112 px / 14), the last one full; 700 px -> 50 patches a side, 4 x 4 windows whose
    last has 1 x 1 merged patches."""
    spec = load_config_file(
        REPO / "tests" / "reference" / "extra" / "configs" / "Qwen__Qwen2.5-VL-7B-Instruct.json"
    )
    tower = spec.vision.tower
    g = image_grid(tower, 448)
    assert (g.grid, g.patches, g.features, g.tokens) == (32, 1024, 256, 258)
    assert window_chunks(tower, 32) == (64, 16)
    assert image_grid(tower, 700).grid == 50
    assert window_chunks(tower, 50) == (4, 49)


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"images": -1}, "images"),
        ({"images": 1, "image_size": 0}, "image_size"),
        ({"images": 1, "image_size": 20000}, "image_size"),
    ],
)
def test_bad_image_fields_are_one_line_errors(fields: dict, field: str) -> None:
    with pytest.raises(GpumemInputError) as e:
        make_run(**fields)
    assert e.value.field == field or field in str(e.value)
    assert "\n" not in str(e.value)


def test_image_size_out_of_the_models_range() -> None:
    spec = _spec("qwen2_5_vl-vision-tiny")
    for size in (27, 3585):  # below one merged patch (28 px), above max_pixels (3584^2)
        with pytest.raises(GpumemInputError) as e:
            estimate_inference(spec, make_run(images=1, image_size=size))
        assert e.value.field == "image_size" and "\n" not in str(e.value)


def test_eager_attention_with_images_is_refused() -> None:
    with pytest.raises(GpumemInputError) as e:
        estimate_inference(_spec("qwen3_vl-vision-tiny"), make_run(images=1, image_size=224, attn="eager"))
    assert e.value.field == "attn"


def test_worker_rejects_a_negative_image_count() -> None:
    worker = pytest.importorskip("gpumem_gui.trace.gpumem_trace_worker.vision")
    from gpumem_gui.trace.gpumem_trace_worker.building import TraceError

    cfg = type("Cfg", (), {"vision_config": None})()
    with pytest.raises(TraceError) as e:
        worker.image_request(cfg, {"images": -2})
    assert e.value.field == "images"


def test_gemma3_resizes_every_image_to_its_towers_side() -> None:
    """Gemma 3 4B: SigLIP at 896 px (64 x 64 patches of 14 px) pooled 4 x 4 into mm_tokens_per_image = 256
    features, each image between "\\n\\n<start_of_image>" and "<end_of_image>\\n\\n" (Gemma3Processor): 260
    tokens per image whatever image_size says, and the same estimate."""
    spec = load_config_file(REPO / "tests" / "reference" / "configs" / "google__gemma-3-4b-it.json")
    tower = spec.vision.tower
    assert (tower.kind, tower.fixed_side, tower.spatial_merge_size) == ("siglip", 896, 4)
    for size in (1, 224, 896, 5000):
        g = image_grid(tower, size)
        assert (g.side, g.grid, g.patches, g.features, g.tokens) == (896, 64, 4096, 256, 260)
    assert image_tokens(spec, 3, 100) == 780
    small, large = (estimate_inference(spec, make_run(images=2, image_size=n)) for n in (224, 1792))
    assert small.peak_bytes == large.peak_bytes
    # the images count: the prefill with two images is higher than the text-only one of the same prompt
    text = estimate_inference(spec, make_run())
    assert small.phases["prefill"].peak_bytes > text.phases["prefill"].peak_bytes


def test_a_siglip_tower_whose_pooling_does_not_give_its_tokens_is_not_replayed() -> None:
    cfg = json.loads((HERE / "configs" / "gemma3-vision-tiny.json").read_text())
    cfg["mm_tokens_per_image"] = 60  # not a square: transformers' placeholder check would refuse the images
    spec = spec_from_config(cfg, name="gemma3-odd-tokens", source="test")
    assert spec.vision is not None and not has_tower(spec)


@pytest.mark.parametrize(
    ("size", "canvas", "tokens"),
    [
        # one 336-px tile: <|image_start|> <|image|> 144 patch tokens <|image_end|>
        (100, 1, 147),
        (336, 1, 147),
        # 2 x 2 tiles and the global one: 5 x 144 patch tokens, 4 separators, 3 markers
        (337, 2, 5 * 144 + 4 + 3),
        (1000, 3, 10 * 144 + 9 + 3),
        # larger than 4 x 4 tiles (max_patches 16): downscaled onto 4 x 4
        (1344, 4, 17 * 144 + 16 + 3),
        (5000, 4, 17 * 144 + 16 + 3),
    ],
)
def test_llama4_tiles_an_image_by_its_size(size: int, canvas: int, tokens: int) -> None:
    """Llama 4 Scout: tiles of 336 px (24 x 24 patches of 14 px, 577 rows with the class token), a pixel
    shuffle of 0.5 (144 features a tile); the canvas as Llama4ImageProcessor.get_best_fit picks it, the tokens
    as Llama4Processor._prompt_split_image writes them, the trace worker's own copy of the canvas rule
    agreeing."""
    worker = pytest.importorskip("gpumem_gui.trace.gpumem_trace_worker.vision")
    spec = load_config_file(
        REPO / "tests" / "reference" / "extra" / "configs" / "meta-llama__Llama-4-Scout-17B-16E-Instruct.json"
    )
    tower = spec.vision.tower
    assert (tower.kind, tower.tile_side, tower.spatial_merge_size, tower.adapter_size) == (
        "llama4",
        336,
        2,
        4096,
    )
    g = image_grid(tower, size)
    tiles = canvas * canvas + (canvas > 1)
    assert (g.tiles, g.patches, g.features, g.tokens) == (tiles, tiles * 577, tiles * 144, tokens)
    assert worker.llama4_tiles(336, size) == (canvas, canvas)
    assert canvas_tiles(336, size, 16) == (canvas, canvas)


def test_llama4_canvas_beyond_its_tiles_is_downscaled() -> None:
    """A 700-px image on 112-px tiles would need 7 a side, more than 16 tiles allow: downscaled onto 4 x 4
    (get_best_fit: the least downscale); 300 px: 3 x 3 (the smallest upscale)."""
    assert canvas_tiles(112, 700, 16) == (4, 4)
    assert canvas_tiles(112, 300, 16) == (3, 3)


@pytest.mark.parametrize(
    ("model", "key", "owner"),
    [
        ("qwen2_5_vl-vision-tiny", "num_heads", "the vision attention's head_dim"),
        ("gemma3-vision-tiny", "num_attention_heads", "SiglipAttention"),
    ],
)
def test_vision_heads_that_do_not_split_the_width_are_one_line_errors(
    tmp_path: Path, model: str, key: str, owner: str
) -> None:
    """readers/vision_tower.py ``_heads``: the field named, the allowed split said, no traceback."""
    config = json.loads((HERE / "configs" / f"{model}.json").read_text())
    config["vision_config"][key] = 7
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(GpumemInputError) as e:
        load_config_file(path)
    assert e.value.field == key
    assert f"must be divisible by {key} (7) ({owner})" in e.value.message
