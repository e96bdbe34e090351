"""config.json reading: per-type details and every kind of bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.readers.hf_config import SUPPORTED_MODEL_TYPES, load_config_file, spec_from_config
from gpumem_gui.core.spec.params import count_params

LLAMA = {
    "model_type": "llama",
    "hidden_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "intermediate_size": 512,
    "vocab_size": 1000,
}


def test_required_model_types_are_supported() -> None:
    required = {
        "llama",
        "mistral",
        "mixtral",
        "qwen2",
        "qwen2_moe",
        "qwen3",
        "qwen3_moe",
        "gemma",
        "gemma2",
        "gemma3",
        "gemma3_text",
        "phi3",
        "deepseek_v2",
        "deepseek_v3",
        "gpt2",
        "opt",
        "bloom",
        "falcon",
        "gpt_neox",
        "olmo2",
        "granite",
        "starcoder2",
    }
    assert required <= set(SUPPORTED_MODEL_TYPES)


def test_small_llama_by_hand() -> None:
    spec = spec_from_config(LLAMA, name="tiny")
    h, f, v, q, kv = 256, 512, 1000, 256, 2 * 32
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * f + 2 * h
    assert count_params(spec).total == v * h * 2 + 2 * per_layer + h
    assert spec.head_dim == 32
    assert spec.attention_kind == "GQA"


def test_explicit_head_dim_wins() -> None:
    spec = spec_from_config({**LLAMA, "head_dim": 64}, name="t")
    assert spec.head_dim == 64
    assert spec.q_width == 8 * 64


def test_tied_default_differs_per_type() -> None:
    base = {k: v for k, v in LLAMA.items() if k != "model_type"}
    assert not spec_from_config({**base, "model_type": "llama"}, name="t").tie_word_embeddings
    assert spec_from_config({**base, "model_type": "gemma", "head_dim": 32}, name="t").tie_word_embeddings


def test_gemma2_alternates_sliding_layers() -> None:
    cfg = {**LLAMA, "model_type": "gemma2", "num_hidden_layers": 4, "sliding_window": 128, "head_dim": 32}
    spec = spec_from_config(cfg, name="t")
    assert spec.resolved_layer_types == (
        "sliding_attention",
        "full_attention",
        "sliding_attention",
        "full_attention",
    )


def test_explicit_layer_types_are_used() -> None:
    types = ["full_attention", "sliding_attention"]
    spec = spec_from_config(
        {
            **LLAMA,
            "model_type": "qwen3",
            "layer_types": types,
            "sliding_window": 64,
            "use_sliding_window": True,
        },
        name="t",
    )
    assert spec.resolved_layer_types == tuple(types)


def test_qwen_moe_dense_layers() -> None:
    cfg = {
        **LLAMA,
        "model_type": "qwen3_moe",
        "num_hidden_layers": 4,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 64,
        "decoder_sparse_step": 2,
        "mlp_only_layers": [3],
    }
    spec = spec_from_config(cfg, name="t")
    assert [spec.is_moe_layer(i) for i in range(4)] == [False, True, False, False]


@pytest.mark.parametrize(
    ("cfg", "field", "words"),
    [
        ({**LLAMA, "hidden_size": 0}, "hidden_size", ">= 1"),
        ({**LLAMA, "hidden_size": -5}, "hidden_size", ">= 1"),
        ({**LLAMA, "hidden_size": "big"}, "hidden_size", "integer"),
        ({**LLAMA, "num_hidden_layers": 2.5}, "num_hidden_layers", "integer"),
        ({k: v for k, v in LLAMA.items() if k != "vocab_size"}, "vocab_size", "missing"),
        ({**LLAMA, "num_attention_heads": 7}, "num_attention_heads", "not divisible"),
        ({**LLAMA, "num_key_value_heads": 3}, "num_kv_heads", "multiple"),
        ({**LLAMA, "num_key_value_heads": 16}, "num_kv_heads", "at most"),
        ({**LLAMA, "model_type": "mamba"}, "model_type", "not supported"),
        ({**LLAMA, "model_type": None}, "model_type", "no model_type"),
        ({**LLAMA, "tie_word_embeddings": "yes"}, "tie_word_embeddings", "true or false"),
        ({**LLAMA, "layer_types": ["full_attention"]}, "layer_types", "one type per layer"),
        ({**LLAMA, "layer_types": ["full_attention", "mamba"]}, "layer_types", "unsupported"),
    ],
)
def test_bad_configs_name_the_field(cfg: dict, field: str, words: str) -> None:
    with pytest.raises(GpumemInputError) as ei:
        spec_from_config(cfg, name="t", source="cfg.json")
    msg = str(ei.value)
    assert "cfg.json" in msg
    assert field in msg, msg
    assert words in msg, msg


def test_unmodelled_type_points_to_trace_and_safetensors() -> None:
    """A recurrent type no reader describes (tests/test_generic_decoder.py has the generic decoder)."""
    with pytest.raises(GpumemInputError) as ei:
        spec_from_config({**LLAMA, "model_type": "rwkv"}, name="t")
    assert "not modelled" in str(ei.value) and "gpumem trace" in str(ei.value)
    assert "safetensors" in str(ei.value)


@pytest.mark.parametrize(
    ("text", "words"),
    [("{not json", "malformed JSON"), ("[1, 2]", "JSON object"), ("", "malformed JSON")],
)
def test_bad_files(tmp_path: Path, text: str, words: str) -> None:
    p = tmp_path / "config.json"
    p.write_text(text)
    with pytest.raises(GpumemInputError) as ei:
        load_config_file(p)
    assert str(p) in str(ei.value) and words in str(ei.value)


def test_binary_file_is_a_clear_error(tmp_path: Path) -> None:
    p = tmp_path / "config.json"
    p.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(GpumemInputError, match="UTF-8"):
        load_config_file(p)


def test_config_file_name_becomes_model_name(tmp_path: Path) -> None:
    d = tmp_path / "my-model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(LLAMA))
    assert load_config_file(d / "config.json").name == "my-model"
    (tmp_path / "org__name.json").write_text(json.dumps(LLAMA))
    assert load_config_file(tmp_path / "org__name.json").name == "org/name"


# ---- fuzz: any JSON value is either a spec or one GpumemInputError ---------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.conftest import reference_dir  # noqa: E402

_REAL = [json.loads(p.read_text()) for p in sorted((reference_dir() / "configs").glob("*.json"))]
_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@st.composite
def _mutated_configs(draw: st.DrawFn) -> object:
    cfg = dict(draw(st.sampled_from(_REAL)))
    for _ in range(draw(st.integers(1, 4))):
        key = draw(st.sampled_from(sorted(cfg)) | st.text(max_size=6))
        if draw(st.booleans()):
            cfg.pop(key, None)
        else:
            cfg[key] = draw(_json)
    return cfg


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mutated_configs() | _json)
def test_fuzzed_configs_raise_only_input_errors(cfg: object) -> None:
    try:
        spec = spec_from_config(cfg, name="fuzz", source="fuzz.json")  # type: ignore[arg-type]
    except GpumemInputError as e:
        assert "fuzz.json" in str(e)
        return
    assert count_params(spec).total > 0


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("num_hidden_layers", 10**9),
        ("hidden_size", 2**40),
        ("vocab_size", float("inf")),
        ("intermediate_size", 1e300),
    ],
)
def test_absurd_sizes_are_refused_quickly(field: str, value: object) -> None:
    with pytest.raises(GpumemInputError, match=field):
        spec_from_config({**LLAMA, field: value}, name="t")
