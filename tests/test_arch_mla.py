"""Group mla of issue 14 (DeepSeek-V3.2's and GLM-5's DeepSeek Sparse Attention): what the readers take from a
config, the lightning indexer's weights and its key cache, GLM-5's layers that share the previous layer's
top-k, and one-line errors naming the field for bad values."""

from __future__ import annotations

import json

import pytest

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.readers.hf_config import spec_from_config
from gpumem_gui.core.replay.config import ReplayConfig
from gpumem_gui.core.replay.forward import replay_forward
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
    ],
)
def test_bad_values_name_the_field(cfg: dict, change: dict, field: str) -> None:
    with pytest.raises(GpumemInputError) as e:
        spec_from_config({**cfg, **change}, name="bad")
    msg = str(e.value)
    assert field in msg and "\n" not in msg
