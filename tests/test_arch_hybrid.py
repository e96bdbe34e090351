"""Group hybrid of issue 14 (Qwen3-Next: gated DeltaNet layers beside gated attention): the reader, the fixed
per-sequence state against what transformers' cache holds (tests/reference/extra/recurrent_state.json,
validation/measure_recurrent_state.py), the replay's tape, the engines that refuse hybrid models, the CLI's
per-layer-type report, and one-line errors naming the field for bad values."""

from __future__ import annotations

import json

import pytest

from gpumem_gui.cli import main
from gpumem_gui.core import estimate_inference, make_run
from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.formats import weight_bytes
from gpumem_gui.core.readers.hf_config import spec_from_config
from gpumem_gui.core.replay.config import ReplayConfig, last_of_each_kind
from gpumem_gui.core.replay.forward import replay_forward, replay_forward_direct
from gpumem_gui.core.spec.kv import kv_bytes_per_token_per_layer, tokens_kept_transformers
from gpumem_gui.core.spec.params import count_params
from gpumem_gui.core.spec.state import (
    memory_by_layer_type,
    state_bytes_per_sequence,
    state_bytes_per_sequence_per_layer,
)
from gpumem_gui.core.training import estimate_training, make_training_run
from tests.conftest import REPO

EXTRA = REPO / "tests" / "reference" / "extra"
MEASURED = json.loads((EXTRA / "recurrent_state.json").read_text())["models"]


def _cfg(name: str) -> dict:
    return json.loads((EXTRA / "configs" / f"{name}.json").read_text())


NEXT = _cfg("Qwen__Qwen3-Next-80B-A3B-Instruct")
TINY = _cfg("synthetic__qwen3_next-tiny")


@pytest.mark.parametrize("name", sorted(MEASURED))
def test_state_equals_transformers_cache(name: str) -> None:
    spec = spec_from_config(_cfg(name), name=name)
    for seq in ("16", "200"):  # the state does not grow with the prompt
        m = MEASURED[name][seq]
        assert list(state_bytes_per_sequence_per_layer(spec)) == m["state_bytes_per_layer"]
        assert state_bytes_per_sequence(spec) == m["state_bytes_per_sequence"]
        assert list(kv_bytes_per_token_per_layer(spec)) == [kv // int(seq) for kv in m["kv_bytes_per_layer"]]


def test_qwen3_next_reader() -> None:
    spec = spec_from_config(NEXT, name="next")
    assert spec.layer_types.count("linear_attention") == 36 and spec.layer_types[3] == "full_attention"
    assert spec.rotary_dim == 64 and spec.attn_output_gate and spec.qk_norm == "per_head"
    assert spec.moe is not None and spec.moe.shared_expert_gate and spec.num_moe_layers == 48
    assert (
        spec.traits.norm_weight_offset and spec.traits.shared_expert_first and spec.traits.router_renormalize
    )
    assert count_params(spec).total == 79_674_391_296
    # the class defaults: full_attention_interval 4, 48 layers
    bare = {k: v for k, v in NEXT.items() if k not in ("layer_types", "full_attention_interval")}
    assert spec_from_config(bare, name="b").layer_types == spec.layer_types
    # a linear layer and a full-attention layer (both MoE): the inference replay runs one of each
    assert len(last_of_each_kind(spec).segments) == 2


def test_kv_counts_attention_layers_only() -> None:
    spec = spec_from_config(NEXT, name="next")
    kv = kv_bytes_per_token_per_layer(spec)
    assert kv[0] == 0 and kv[3] == 2 * 2 * 256 * 2 and sum(kv) == 12 * 2048
    assert tokens_kept_transformers(spec, 100)[:4] == (0, 0, 0, 100)
    rows = {r.layer_type: r for r in memory_by_layer_type(spec)}
    assert rows["linear_attention"].layers == 36 and rows["linear_attention"].kv_bytes_per_token == 0
    assert rows["full_attention"].state_bytes_per_sequence == 0
    assert rows["linear_attention"].state_bytes_per_sequence == 36 * (8192 * 4 * 2 + 32 * 128 * 128 * 4)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("linear_num_value_heads", 20),
        ("layer_types", ["linear_attention"] * 3),
        ("layer_types", ["mamba"] * 48),
        ("partial_rotary_factor", 1.5),
        ("hidden_act", "gelu"),
        ("num_experts_per_tok", 600),
        ("linear_conv_kernel_dim", 0),
        ("norm_topk_prob", "yes"),
    ],
)
def test_bad_values_name_the_field(field: str, value: object) -> None:
    with pytest.raises(GpumemInputError) as e:
        spec_from_config({**NEXT, field: value}, name="bad")
    assert field in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("b", "q", "past"), [(1, 1, 0), (2, 3, 0), (1, 63, 0), (1, 64, 0), (3, 65, 0), (1, 1, 500), (2, 40, 7)]
)
def test_tape_equals_the_replay(b: int, q: int, past: int) -> None:
    """The chunked prefill pads to a multiple of 64 tokens: a tape serves only lengths of the same chunk
    count (its guards), and evaluates to the op-by-op replay."""
    spec = spec_from_config(TINY, name="tiny")
    for attn in ("sdpa", "eager"):
        cfg = ReplayConfig(
            batch=b, q=q, past=past, param_dt="bf16", attn=attn, logits_to_keep=1, weights_counted=False
        )
        assert replay_forward(spec, cfg) == replay_forward_direct(spec, cfg)


def test_the_state_is_in_the_estimate() -> None:
    spec = spec_from_config(TINY, name="tiny")
    est = estimate_inference(spec, make_run(batch=3, seq=200, new_tokens=10))
    per = state_bytes_per_sequence(spec)
    assert est.facts["state_bytes"] == 3 * per and est.facts["state_bytes_per_sequence"] == per
    # the decode step finds every layer's state allocated (the prefill allocates them layer by layer)
    comp = next(c for c in est.phases["decode"].components if c.key == "recurrent_state")
    assert comp.bytes == 3 * per
    assert est.kv_cache_bytes == 3 * 210 * sum(kv_bytes_per_token_per_layer(spec))


@pytest.mark.parametrize(
    "fields", [{"engine": "ollama", "ollama_version": "0.12.10"}]
)  # vllm, llama.cpp, sglang, ollama 0.30+: test_engine_state, test_sglang_hybrid, test_ollama_server
def test_engines_without_a_state_pool_refuse(fields: dict[str, str]) -> None:
    spec = spec_from_config(TINY, name="tiny")
    with pytest.raises(GpumemInputError) as e:
        estimate_inference(spec, make_run(**fields))
    assert e.value.field == "engine"


def test_tensor_parallel_linear_attention_is_refused() -> None:
    spec = spec_from_config(TINY, name="tiny")
    with pytest.raises(GpumemInputError) as e:
        estimate_inference(spec, make_run(tp=2))
    assert e.value.field == "tp"
    with pytest.raises(GpumemInputError) as e:
        estimate_training(spec, make_training_run(tp=2, gpus=2))
    assert e.value.field == "tp"


def test_quantized_formats_keep_the_conv_and_decay_parameters() -> None:
    spec = spec_from_config(TINY, name="tiny")
    bf16 = weight_bytes(spec, "bf16").total_bytes
    assert bf16 == 2 * count_params(spec).total
    assert weight_bytes(spec, "nf4").total_bytes < bf16  # conv1d [c, 1, k] and A_log [hv] stay 16-bit


def test_cli_reports_state_per_layer_type(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(EXTRA / "configs" / "Qwen__Qwen3-Next-80B-A3B-Instruct.json")
    assert main(["inspect", path, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kv_cache_bytes_per_token"] == 24576
    assert (
        doc["state_bytes_per_sequence"]
        == MEASURED["Qwen__Qwen3-Next-80B-A3B-Instruct"]["16"]["state_bytes_per_sequence"]
    )
    kinds = {r["layer_type"]: r for r in doc["memory_by_layer_type"]}
    assert (
        kinds["full_attention"]["kv_bytes_per_token"] == 24576 and kinds["linear_attention"]["layers"] == 36
    )
    assert main(["inspect", path]) == 0
    out = capsys.readouterr().out
    assert "state B/sequence" in out and "77,856,768" in out
    assert main(["estimate", path, "--seq", "256"]) == 0
    assert "fixed state:" in capsys.readouterr().out


QWEN35 = _cfg("Qwen__Qwen3.5-9B")


def test_qwen3_5_reads_the_text_config_of_its_wrapper() -> None:
    """AutoModelForCausalLM builds Qwen3_5ForCausalLM from the wrapper's text_config (no vision tower)."""
    spec = spec_from_config(QWEN35, name="q")
    text = spec_from_config(QWEN35["text_config"], name="q")
    assert spec.model_copy(update={"model_type": "x"}) == text.model_copy(update={"model_type": "x"})
    assert spec.vision is None and count_params(spec).total == 8_953_803_264
    la = spec.linear_attention
    assert la is not None and la.split_projections and la.groups == 2
    assert spec.traits.rotary_mrope and spec.rotary_dim == 64 and spec.moe is None
    with pytest.raises(GpumemInputError) as e:
        spec_from_config({**QWEN35, "text_config": [1]}, name="bad")
    assert "text_config" in str(e.value)


def test_qwen3_5_moe_has_experts_on_every_layer() -> None:
    spec = spec_from_config(_cfg("Qwen__Qwen3.5-35B-A3B"), name="m")
    assert spec.moe is not None and spec.num_moe_layers == 40 and spec.moe.shared_expert_gate
    assert spec.traits.router_renormalize and spec.moe.experts_per_token == 8
    assert count_params(spec).total == 34_660_610_688


LFM2 = _cfg("LiquidAI__LFM2-1.2B")


def test_lfm2_reader() -> None:
    spec = spec_from_config(LFM2, name="lfm2")
    assert spec.layer_types.count("conv") == 10 and spec.layer_types[2] == "full_attention"
    assert spec.intermediate_size == 8192  # int(2 x 12288 / 3), rounded to a multiple of 256
    assert spec.short_conv is not None and spec.short_conv.kernel == 3 and spec.tie_word_embeddings
    assert dict(spec.traits.module_names)["gate_proj"] == "w1" and spec.qk_norm == "per_head"
    assert count_params(spec).total == 1_170_340_608  # the card's exact figure
    assert state_bytes_per_sequence(spec) == 10 * 2048 * 3 * 2  # conv state only, bf16
    assert spec_from_config({**LFM2, "block_auto_adjust_ff_dim": False}, name="x").intermediate_size == 12288


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("conv_L_cache", 0),
        ("full_attn_idxs", [2, 99]),
        ("block_ffn_dim_multiplier", "x"),
        ("layer_types", ["conv"] * 16 + ["x"]),
        ("conv_bias", 1),
    ],
)
def test_lfm2_bad_values_name_the_field(field: str, value: object) -> None:
    with pytest.raises(GpumemInputError) as e:
        spec_from_config({**LFM2, field: value}, name="bad")
    assert field in str(e.value) and "\n" not in str(e.value)
