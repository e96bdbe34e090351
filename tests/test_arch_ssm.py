"""Issue 14, group ssm: Nemotron-H (Mamba-2 layers among attention and MLP layers, one sub-layer per layer),
Jamba (Mamba-1), Granite 4.0 (Mamba-2 or attention, then experts and a shared MLP) and Falcon-H1 (Mamba-2
beside attention in every layer).
The fixed state per sequence equals what transformers' cache holds (tests/reference/extra/
recurrent_state_ssm.json, validation/measure_recurrent_state.py); KV only on the attention layers; bad
values give one line naming the field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpumem_gui.core import estimate_inference, make_run
from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.readers.hf_config import spec_from_config
from gpumem_gui.core.spec.kv import kv_bytes_per_token_per_layer
from gpumem_gui.core.spec.params import count_params
from gpumem_gui.core.spec.state import memory_by_layer_type, state_bytes_per_sequence_per_layer
from tests.conftest import REPO

EXTRA = REPO / "tests" / "reference" / "extra"
KEY = "nvidia__Nemotron-H-8B-Base-8K"


def _cfg(key: str = KEY) -> dict[str, Any]:
    return json.loads((EXTRA / "configs" / f"{key}.json").read_text())


def _spec(cfg: dict[str, Any]):
    return spec_from_config(cfg, name="t", source="cfg.json")


def test_state_and_kv_equal_transformers_cache() -> None:
    """Per layer: the Mamba-2 layers' bf16 conv state (b, conv_dim, 4) and fp32 SSM state (b, 128, 64, 128),
    the attention layers' keys and values, nothing for the MLP layers (DummyLayer)."""
    measured = json.loads((EXTRA / "recurrent_state_ssm.json").read_text())["models"][KEY]
    spec = _spec(_cfg())
    for seq in ("16", "200"):
        m = measured[seq]
        assert list(state_bytes_per_sequence_per_layer(spec)) == m["state_bytes_per_layer"]
        kv = [k * int(seq) for k in kv_bytes_per_token_per_layer(spec)]
        assert kv == m["kv_bytes_per_layer"]
    rows = {r.layer_type: r for r in memory_by_layer_type(spec)}
    assert (rows["mamba"].layers, rows["mlp"].layers, rows["full_attention"].layers) == (24, 24, 4)
    assert rows["mamba"].state_bytes_per_sequence == 102_629_376 and rows["mlp"].kv_bytes_per_token == 0


def test_parameters_and_state_facts() -> None:
    spec = _spec(_cfg())
    assert count_params(spec).total == 8_100_852_736  # groundtruth_extra.json (transformers on meta)
    est = estimate_inference(spec, make_run(batch=3, seq=100))
    assert est.kv_cache_bytes == 3 * 100 * 4 * 2 * 8 * 128 * 2


def test_the_pattern_and_the_layer_list_agree() -> None:
    cfg = _cfg()
    names = {"M": "mamba", "*": "attention", "-": "mlp"}
    listed = {k: v for k, v in cfg.items() if k != "hybrid_override_pattern"}
    listed["layers_block_type"] = [names[c] for c in cfg["hybrid_override_pattern"]]
    assert _spec(listed).layer_types == _spec(cfg).layer_types


@pytest.mark.parametrize(
    ("update", "field", "words"),
    [
        ({"hybrid_override_pattern": "M*E-"}, "hybrid_override_pattern", "not modelled"),
        ({"hybrid_override_pattern": 7}, "hybrid_override_pattern", "string"),
        ({"layers_block_type": ["mamba", "moe"]}, "layers_block_type", "moe layers are not modelled"),
        ({"mamba_num_heads": 100}, "n_groups", "divide"),
        ({"mamba_hidden_act": "gelu"}, "mamba_hidden_act", "silu"),
        ({"mlp_hidden_act": "tanh"}, "mlp_hidden_act", "relu2"),
        ({"ssm_state_size": 0}, "ssm_state_size", ">= 1"),
        ({"use_conv_bias": "yes"}, "use_conv_bias", "true or false"),
    ],
)
def test_bad_values_name_the_field(update: dict, field: str, words: str) -> None:
    with pytest.raises(GpumemInputError) as e:
        _spec({**_cfg(), **update})
    text = str(e.value)
    assert field in text and words in text and "\n" not in text


@pytest.mark.parametrize("engine", ["transformers", "vllm", "llama.cpp", "sglang", "ollama"])
def test_every_engine_sizes_the_hybrid(engine: str) -> None:
    """Each engine's state pool (tests/test_engine_state.py, test_sglang_hybrid.py, test_ollama_hybrid.py)
    takes the Mamba-2 + MLP hybrid: an estimate, not a refusal (their bytes are tested there)."""
    spec = _spec(_cfg())
    weights = "gguf-q8_0" if engine in ("llama.cpp", "ollama") else "bf16"
    est = estimate_inference(spec, make_run(batch=1, seq=64, engine=engine, weights=weights))
    assert est.peak_bytes > 0


# ---- Jamba (Mamba-1 mixers and experts in Llama-like layers) ----------------------------------------------
JAMBA = "ai21labs__Jamba-v0.1"


def test_jamba_state_and_kv_equal_transformers_cache() -> None:
    """Mamba layers: a bf16 conv state (b, 8192, 4) and the scan's fp32 ssm_state (b, 8192, 16); attention
    every 8th layer from the 5th."""
    measured = json.loads((EXTRA / "recurrent_state_ssm.json").read_text())["models"]
    for key in (JAMBA, "synthetic__jamba-tiny"):
        spec = _spec(_cfg(key))
        for seq in ("16", "200"):
            m = measured[key][seq]
            assert list(state_bytes_per_sequence_per_layer(spec)) == m["state_bytes_per_layer"]
            assert [k * int(seq) for k in kv_bytes_per_token_per_layer(spec)] == m["kv_bytes_per_layer"]
    spec = _spec(_cfg(JAMBA))
    assert spec.resolved_layer_types.count("full_attention") == 4 and spec.num_moe_layers == 16
    assert count_params(spec).total == 51_570_323_328


@pytest.mark.parametrize(
    ("update", "field", "words"),
    [
        ({"attn_layer_offset": 8}, "attn_layer_offset", "below"),
        ({"expert_layer_period": 0}, "expert_layer_period", ">= 1"),
        ({"mamba_dt_rank": "big"}, "mamba_dt_rank", "'auto'"),
        ({"hidden_act": "gelu"}, "hidden_act", "silu"),
        ({"num_experts_per_tok": 32}, "num_experts_per_tok", "more than"),
        ({"mamba_d_state": 0}, "mamba_d_state", ">= 1"),
    ],
)
def test_jamba_bad_values_name_the_field(update: dict, field: str, words: str) -> None:
    with pytest.raises(GpumemInputError) as e:
        _spec({**_cfg(JAMBA), **update})
    text = str(e.value)
    assert field in text and words in text and "\n" not in text


# ---- Granite 4.0 (granitemoehybrid) and Falcon-H1 (falcon_h1): BambaMixer-derived Mamba-2 mixers --------
GRANITE = "ibm-granite__granite-4.0-h-small"
FALCON = "tiiuae__Falcon-H1-7B-Instruct"
BAMBA_KEYS = (
    "synthetic__granitemoehybrid-tiny",
    "ibm-granite__granite-4.0-h-tiny",
    "synthetic__falcon_h1-tiny",
    "synthetic__falcon_h1-rmsnorm-tiny",
    "tiiuae__Falcon-H1-0.5B-Instruct",
    GRANITE,
    "ibm-granite__granite-4.0-micro",
    FALCON,
    "tiiuae__Falcon-H1-34B-Instruct",
)


@pytest.mark.parametrize("key", BAMBA_KEYS)
def test_bamba_state_and_kv_equal_transformers_cache(key: str) -> None:
    """Granite: a LinearAttentionLayer (bf16 conv state, fp32 SSM state) per Mamba-2 layer, keys and values
    on the attention layers; Falcon-H1: both in every layer (LinearAttentionAndFullAttentionLayer)."""
    m = json.loads((EXTRA / "recurrent_state_ssm.json").read_text())["models"][key]
    spec = _spec(_cfg(key))
    for seq in ("16", "200"):
        assert list(state_bytes_per_sequence_per_layer(spec)) == m[seq]["state_bytes_per_layer"]
        assert [k * int(seq) for k in kv_bytes_per_token_per_layer(spec)] == m[seq]["kv_bytes_per_layer"]


@pytest.mark.parametrize(
    ("key", "params", "kv", "state"),
    [
        (GRANITE, 32_207_337_984, 16_384, 153_427_968),
        ("ibm-granite__granite-4.0-micro", 3_402_836_480, 81_920, 0),
        (FALCON, 7_585_513_568, 45_056, 139_673_600),
        ("tiiuae__Falcon-H1-34B-Instruct", 33_453_293_312, 147_456, 304_644_096),
    ],
)
def test_bamba_flagships(key: str, params: int, kv: int, state: int) -> None:
    """Parameters as transformers builds them on the meta device (groundtruth_extra.json), KV per token,
    and the fixed state per sequence (recurrent_state_ssm.json where measured)."""
    spec = _spec(_cfg(key))
    gt = json.loads((EXTRA / "groundtruth_extra.json").read_text())["static"][key]
    assert count_params(spec).total == params == gt["total_params"]
    assert sum(kv_bytes_per_token_per_layer(spec)) == kv == gt["kv_cache_bytes_per_token_bf16"]
    assert sum(state_bytes_per_sequence_per_layer(spec)) == state


def test_falcon_h1_layers_are_attention_and_mamba() -> None:
    rows = {r.layer_type: r for r in memory_by_layer_type(_spec(_cfg(FALCON)))}
    assert list(rows) == ["hybrid"] and rows["hybrid"].layers == 44
    assert rows["hybrid"].kv_bytes_per_token == 44 * 2 * 2 * 128 * 2


def test_granite_dense_and_legacy_layer_names() -> None:
    """layer_types in the 5.24 spelling read as the legacy one; without experts the shared MLP alone."""
    cfg = _cfg(GRANITE)
    new = {
        **cfg,
        "layer_types": ["linear_attention" if t == "mamba" else "full_attention" for t in cfg["layer_types"]],
    }
    assert _spec(new).layer_types == _spec(cfg).layer_types
    micro = _spec(_cfg("ibm-granite__granite-4.0-micro"))
    assert micro.moe is None and micro.mamba is None and micro.intermediate_size == 8192


@pytest.mark.parametrize(
    ("key", "update", "field", "words"),
    [
        (GRANITE, {"layer_types": ["mamba", "moe"]}, "layer_types", "mamba or attention"),
        (GRANITE, {"mamba_d_head": 48}, "mamba_d_head", "must equal"),
        (GRANITE, {"mamba_n_groups": 3}, "mamba_n_groups", "divide"),
        (GRANITE, {"hidden_act": "gelu"}, "hidden_act", "silu"),
        (GRANITE, {"num_experts_per_tok": 100}, "num_experts_per_tok", "more than"),
        (GRANITE, {"mamba_conv_bias": "yes"}, "mamba_conv_bias", "true or false"),
        (
            FALCON,
            {"mamba_rms_norm": True, "mamba_norm_before_gate": True},
            "mamba_norm_before_gate",
            "not modelled",
        ),
        (FALCON, {"projectors_bias": True}, "projectors_bias", "mamba_proj_bias"),
        (FALCON, {"mlp_multipliers": [1.0]}, "mlp_multipliers", "2 numbers"),
        (FALCON, {"mamba_d_ssm": 1000}, "mamba_d_head", "must equal"),
        (FALCON, {"mamba_d_state": 0}, "mamba_d_state", ">= 1"),
    ],
)
def test_bamba_bad_values_name_the_field(key: str, update: dict, field: str, words: str) -> None:
    with pytest.raises(GpumemInputError) as e:
        _spec({**_cfg(key), **update})
    text = str(e.value)
    assert field in text and words in text and "\n" not in text


@pytest.mark.parametrize(("key", "kv"), [(GRANITE, 16_384), (FALCON, 45_056)])
def test_bamba_transformers_estimate_counts_kv_and_state(key: str, kv: int) -> None:
    spec = _spec(_cfg(key))
    est = estimate_inference(spec, make_run(batch=2, seq=100))
    assert est.kv_cache_bytes == 2 * 100 * kv
    assert est.facts["state_bytes_per_sequence"] == sum(state_bytes_per_sequence_per_layer(spec))
