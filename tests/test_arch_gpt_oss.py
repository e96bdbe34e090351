"""gpt-oss (``models/gpt_oss``, transformers 5.24): what its reader takes from a config.json, the errors a bad
value gives, and the replay's choices that differ from Llama's (eager attention for ``sdpa``, sinks)."""

from __future__ import annotations

import json

import pytest

from gpumem_gui.core import GpumemInputError, estimate_inference, make_run
from gpumem_gui.core.readers.hf_config import spec_from_config
from gpumem_gui.core.spec.params import count_params, text_tensors
from tests.conftest import REPO

CONFIGS = REPO / "tests" / "reference" / "extra" / "configs"
TINY = json.loads((CONFIGS / "synthetic__gpt_oss-tiny.json").read_text())


def _spec(**over: object):
    return spec_from_config({**TINY, **over}, name="tiny", source="config.json")


def test_reader_takes_the_published_structure() -> None:
    spec = spec_from_config(
        json.loads((CONFIGS / "openai__gpt-oss-20b.json").read_text()), name="20b", source="config.json"
    )
    assert spec.attention_sinks and spec.qkv_bias and spec.o_bias and not spec.tie_word_embeddings
    assert spec.moe is not None and spec.moe.router_bias and spec.moe.expert_bias
    assert (spec.moe.num_experts, spec.moe.experts_per_token) == (32, 4)
    assert spec.sliding_window == 128 and spec.layer_types[:2] == ("sliding_attention", "full_attention")
    assert spec.traits.gguf_arch == "gpt-oss" and not spec.traits.sdpa_supported


def test_class_defaults_apply_to_absent_keys() -> None:
    """GptOssConfig's defaults: 36 layers, 128 experts, head_dim 64, layer types alternating from a sliding
    layer 0 (GptOssConfig.__post_init__), window 128."""
    spec = spec_from_config({"model_type": "gpt_oss"}, name="defaults", source="config.json")
    assert (spec.num_layers, spec.moe.num_experts, spec.head_dim) == (36, 128, 64)  # type: ignore[union-attr]
    assert spec.layer_types == ("sliding_attention", "full_attention") * 18
    assert spec.sliding_window == 128


def test_num_experts_is_an_alias_of_num_local_experts() -> None:
    cfg = {k: v for k, v in TINY.items() if k != "num_local_experts"}
    spec = spec_from_config({**cfg, "num_experts": 4}, name="alias", source="config.json")
    assert spec.moe is not None and spec.moe.num_experts == 4


def test_every_tensor_transformers_builds_is_counted() -> None:
    """One sink logit per head per layer, the router's bias, the experts' biases."""
    names = {t.name: t.shape for t in text_tensors(_spec())}
    assert names["layers.0.self_attn.sinks"] == (8,)
    assert names["layers.0.mlp.gate.bias"] == (8,)
    assert names["layers.0.mlp.experts.gate_up_proj_bias"] == (8, 512)
    assert names["layers.0.mlp.experts.down_proj_bias"] == (8, 256)
    assert count_params(_spec()).total == 8_689_984  # transformers' own count (groundtruth_extra.json)


@pytest.mark.parametrize(
    ("over", "field"),
    [
        ({"swiglu_limit": -1.0}, "swiglu_limit"),
        ({"swiglu_alpha": "fast"}, "swiglu_alpha"),
        ({"sliding_window": None}, "sliding_window"),
        ({"num_experts_per_tok": 9}, "num_experts_per_tok"),
        ({"layer_types": ["sliding_attention"]}, "layer_types"),
        ({"attention_bias": "yes"}, "attention_bias"),
        ({"num_local_experts": 0}, "num_local_experts"),
    ],
)
def test_bad_values_name_the_field(over: dict, field: str) -> None:
    with pytest.raises(GpumemInputError) as e:
        _spec(**over)
    assert field in str(e.value) and "\n" not in str(e.value)


def test_sdpa_runs_eager_as_transformers_does() -> None:
    """GptOssPreTrainedModel has no SDPA path: the default sdpa falls back to eager, so both estimates are
    the same, and the fused FlashAttention kernels (which take the sinks) keep no scores."""
    spec = _spec()
    sdpa = estimate_inference(spec, make_run(batch=1, seq=512, attn="sdpa"))
    eager = estimate_inference(spec, make_run(batch=1, seq=512, attn="eager"))
    flash = estimate_inference(spec, make_run(batch=1, seq=512, attn="flash"))
    assert sdpa.phases["prefill"].peak_bytes == eager.phases["prefill"].peak_bytes
    assert flash.phases["prefill"].peak_bytes < eager.phases["prefill"].peak_bytes


def _issue13_points() -> list[dict]:
    """The six gpt-oss-20b points measured by the reference script (tests/reference/unsupported/
    groundtruth.json) when no reader described gpt_oss."""
    doc = json.loads((REPO / "tests" / "reference" / "unsupported" / "groundtruth.json").read_text())
    return [p for p in doc["grid"] if p["model"] == "openai__gpt-oss-20b"]


@pytest.mark.parametrize("point", _issue13_points(), ids=lambda p: f"{p['mode']}-{p['attn_implementation']}")
def test_the_estimate_equals_the_reference_measurements(point: dict) -> None:
    """The full gpt-oss-20b (bf16 experts, as transformers builds it from the config): prefill peaks equal the
    reference script's to 1e-6, the training step's within 0.01 %."""
    from gpumem_gui.core.reference_points import run_for_point
    from gpumem_gui.core.training import simulate_rank

    spec = spec_from_config(
        json.loads((CONFIGS / "openai__gpt-oss-20b.json").read_text()), name="20b", source="config.json"
    )
    run = run_for_point(point)
    if point["mode"].startswith("infer"):
        got = estimate_inference(spec, run).phases["prefill"].peak_bytes  # type: ignore[arg-type]
        assert abs(got - point["peak_bytes"]) / point["peak_bytes"] < 1e-6
        return
    res, _, _ = simulate_rank(spec, run, cpu_dropout=True)  # type: ignore[arg-type]
    got = max(p.total for p in res.phases.values())
    assert abs(got - point["peak_bytes"]) / point["peak_bytes"] < 1e-4
