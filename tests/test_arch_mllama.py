"""Group mllama of issue 14 (Llama 3.2 Vision): what the reader takes from a config (the cross-attention layer
type, the padded token table, the vision tower counted into VisionSpec), the cross-attention cache as
transformers holds it (none text only; the images' vision keys and values with --images), the skipped layers
of a text-only step, and one-line errors naming the field for bad values."""

from __future__ import annotations

import copy
import json

import pytest

from gpumem_gui.cli import main
from gpumem_gui.core import estimate_inference, make_run
from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.readers.hf_config import spec_from_config
from gpumem_gui.core.spec.cross_attention import cross_cache_bytes, cross_cache_bytes_per_layer
from gpumem_gui.core.spec.kv import kv_bytes_per_token_per_layer
from gpumem_gui.core.spec.params import count_params
from gpumem_gui.core.training import estimate_training, make_training_run
from gpumem_gui.ui.main_window import MainWindow
from tests.conftest import REPO

EXTRA = REPO / "tests" / "reference" / "extra"
CONFIGS = EXTRA / "configs"
GT = json.loads((EXTRA / "groundtruth_extra.json").read_text())["static"]
MEASURED = json.loads((EXTRA / "cross_cache_mllama.json").read_text())


def _cfg(key: str) -> dict:
    return json.loads((CONFIGS / f"{key}.json").read_text())


V11 = _cfg("meta-llama__Llama-3.2-11B-Vision")
TINY = _cfg("synthetic__mllama-tiny")
CROSS_11B = (3, 8, 13, 18, 23, 28, 33, 38)


def test_11b_layout_and_counts() -> None:
    spec = spec_from_config(V11, name="v")
    assert tuple(i for i, t in enumerate(spec.layer_types) if t == "cross_attention") == CROSS_11B
    assert spec.head_dim == 128 and spec.embedding_padding_rows == 8 and not spec.tie_word_embeddings
    c = count_params(spec)
    truth = GT["meta-llama__Llama-3.2-11B-Vision"]
    assert c.total == truth["total_params"] == 10_670_220_835
    assert c.text == truth["text_only"]["total_params"]
    assert c.embedding == (128256 + 8) * 4096 and c.lm_head == 128256 * 4096
    # a cross-attention layer: a self-attention layer's tensors plus q_norm, k_norm and the two gates
    assert c.per_layer[3] - c.per_layer[2] == 2 * 128 + 2
    assert spec.vision is not None and spec.vision.image_tokens == 4 * ((560 // 14) ** 2 + 1)


def test_90b_counts() -> None:
    spec = spec_from_config(_cfg("meta-llama__Llama-3.2-90B-Vision"), name="v")
    assert spec.layer_types.count("cross_attention") == 20
    assert count_params(spec).total == GT["meta-llama__Llama-3.2-90B-Vision"]["total_params"]


def test_text_only_cache_skips_the_cross_attention_layers() -> None:
    spec = spec_from_config(V11, name="v")
    per = kv_bytes_per_token_per_layer(spec)
    assert [i for i, b in enumerate(per) if b == 0] == list(CROSS_11B)
    assert sum(per) == GT["meta-llama__Llama-3.2-11B-Vision"]["kv_cache_bytes_per_token_bf16"]
    assert cross_cache_bytes(spec, 0) == 0


@pytest.mark.parametrize("point", MEASURED["points"], ids=lambda p: f"b{p['batch']}-i{p['images']}")
def test_cross_cache_with_images_equals_transformers(point: dict) -> None:
    """Each cross-attention layer holds the images' vision keys and values from the prefill on, unchanged by
    the decode step (tests/reference/extra/cross_cache_mllama.json)."""
    spec = spec_from_config(TINY, name="t")
    cross = cross_cache_bytes_per_layer(spec, point["images"], point["batch"])
    self_kv = kv_bytes_per_token_per_layer(spec)
    b, s = point["batch"], point["seq"]
    for phase, tokens in (("prefill", s), ("decode", s + 1)):
        want = [c + b * tokens * k for c, k in zip(cross, self_kv, strict=True)]
        assert want == point[f"{phase}_per_layer_bytes"], phase


def test_images_add_the_cross_cache_to_the_transformers_estimate() -> None:
    spec = spec_from_config(V11, name="v")
    text = estimate_inference(spec, make_run(seq=512, new_tokens=16))
    two = estimate_inference(spec, make_run(seq=512, new_tokens=16, images=2))
    held = cross_cache_bytes(spec, 2)
    assert held == 8 * 2 * 6404 * 2 * 8 * 128 * 2
    assert two.kv_cache_bytes - text.kv_cache_bytes == held
    for phase in ("prefill", "decode"):
        assert two.phases[phase].peak_bytes - text.phases[phase].peak_bytes == held
    assert any(w.startswith("images:") for w in two.warnings)


@pytest.mark.parametrize(
    ("engine", "reason"),
    [
        # vllm/model_executor/models/registry.py _PREVIOUSLY_SUPPORTED_MODELS
        ("vllm", r"MllamaForConditionalGeneration, last in v0\.10\.2"),
        # no LLM_ARCH_MLLAMA in llama.cpp's src/llama-arch.cpp (only in Ollama's old patch)
        ("llama.cpp", r"llama\.cpp has no mllama architecture"),
        # Ollama v0.12.10 fs/ggml/ggml.go OllamaEngineRequired: mllama runs on its Go engine
        ("ollama 0.12.10", r"own Go engine.*OllamaEngineRequired lists mllama"),
        # Ollama v0.30+ (the default) runs llama.cpp's llama-server
        ("ollama", r"ollama v0\.30\+: .*no mllama architecture"),
    ],
)
def test_other_engines_are_refused_in_one_line_with_their_reason(engine: str, reason: str) -> None:
    """Each serving engine says whether it runs Llama 3.2 Vision at all, with its source."""
    spec = spec_from_config(V11, name="v")
    name, _, version = engine.partition(" ")
    fields = {"ollama_version": version} if version else {}
    with pytest.raises(GpumemInputError, match=reason) as e:
        estimate_inference(spec, make_run(engine=name, seq=512, **fields))
    assert e.value.field == "engine" and "\n" not in str(e.value)


@pytest.mark.parametrize("images", [0, 1, 2])
def test_sglang_pools_the_vision_tokens_in_every_layer(images: int) -> None:
    """SGLang (python/sglang/srt/models/mllama.py): its token-to-KV pool has a slot in each of the 40 decoder
    layers, the 8 cross-attention ones too (ModelConfig.num_hidden_layers of the text config; pool cell =
    layers x 2 x KV heads x head_dim x 2 bytes); each image request prepends images x 4 tiles x 1601 patches
    ((560 / 14)^2 + 1) vision tokens to its prompt (pad_input_ids), one pool slot each
    (prepare_encoder_info_extend: encoder_out_cache_loc out of the request's allocation)."""
    spec = spec_from_config(V11, name="v")
    est = estimate_inference(spec, make_run(engine="sglang", batch=4, seq=1000, new_tokens=24, images=images))
    f = est.facts
    assert f["kv_bytes_per_token"] == 40 * 2 * 8 * 128 * 2
    request = 1024 + images * 4 * 1601
    assert f["kv_tokens_needed"] == 4 * request
    assert est.kv_cache_bytes == 4 * request * 40 * 2 * 8 * 128 * 2
    on_gpu = estimate_inference(
        spec, make_run(engine="sglang", batch=4, seq=1000, new_tokens=24, images=images), capacity=80 * 2**30
    )
    g = on_gpu.facts
    assert g["max_concurrency"] == min(g["max_running_requests"], g["max_total_num_tokens"] // request)


def test_text_only_training_leaves_the_cross_layers_without_state() -> None:
    """Full fine-tuning on text: the skipped cross-attention layers get no gradient, so AdamW keeps no state
    for them (the traced training points of the tiny copy are within 0.01 %, tests/test_replay.py)."""
    spec = spec_from_config(TINY, name="t")
    plain = copy.deepcopy(TINY)
    plain["text_config"]["cross_attention_layers"] = []
    dense = spec_from_config(plain, name="t")
    run = make_training_run(seq=128)
    skipped = estimate_training(spec, run).peak_bytes
    # the cross layers hold 2 x head_dim + 2 more weights each, but no gradient or optimizer state
    assert skipped < estimate_training(dense, run).peak_bytes


@pytest.mark.parametrize(
    ("where", "field", "value"),
    [
        ("text_config", "cross_attention_layers", [3, 40]),
        ("text_config", "cross_attention_layers", "3,8"),
        ("text_config", "num_attention_heads", 33),
        ("vision_config", "image_size", "560"),
        ("vision_config", "supported_aspect_ratios", []),
        ("vision_config", "attention_heads", 3),
    ],
)
def test_bad_fields_name_the_field(where: str, field: str, value: object) -> None:
    cfg = copy.deepcopy(V11)
    cfg[where][field] = value
    with pytest.raises(GpumemInputError) as e:
        spec_from_config(cfg, name="v")
    assert e.value.field == field and "\n" not in str(e.value)


def test_sub_config_must_be_an_object() -> None:
    with pytest.raises(GpumemInputError) as e:
        spec_from_config({**V11, "vision_config": [1]}, name="v")
    assert e.value.field == "vision_config"


def test_cli_inspect_and_estimate(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(CONFIGS / "meta-llama__Llama-3.2-11B-Vision.json")
    assert main(["inspect", path, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kv_cache_bytes_per_token"] == 131072
    assert doc["cross_attention_cache_bytes_per_image"] == 8 * 6404 * 4096
    assert main(["estimate", path, "--seq", "256", "--images", "1"]) == 0
    assert "cross-attention cache (images)" in capsys.readouterr().out
    assert main(["estimate", path, "--images", "-1"]) != 0
    err = capsys.readouterr().err.strip()
    assert "images" in err and len(err.splitlines()) == 1


@pytest.mark.no_qt_log
@pytest.mark.usefixtures("qt_warnings_fail")
def test_the_window_opens_it(main_window: MainWindow) -> None:
    assert main_window.load_source(str(CONFIGS / "meta-llama__Llama-3.2-11B-Vision.json"))
    est = main_window.estimate
    assert est is not None and est.facts["params_total"] == 10_670_220_835
    assert main_window.run_form.value().images == 0
