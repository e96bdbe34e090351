"""The vision towers' non-persistent buffers: built with the model, held whether a prompt has images or not.

transformers 5.24 registers, per replayed tower: the rotary's ``inv_freq`` / ``original_inv_freq`` (fp32;
Qwen2.5-VL, Qwen3-VL, Pixtral), SigLIP's int64 ``position_ids`` (Gemma 3) and Llama 4's complex64 ``freqs_ci``
(``core/replay/vision*.py`` ``buffer_bytes``). Checked against the trace's ``Buffer`` category of every traced
point with images, against the whole model transformers builds from the full-size configs, and on a text-only
trace (the worker adds the tower's buffers with its parameters, ``gpumem_trace_worker/vision.py``).
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from gpumem_gui.core import (
    ModelSpec,
    estimate_training,
    load_config_file,
    load_model,
    make_run,
    make_training_run,
)
from gpumem_gui.core.replay.buffers import buffers_bytes
from gpumem_gui.core.replay.vision import tower_buffer_bytes
from tests.conftest import REPO

HERE = REPO / "tests" / "reference" / "vision"
POINTS = [
    p
    for name in ("points.json", "training_points.json")
    for p in json.loads((HERE / name).read_text())["points"]
]


@cache
def _spec(key: str) -> ModelSpec:
    return load_config_file(Path(HERE / "configs" / f"{key}.json"))


def _embed_scale(spec: ModelSpec, param_bytes: int) -> int:
    """Gemma3TextScaledWordEmbedding.embed_scale: a 0-d buffer of the text model in the weights' dtype, not
    counted by the estimate (2 or 4 bytes; the text model's, not the tower's)."""
    return param_bytes if spec.model_type == "gemma3" else 0


def _estimated_buffers(spec: ModelSpec, point: dict) -> tuple[int, int]:
    """(the estimate's buffers, bytes of the weights' dtype) of a traced point: inference in bf16 (the
    buffers inside the weights component); a training step's own ``buffers`` component (amp-bf16: a full
    fine-tune's weights in fp32, LoRA's frozen base in bf16; precision bf16: bf16)."""
    if point["mode"] == "inference":
        return buffers_bytes(spec, 2), 2
    run = {k: v for k, v in point["run"].items() if k != "attn"}
    est = estimate_training(spec, make_training_run(**run))
    # the weights' dtype as the trace worker takes it (precision_dtypes): fp32 for a full fine-tune under
    # autocast, else bf16
    fp32 = run["method"] == "full" and run.get("precision", "amp-bf16") != "bf16"
    nbytes = 4 if fp32 else 2
    return next(c.bytes for c in est.phases["forward"].components if c.key == "buffers"), nbytes


@pytest.mark.parametrize("point", POINTS, ids=[f"{p['model']}-{p['mode']}-{p['run']}" for p in POINTS])
def test_buffers_equal_the_traced_buffers(point: dict) -> None:
    spec = _spec(point["model"])
    estimated, nbytes = _estimated_buffers(spec, point)
    expected = estimated + _embed_scale(spec, nbytes)
    assert {ph: v["Buffer"] for ph, v in point["phases"].items()} == dict.fromkeys(point["phases"], expected)
    assert tower_buffer_bytes(spec) > 0


_FULL = (
    ("configs", "google__gemma-3-4b-it", 4096 * 8),  # SigLIP at 896 px: 64 x 64 int64 position ids
    ("extra/configs", "Qwen__Qwen2.5-VL-7B-Instruct", 2 * 20 * 4),  # head_dim 80: 20 frequencies, twice
    ("extra/configs", "Qwen__Qwen3-VL-8B-Instruct", 2 * 18 * 4),  # head_dim 72
    ("extra/configs", "Qwen__Qwen3-VL-30B-A3B-Instruct", 2 * 18 * 4),
    ("extra/configs", "meta-llama__Llama-4-Scout-17B-16E-Instruct", 577 * 44 * 8),  # 24 x 24 + cls, complex64
    ("extra/configs", "mistralai__Mistral-Small-3.1-24B-Instruct-2503", 2 * 32 * 4),  # Pixtral head_dim 64
)


@pytest.mark.parametrize(("folder", "name", "nbytes"), _FULL, ids=[n for _, n, _ in _FULL])
def test_full_size_towers_buffers_as_transformers_builds_them(folder: str, name: str, nbytes: int) -> None:
    """The whole model built by transformers on the meta device: its buffers outside the language model, by
    storage (SigLIP's position ids are an expanded arange), equal the replay's count."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    path = REPO / "tests" / "reference" / folder / f"{name}.json"
    spec = load_config_file(path)
    assert tower_buffer_bytes(spec) == nbytes
    cfg = transformers.AutoConfig.for_model(**json.loads(path.read_text()))
    with torch.device("meta"):
        whole = transformers.AutoModel.from_config(cfg)
    built = sum(
        b.untyped_storage().nbytes()
        for n, b in whole.named_buffers()
        if not {"language_model", "lm_head"} & set(n.split("."))
    )
    assert built == nbytes


def test_a_text_only_trace_adds_the_towers_buffers() -> None:
    """Gemma 3 with text only: the worker traces the language model and adds the tower's parameters and
    buffers (before: parameters only, the trace 8 KiB under the estimate's buffers)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from gpumem_gui.trace import trace

    model = load_model(str(HERE / "configs" / "gemma3-vision-tiny.json"))
    spec = model.spec
    assert spec is not None
    rep = trace(model, make_run(seq=64), use_cache=False)
    assert not any(n.startswith("multimodal: the whole model") for n in rep.result.notes)
    expected = buffers_bytes(spec, 2) + _embed_scale(spec, 2)
    assert {ph: v["Buffer"] for ph, v in rep.result.phases.items()} == dict.fromkeys(
        rep.result.phases, expected
    )
