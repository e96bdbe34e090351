"""Group dense_b of issue 14 (GLM / GLM-4, InternLM3, Seed-OSS, Hunyuan dense, ERNIE-4.5, Ministral, Mistral-3
with its Pixtral tower, GPT-BigCode): what each reader takes from a config, the traits the replay reads, and
one-line errors naming the field for bad values."""

from __future__ import annotations

import json

import pytest

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.readers.hf_config import spec_from_config
from gpumem_gui.core.replay.config import ReplayConfig
from gpumem_gui.core.replay.forward import replay_forward
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.params import count_params
from tests.conftest import REPO

CONFIGS = REPO / "tests" / "reference" / "extra" / "configs"


def _cfg(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


GLM4 = _cfg("THUDM__GLM-4-9B-0414")


def test_glm4_partial_interleaved_rotary_and_four_norms() -> None:
    spec = spec_from_config(GLM4, name="glm4")
    assert spec.rotary_dim == 64 and spec.head_dim == 128
    assert spec.traits.rope_interleaved and spec.traits.fused_gate_up
    assert spec.traits.norm_placement == "sandwich" and spec.norms_per_layer == 4
    assert spec.qkv_bias and not spec.o_bias
    # a factor in rope_parameters (transformers 5 files) wins over the class default
    quarter = spec_from_config(
        {**GLM4, "partial_rotary_factor": None, "rope_parameters": {"partial_rotary_factor": 0.25}}, name="q"
    )
    assert quarter.rotary_dim == 32
    assert spec_from_config({**GLM4, "partial_rotary_factor": 1.0}, name="full").rotary_dim is None


def test_glm_defaults_are_the_config_class_ones() -> None:
    """GlmConfig's head_dim (128) and KV heads (2) are class defaults, not hidden / heads."""
    cfg = {
        k: v
        for k, v in _cfg("THUDM__glm-4-9b-chat-hf").items()
        if k not in ("head_dim", "num_key_value_heads")
    }
    spec = spec_from_config({**cfg, "hidden_size": 2048}, name="glm")
    assert (spec.head_dim, spec.num_kv_heads, spec.norms_per_layer) == (128, 2, 2)


@pytest.mark.parametrize(
    ("name", "patch", "field"),
    [
        ("THUDM__GLM-4-9B-0414", {"partial_rotary_factor": 0}, "partial_rotary_factor"),
        ("THUDM__GLM-4-9B-0414", {"partial_rotary_factor": "half"}, "partial_rotary_factor"),
        ("THUDM__GLM-4-9B-0414", {"partial_rotary_factor": 0.01}, "partial_rotary_factor"),
        ("THUDM__GLM-4-9B-0414", {"rope_parameters": [0.5]}, "rope_parameters"),
        ("THUDM__GLM-4-9B-0414", {"attention_bias": "yes"}, "attention_bias"),
        ("internlm__internlm3-8b-instruct", {"qkv_bias": True}, "bias"),
        ("ByteDance-Seed__Seed-OSS-36B-Instruct", {"attention_out_bias": 1}, "attention_out_bias"),
        ("ByteDance-Seed__Seed-OSS-36B-Instruct", {"residual_dropout": 1.5}, "residual_dropout"),
        ("tencent__Hunyuan-7B-Instruct", {"head_dim": None}, "head_dim"),
        ("baidu__ERNIE-4.5-0.3B-PT", {"use_bias": "no"}, "use_bias"),
        ("mistralai__Mistral-Small-3.1-24B-Instruct-2503", {"vision_config": [1]}, "vision_config"),
        ("mistralai__Mistral-Small-3.1-24B-Instruct-2503", {"spatial_merge_size": 0}, "spatial_merge_size"),
        ("bigcode__starcoderbase-1b", {"multi_query": "true"}, "multi_query"),
        ("bigcode__starcoderbase-1b", {"n_head": 3}, "n_head"),
        ("bigcode__starcoderbase-1b", {"add_cross_attention": True}, "add_cross_attention"),
        ("synthetic__ministral-tiny", {"layer_types": ["sliding_attention"]}, "layer_types"),
    ],
)
def test_bad_values_are_one_line_errors_naming_the_field(name: str, patch: dict, field: str) -> None:
    with pytest.raises(GpumemInputError) as ei:
        spec_from_config({**_cfg(name), **patch}, name=name)
    msg = str(ei.value)
    assert field in msg and "\n" not in msg


def test_mistral3_text_model_and_pixtral_tower() -> None:
    cfg = _cfg("mistralai__Mistral-Small-3.1-24B-Instruct-2503")
    spec = spec_from_config(cfg, name="ms")
    assert spec.model_type == "mistral3" and spec.sliding_window is None and spec.layer_types == ()
    assert spec.vision is not None and spec.vision.kind == "pixtral"
    assert spec.vision.image_tokens == 55 * 55 + 55  # 1540 / (14 x 2) merged patches a side, a break per row
    # Mistral3Config.tie_word_embeddings defaults to True; an explicit false keeps lm_head
    untied = spec_from_config({**cfg, "tie_word_embeddings": False}, name="ms")
    assert count_params(untied).total - count_params(spec).total == 131072 * 5120
    with pytest.raises(GpumemInputError, match="model_type"):
        spec_from_config({**cfg, "text_config": {**cfg["text_config"], "model_type": "llama"}}, name="x")


def test_bigcode_is_multi_query_gpt2() -> None:
    spec = spec_from_config(_cfg("bigcode__starcoderbase-1b"), name="sc")
    assert spec.num_kv_heads == 1 and spec.attention_kind == "MQA" and spec.traits.fused_qkv
    assert spec.position_embedding == "learned" and spec.learned_position_rows == 8192
    assert spec.activation == "gelu_pytorch_tanh" and spec.traits.eager_softmax_fp32
    mha = spec_from_config({**_cfg("bigcode__starcoderbase-1b"), "multi_query": False}, name="mha")
    assert mha.num_kv_heads == mha.num_attention_heads


def test_dropout_defaults_and_overrides() -> None:
    seed = _cfg("ByteDance-Seed__Seed-OSS-36B-Instruct")
    bare = {k: v for k, v in seed.items() if k not in ("residual_dropout", "attention_dropout")}
    t = spec_from_config(bare, name="s").traits
    assert (t.hidden_dropout, t.attention_dropout, t.residual_dropout) == (0.1, 0.1, True)
    t = spec_from_config({**seed, "residual_dropout": 0.0, "attention_dropout": 0.0}, name="s").traits
    assert (t.hidden_dropout, t.attention_dropout) == (0.0, 0.0)
    ernie = spec_from_config({**_cfg("baidu__ERNIE-4.5-0.3B-PT"), "attention_dropout": 0.2}, name="e")
    assert ernie.traits.attention_dropout == 0.0  # Ernie4_5Attention fixes it to 0.0


def _peak(spec: ModelSpec, **kw: object) -> int:
    cfg = ReplayConfig(batch=1, q=256, past=0, param_dt="bf16", attn="sdpa", logits_to_keep=1, **kw)
    return replay_forward(spec, cfg).peak


def test_rotary_variants_change_what_the_replay_allocates() -> None:
    """The GLM rotary (interleaved, partial) and ERNIE's fp32 rotary allocate otherwise than Llama's."""
    glm = spec_from_config({**GLM4, "intermediate_size": 64}, name="g")  # the attention holds the peak
    plain = glm.model_copy(
        update={"rotary_dim": None, "traits": glm.traits.model_copy(update={"rope_interleaved": False})}
    )
    assert _peak(glm) != _peak(plain)
    ernie = spec_from_config({**_cfg("baidu__ERNIE-4.5-0.3B-PT"), "intermediate_size": 64}, name="e")
    llama_rope = ernie.model_copy(
        update={"traits": ernie.traits.model_copy(update={"rope_interleaved": False, "rope_fp32": False})}
    )
    assert _peak(ernie) > _peak(llama_rope)


def test_ministral3_scales_queries_also_inside_a_mistral3_wrapper() -> None:
    text = _cfg("synthetic__ministral3-tiny")
    assert spec_from_config(text, name="m3").traits.query_position_scale
    wrapped = {**_cfg("mistralai__Mistral-Small-3.1-24B-Instruct-2503"), "text_config": text}
    spec = spec_from_config(wrapped, name="w")
    assert spec.traits.query_position_scale and spec.head_dim == 64 and spec.vision is not None
