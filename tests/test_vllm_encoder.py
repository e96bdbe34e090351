"""vLLM's encoder profile of a vision model (gpumem_gui/core/runtimes/vllm_encoder.py): the dummy batch's
items as vLLM counts them, what stays allocated through the text model's dummy forward and the sampler run,
and the tower's own peak (the transformers tower's replay), at the byte; and against published startup
logs."""

from __future__ import annotations

import pytest

from gpumem_gui.core.readers.catalog import find_gpu, find_model
from gpumem_gui.core.replay.config import ReplayConfig
from gpumem_gui.core.replay.vision import tower_peak
from gpumem_gui.core.results.estimate import Component, Estimate
from gpumem_gui.core.runtimes.inference import estimate_inference, make_run
from gpumem_gui.core.runtimes.vllm_encoder import encoder_items, encoder_profile
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.units import GiB
from validation.validate_report.common import spec_for
from validation.validate_report.engine_logs import document, vllm_ours

H100 = find_gpu("H100-SXM-80GB").gpu_memory


def _spec(name: str) -> ModelSpec:
    entry = find_model(name)
    assert entry is not None, name
    return entry.spec


def _act(est: Estimate) -> Component:
    return next(c for c in est.components if c.key == "activations")


# (model, run fields, max_num_batched_tokens, max_num_seqs, items the log names) from published startup logs:
# "Encoder cache will be initialized with a budget of B tokens, and profiled with N image items"
PUBLISHED_ITEMS = [
    # a public vllm-ascend memory study note (code index id 6775121577): vllm serve Qwen3-VL-8B-Instruct
    # --max-model-len 65536 --max-num-seqs 8 --max-num-batched-tokens 32768: "a budget of 32768 tokens, and
    # profiled with 2 image items"
    ("Qwen/Qwen3-VL-8B-Instruct", {"max_model_len": 65536}, 32768, 8, 2),
    # the same note, Qwen3-VL-32B-Instruct (the same tower and 16384-token images as the 8B) --max-model-len
    # 16384 --max-num-seqs 4: "a budget of 16384 tokens, and profiled with 1 image items"
    ("Qwen/Qwen3-VL-8B-Instruct", {"max_model_len": 16384}, 16384, 4, 1),
    # Ray's llm-batch-inference-vision example (validation/data/engine_logs/vllm.json,
    # vllm-qwen2.5-vl-3b-tp1-l4): Qwen2.5-VL-3B, max_num_batched_tokens 2048: "a budget of 16384 tokens, and
    # profiled with 1 image items" (the Qwen2.5-VL-7B tower and images stand for the 3B's)
    ("Qwen/Qwen2.5-VL-7B-Instruct", {"max_model_len": 8192}, 2048, 256, 1),
]


@pytest.mark.parametrize(("model", "fields", "tokens", "seqs", "items"), PUBLISHED_ITEMS)
def test_items_as_published_logs_name_them(
    model: str, fields: dict[str, int], tokens: int, seqs: int, items: int
) -> None:
    run = make_run(engine="vllm", seq=1024, **fields)
    assert encoder_items(_spec(model), run, tokens, seqs, fields["max_model_len"]) == items


def test_items_by_the_budget_and_the_decoder_cap() -> None:
    """Gemma 3: 256 embeddings an image, so 8192 // 256 = 32 (vLLM main counts the encoder cache in
    embeddings; the v0.11 log of vllm-gemma3-27b-tp1-mi300x names 31, 8192 // 260, when the 4 tokens around
    the image were counted too); one sequence of one image caps it at 1; image=0 profiles nothing."""
    spec = _spec("google/gemma-3-27b-it")
    run = make_run(engine="vllm", seq=1024, max_model_len=4096)
    assert encoder_items(spec, run, 8192, 1024, 4096) == 32
    one = make_run(engine="vllm", seq=1024, max_model_len=4096, images_per_prompt=1)
    assert encoder_items(spec, one, 65536, 1, 4096) == 1
    none = make_run(engine="vllm", seq=1024, max_model_len=4096, images_per_prompt=0)
    assert encoder_profile(spec, none, 8192, 1024, 4096) is None
    # Llama 4: the dummy image is the largest canvas, 4 x 4 tiles and a global one: 17 x 144 embeddings
    scout = _spec("meta-llama/Llama-4-Scout-17B-16E-Instruct")
    prof = encoder_profile(scout, run, 8192, 1024, 4096)
    assert prof is not None and (prof.item_tokens, prof.items) == (17 * 144, 3)
    assert prof.inputs == 3 * 17 * 3 * 336 * 336 * 2  # Llama4ImageProcessor's bf16 pixels


def test_qwen2_5_vl_7b_on_an_h100_at_the_byte() -> None:
    """vLLM's defaults on an H100 (8192 batched tokens, 1024 sequences): budget max(8192, 16384) = 16384, one
    3584-px image (128 x 128 merged patches, 256 x 256 patches of 14 px); its fp32 pixel_values [65536, 3 x 2
    x 14 x 14] and its 16384 x 3584 bf16 embeddings stay allocated through the sampler run, which is the
    peak (1024 x 152064 logits x (2 + 37) B); the tower's own peak is the transformers tower's replay."""
    spec = _spec("Qwen/Qwen2.5-VL-7B-Instruct")
    est = estimate_inference(spec, make_run(engine="vllm", seq=4096, max_model_len=4096), capacity=H100)
    a = _act(est).explain.inputs
    assert (a["images"], a["image_tokens"], a["image_side"]) == (1, 16384, 3584)
    assert a["pixel_input_bytes"] == 65536 * 3 * 2 * 14 * 14 * 4 == 308_281_344
    assert a["encoder_cache_bytes"] == 16384 * 3584 * 2
    sampler = 1024 * 152064 * (2 + 37)
    assert a["sampler_bytes"] == sampler
    cfg = ReplayConfig(batch=1, q=0, param_dt="bf16", images=1, image_size=3584, weights_counted=False)
    assert a["tower_peak_bytes"] == tower_peak(spec, cfg).peak
    assert a["tower_peak_bytes"] < sampler
    assert _act(est).bytes == 308_281_344 + 16384 * 3584 * 2 + sampler


def test_the_tower_is_the_peak_of_a_small_batch_and_a_published_pool() -> None:
    """Qwen2.5-VL-3B on an L4 with max_num_batched_tokens 2048 (Ray's vision example, vLLM 0.11): the tower on
    one 3584-px image is the profile's peak, above the sampler run of 256 requests; the KV pool then comes
    within 6 % of the logged 9.26 GiB, where the encoder cache alone (the estimate before the tower was
    modelled) left it 20 % over."""
    point = next(p for p in document("vLLM")["points"] if p["id"] == "vllm-qwen2.5-vl-3b-tp1-l4")
    ours = vllm_ours(point)
    published = next(m["value"] for m in point["metrics"] if m["kind"] == "kv_pool")
    assert abs(ours["kv_pool"] / published - 1) < 0.06
    spec_run = make_run(**point["run"])
    est = estimate_inference(
        spec_for(point["model"]), spec_run, capacity=find_gpu(point["capacity_gib"]).gpu_memory
    )
    a = _act(est).explain.inputs
    assert _act(est).bytes == a["tower_peak_bytes"]
    held = int(a["pixel_input_bytes"]) + int(a["encoder_cache_bytes"])  # type: ignore[call-overload]
    text_peak = held + max(int(a["forward_bytes"]), int(a["sampler_bytes"]))  # type: ignore[call-overload]
    cache_only_pool = ours["kv_pool"] + (_act(est).bytes - text_peak) / GiB
    assert cache_only_pool / published - 1 > 0.15


def test_pipeline_stages_and_tensor_parallel() -> None:
    """pp 2: the first stage holds the encoder's inputs and outputs through its forward, the sampler runs on
    the last (the estimate takes the fuller); tp > 1 warns that the tower is replayed unsharded."""
    spec = _spec("Qwen/Qwen2.5-VL-72B-Instruct")
    est = estimate_inference(
        spec, make_run(engine="vllm", seq=4096, max_model_len=4096, tp=4, pp=2), capacity=H100
    )
    a = _act(est).explain.inputs
    held = int(a["pixel_input_bytes"]) + int(a["encoder_cache_bytes"])  # type: ignore[call-overload]
    assert _act(est).bytes == max(
        int(a["tower_peak_bytes"]),  # type: ignore[call-overload]
        held + int(a["forward_bytes"]),  # type: ignore[call-overload]
        int(a["sampler_bytes"]),  # type: ignore[call-overload]
    )
    assert any("unsharded tower" in w for w in est.warnings)
