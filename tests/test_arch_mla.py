"""Group mla of issue 14 (DeepSeek-V3.2's and GLM-5's DeepSeek Sparse Attention, Kimi-K2.5, Mistral-Small-4's
MLA): what the readers take from a config, the lightning indexer's weights and its key cache, GLM-5's layers
that share the previous layer's top-k, and one-line errors naming the field for bad values."""

from __future__ import annotations

import json

import pytest

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.readers.hf_config import spec_from_config
from gpumem_gui.core.replay.config import ReplayConfig
from gpumem_gui.core.replay.forward import replay_forward
from gpumem_gui.core.spec.compressed import (
    CompressedAttentionSpec,
    DeepseekV4Shape,
    cache_bytes,
    deepseek_v4_params,
)
from gpumem_gui.core.spec.kv import kv_bytes_per_token_per_layer, kv_cache_bytes_transformers
from gpumem_gui.core.spec.params import count_params
from tests.conftest import REPO

CONFIGS = REPO / "tests" / "reference" / "extra" / "configs"


def _cfg(name: str) -> dict:
    return json.loads((CONFIGS / f"{name}.json").read_text())


V32 = _cfg("deepseek-ai__DeepSeek-V3.2-Exp")
GLM5 = _cfg("zai-org__GLM-5")
V32_TINY = _cfg("synthetic__deepseek_v32-tiny")
GLM_TINY = _cfg("synthetic__glm_moe_dsa-tiny")
KIMI = _cfg("moonshotai__Kimi-K2.5")
SMALL4 = _cfg("mistralai__Mistral-Small-4-119B-2603")
M4_TINY = _cfg("synthetic__mistral4-tiny")


def test_v32_indexer_weights_and_key_cache() -> None:
    spec = spec_from_config(V32, name="v32")
    assert spec.mla is not None and spec.mla.indexer is not None
    ix = spec.mla.indexer
    assert (ix.n_heads, ix.head_dim, ix.topk) == (64, 128, 2048) and spec.traits.always_mask
    # DeepseekV32Indexer per layer: wq_b, wk, k_norm (weight and bias), weights_proj
    per_layer = 1536 * 64 * 128 + 7168 * 128 + 2 * 128 + 7168 * 64
    plain = spec.model_copy(update={"mla": spec.mla.model_copy(update={"indexer": None})})
    assert count_params(spec).total - count_params(plain).total == 61 * per_layer
    # the latent (512) and rope key (64) of MLA plus the indexer's own key (128), bf16, in every layer
    assert kv_bytes_per_token_per_layer(spec) == (2 * (512 + 64 + 128),) * 61


def test_v32_class_defaults_fill_a_sparse_config() -> None:
    bare = {"model_type": "deepseek_v32", "architectures": ["DeepseekV32ForCausalLM"]}
    assert (
        count_params(spec_from_config(bare, name="d")).total
        == count_params(spec_from_config(V32, name="v")).total
    )


def test_glm5_shared_layers_keep_no_indexer() -> None:
    spec = spec_from_config(GLM_TINY, name="glm")
    ix = spec.mla.indexer if spec.mla is not None else None
    assert ix is not None and ix.shared_layers == (1, 3) and ix.carries_topk
    full, shared = 2 * (64 + 32 + 16), 2 * (64 + 16)
    assert kv_bytes_per_token_per_layer(spec) == (full, shared, full, shared)
    assert sum(kv_cache_bytes_transformers(spec, 100)) == 100 * 2 * (full + shared)
    every = spec.model_copy(
        update={"mla": spec.mla.model_copy(update={"indexer": ix.model_copy(update={"shared_layers": ()})})}
    )
    per_layer = 96 * 4 * 32 + 256 * 32 + 2 * 32 + 256 * 4
    assert count_params(every).total - count_params(spec).total == 2 * per_layer
    # GLM-5 itself: every one of its 78 layers runs an indexer (index_topk_freq 1)
    assert spec_from_config(GLM5, name="g").mla.indexer.shared_layers == ()  # type: ignore[union-attr]


def test_glm_index_topk_pattern() -> None:
    cfg = {k: v for k, v in GLM_TINY.items() if not k.startswith("index_topk_freq")}
    spec = spec_from_config({**cfg, "index_topk_pattern": "FFSS"}, name="glm")
    assert spec.mla is not None and spec.mla.indexer is not None and spec.mla.indexer.shared_layers == (2, 3)


def test_the_indexer_costs_memory_in_the_replay() -> None:
    spec = spec_from_config(V32_TINY, name="v32")
    plain = spec.model_copy(update={"mla": spec.mla.model_copy(update={"indexer": None})})  # type: ignore[union-attr]
    run = ReplayConfig(batch=2, q=512, past=0, param_dt="bf16", attn="sdpa")
    # fp32 scores of 4 indexer heads over 512 x 512 tokens, and matmul's copy of the broadcast keys
    assert replay_forward(spec, run).peak > replay_forward(plain, run).peak + 2 * 512 * 4 * 512 * 4


def test_kimi_k25_text_model_and_moonvit() -> None:
    spec = spec_from_config(KIMI, name="kimi")
    assert spec.mla is not None and spec.mla.indexer is None and spec.moe is not None
    assert spec.moe.num_experts == 384 and spec.moe.dense_layers == (0,) and not spec.tie_word_embeddings
    assert spec.vision is not None
    # Kimi_K25VisionConfig defaults (the vt_* keys of the checkpoint are not read by transformers 5.24)
    h, inter = 1152, 4304
    layer = 4 * h + 4 * (h * h + h) + 2 * h * inter + inter + h
    assert spec.vision.tower_params == 3 * 14 * 14 * h + h + 64 * 64 * h + 27 * layer + 2 * h
    assert spec.vision.projector_params == 2 * h + 4 * h * 4 * h + 4 * h + 4 * h * 7168 + 7168
    # the same checkpoint with the vision tower's own (ignored) sizes changed counts the same
    odd = {**KIMI, "vision_config": {**KIMI["vision_config"], "vt_hidden_size": 64}}
    assert count_params(spec_from_config(odd, name="k")).total == count_params(spec).total


def test_mistral4_mla_moe_and_query_scale() -> None:
    spec = spec_from_config(M4_TINY, name="m4")
    assert spec.mla is not None and spec.moe is not None and spec.traits.query_position_scale
    assert spec.moe.dense_layers == (0,) and spec.moe.shared_expert_intermediate_size == 64
    # the latent (64) and the rope key (16) in bf16 per layer (DeepseekV3Attention's cache, 5.24)
    assert kv_bytes_per_token_per_layer(spec) == (2 * (64 + 16),) * 3
    # Mistral4Attention scales the queries (get_llama_4_attn_scale) in place of the cat's tensor, a transient
    # the traced points (tests/reference/trace, synthetic__mistral4-tiny) check with the rest of the replay


def test_mistral_small_4_wrapper() -> None:
    spec = spec_from_config(SMALL4, name="small4")
    assert spec.model_type == "mistral3" and spec.mla is not None and spec.vision is not None
    assert spec.traits.query_position_scale and spec.traits.gguf_arch is None
    assert spec.moe is not None and (spec.moe.num_experts, spec.moe.experts_per_token) == (128, 4)
    # the class defaults fill a bare mistral4 text_config; moe_layer_freq is not Mistral4Config's
    bare = {**SMALL4, "text_config": {"model_type": "mistral4", "moe_layer_freq": 2}}
    assert count_params(spec_from_config(bare, name="b")).total == count_params(spec).total


@pytest.mark.parametrize(
    ("cfg", "change", "field"),
    [
        (V32, {"index_n_heads": 0}, "index_n_heads"),
        (V32, {"index_head_dim": 32}, "index_head_dim"),
        (V32, {"index_topk": "many"}, "index_topk"),
        (V32, {"mlp_layer_types": ["dense"]}, "mlp_layer_types"),
        (GLM5, {"indexer_types": ["shared"] * 78}, "indexer_types"),
        (GLM5, {"indexer_types": ["full", "sparse"] * 39}, "indexer_types"),
        (GLM5, {"index_topk_pattern": "FX"}, "index_topk_pattern"),
        (GLM5, {"index_topk_freq": -1}, "index_topk_freq"),
        (KIMI, {"text_config": "deepseek"}, "text_config"),
        (KIMI, {"vision_config": [1]}, "vision_config"),
        (KIMI, {"vision_config": {"merge_kernel_size": [2]}}, "merge_kernel_size"),
        (KIMI, {"vision_config": {"hidden_size": 0}}, "hidden_size"),
        (M4_TINY, {"kv_lora_rank": 0}, "kv_lora_rank"),
        (M4_TINY, {"first_k_dense_replace": -1}, "first_k_dense_replace"),
        (SMALL4, {"text_config": {**SMALL4["text_config"], "n_routed_experts": "many"}}, "n_routed_experts"),
    ],
)
def test_bad_values_name_the_field(cfg: dict, change: dict, field: str) -> None:
    with pytest.raises(GpumemInputError) as e:
        spec_from_config({**cfg, **change}, name="bad")
    msg = str(e.value)
    assert field in msg and "\n" not in msg


V4_REF = json.loads((CONFIGS.parent / "compressed_cache.json").read_text())
_V4_KINDS = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}


def _v4_shape(c: dict) -> DeepseekV4Shape:
    """DeepseekV4Config.__post_init__: layer_types, else the legacy compress_ratios (cut to the layers)."""
    rates = c.get("compress_rates", {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128})
    kinds = c.get("layer_types") or [_V4_KINDS[r] for r in c["compress_ratios"][: c["num_hidden_layers"]]]
    attention = CompressedAttentionSpec(
        layer_types=tuple(kinds),
        head_dim=c["head_dim"],
        index_head_dim=c["index_head_dim"],
        sliding_window=c["sliding_window"],
        csa_rate=rates["compressed_sparse_attention"],
        hca_rate=rates["heavily_compressed_attention"],
    )
    fields = ("hidden_size", "vocab_size", "num_attention_heads", "q_lora_rank", "o_groups", "o_lora_rank")
    more = ("index_n_heads", "moe_intermediate_size", "n_routed_experts", "hc_mult")
    return DeepseekV4Shape(attention=attention, **{k: c[k] for k in fields + more})


def test_deepseek_v4_cache_is_a_rule_of_the_length() -> None:
    for p in V4_REF["points"]:
        spec = _v4_shape(V4_REF["configs"][p["config"]]).attention
        assert list(cache_bytes(spec, p["tokens"], p["batch"])) == p["per_layer_bytes"], p
    # DeepSeek-V4-Flash: 6,880 B per token once the windows are full (21 CSA layers x 320 + 20 HCA x 8),
    # against 1,024 B per token and layer (2,048 on the two sliding-only layers) for the first ones
    flash = _v4_shape(V4_REF["configs"]["deepseek-ai__DeepSeek-V4-Flash-Base"]).attention
    assert sum(cache_bytes(flash, 1024 + 512)) - sum(cache_bytes(flash, 1024)) == 512 * 6880
    assert sum(cache_bytes(flash, 1 << 20)) == 7_220_377_600


def test_deepseek_v4_parameters_equal_transformers() -> None:
    for key, want in V4_REF["parameters"].items():
        if key != "about":
            assert deepseek_v4_params(_v4_shape(V4_REF["configs"][key])) == (want["total"], want["fp32"]), key


def test_the_trace_worker_builds_mistral4_by_its_pretraining_class() -> None:
    """transformers 5.24 maps mistral4 under AutoModelForPreTraining only (Mistral4ForCausalLM)."""
    transformers = pytest.importorskip("transformers")
    from gpumem_gui.trace.gpumem_trace_worker.seq2seq import auto_class

    assert auto_class(transformers.Mistral4Config()) is transformers.AutoModelForPreTraining
    assert auto_class(transformers.DeepseekV3Config()) is transformers.AutoModelForCausalLM
