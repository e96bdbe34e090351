"""Readers of the model types issue 14 adds, group mla: MLA variants (transformers 5.24
``models/<type>/configuration_<type>.py`` for the fields and defaults, ``modeling_<type>.py`` for the
layers): DeepSeek-V3.2's sparse attention (``deepseek_v32``: MLA plus a lightning indexer per layer) and
GLM-5's (``glm_moe_dsa``: the same, with layers that may share the previous layer's top-k), Kimi-K2.5's
wrapped DeepSeek-V3 text model and MoonViT (``kimi_k25``), and Mistral-Small-4's MLA (``mistral4``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpumem_gui.core.errors import GpumemInputError, short
from gpumem_gui.core.readers.config_fields import ConfigReader
from gpumem_gui.core.readers.hf_modern import _deepseek
from gpumem_gui.core.spec.dsa import IndexerSpec
from gpumem_gui.core.spec.model import MAX_SIZE, MLASpec, VisionSpec

# model_type -> reader (ConfigReader, name, model_type) -> ModelSpec fields
READERS: dict[str, Callable[[ConfigReader, str, str], dict[str, Any]]] = {}
# model_type -> ArchTraits values that differ from Llama's
TRAITS: dict[str, dict[str, Any]] = {}
# model_type -> (config, source) -> trait values a config file sets
CONFIG_TRAITS: dict[str, Callable[[Mapping[str, Any], str], dict[str, Any]]] = {}

# models/deepseek_v32/configuration_deepseek_v32.py DeepseekV32Config: the class defaults of the fields a
# published config may leave out (DeepSeek-V3.2-Exp's shape)
_V32_DEFAULTS: dict[str, Any] = {
    "vocab_size": 129280,
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "n_shared_experts": 1,
    "n_routed_experts": 256,
    "kv_lora_rank": 512,
    "q_lora_rank": 1536,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "qk_nope_head_dim": 128,
    "num_experts_per_tok": 8,
    "max_position_embeddings": 163840,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "attention_bias": False,
    "index_topk": 2048,
    "index_head_dim": 128,
    "index_n_heads": 64,
    "first_k_dense_replace": 3,
}


def _with_defaults(r: ConfigReader, defaults: Mapping[str, Any]) -> ConfigReader:
    """The config read with its class's defaults for the fields it leaves out (a null keeps the default)."""
    return ConfigReader({**defaults, **{k: v for k, v in r.cfg.items() if v is not None}}, r.source)


def _mlp_dense_layers(r: ConfigReader, n_layers: int, first: int) -> tuple[int, ...]:
    """``mlp_layer_types`` ("dense" / "sparse" per layer), else the first ``first_k_dense_replace`` layers
    dense (DeepseekV32Config.__post_init__; DeepseekV32DecoderLayer picks DeepseekV32MoE for "sparse")."""
    types = r.get("mlp_layer_types", default=None)
    if types is None:
        return tuple(range(min(first, n_layers)))
    if not isinstance(types, list) or len(types) != n_layers or not set(types) <= {"dense", "sparse"}:
        raise GpumemInputError(
            f"must list 'dense' or 'sparse' for each of the {n_layers} layers, got {short(types)}",
            source=r.source,
            field="mlp_layer_types",
        )
    return tuple(i for i, t in enumerate(types) if t == "dense")


def _indexer(r: ConfigReader) -> IndexerSpec:
    ix = IndexerSpec(
        n_heads=r.int("index_n_heads"), head_dim=r.int("index_head_dim"), topk=r.int("index_topk")
    )
    rot = r.int("qk_rope_head_dim")
    if ix.head_dim < rot:  # DeepseekV32Indexer splits [qk_rope_head_dim, head_dim - qk_rope_head_dim]
        raise GpumemInputError(
            f"must be at least qk_rope_head_dim ({rot}), got {ix.head_dim}",
            source=r.source,
            field="index_head_dim",
        )
    return ix


def _deepseek_v32(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    # DeepseekV32Attention (AXK1Attention): always a q LoRA (q_a_proj, q_a_layernorm, q_b_proj), the MLA
    # latent cache, plus DeepseekV32Indexer (wq_b over the q LoRA residual, wk, k_norm, weights_proj)
    r = _with_defaults(r, _V32_DEFAULTS)
    f = _deepseek(r, name, mt)
    mla: MLASpec = f["mla"]
    f["mla"] = mla.model_copy(update={"indexer": _indexer(r)})
    moe = f["moe"]
    first = r.int("first_k_dense_replace", minimum=0)
    f["moe"] = moe.model_copy(update={"dense_layers": _mlp_dense_layers(r, f["num_layers"], first)})
    return f


READERS["deepseek_v32"] = _deepseek_v32
# DeepseekV32TopkRouter: fp32 router like DeepseekV3's; DeepseekV32Model.forward: create_causal_mask with
# allow_is_causal_skip=False (the indexer needs causality), so SDPA always gets the materialised mask
TRAITS["deepseek_v32"] = {"router": "fp32", "always_mask": True}


# models/glm_moe_dsa/configuration_glm_moe_dsa.py GlmMoeDsaConfig (a DeepseekV32Config): its own defaults
_GLM_DSA_DEFAULTS: dict[str, Any] = {
    **_V32_DEFAULTS,
    "vocab_size": 154880,
    "hidden_size": 6144,
    "intermediate_size": 12288,
    "num_hidden_layers": 78,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "q_lora_rank": 2048,
    "v_head_dim": 256,
    "qk_nope_head_dim": 192,
    "max_position_embeddings": 202752,
    "index_n_heads": 32,
}


def _indexer_types(r: ConfigReader, n_layers: int) -> list[Any]:
    """GlmMoeDsaConfig.__post_init__: ``indexer_types``, else ``index_topk_pattern`` ('F'/'S' per layer),
    else full where ``max(i - index_skip_topk_offset + 1, 0) % index_topk_freq == 0`` (defaults 2 and 1:
    every layer full)."""
    types = r.get("indexer_types", default=None)
    if types is not None:
        return list(types) if isinstance(types, list) else [types]
    pattern = r.get("index_topk_pattern", default=None)
    if pattern is not None:
        if isinstance(pattern, str):
            return [{"F": "full", "S": "shared"}.get(c, c) for c in pattern]
        return list(pattern) if isinstance(pattern, list) else [pattern]
    freq = max(r.int("index_topk_freq", default=1, minimum=0), 1)
    offset = r.int("index_skip_topk_offset", default=2, minimum=0)
    return ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(n_layers)]


def _shared_layers(r: ConfigReader, n_layers: int) -> tuple[int, ...]:
    types = _indexer_types(r, n_layers)
    field = "indexer_types" if r.get("indexer_types", default=None) is not None else "index_topk_pattern"
    if len(types) != n_layers or not set(types) <= {"full", "shared"} or types[0] != "full":
        raise GpumemInputError(
            f"must give 'full' or 'shared' for each of the {n_layers} layers, the first 'full' (a shared "
            f"layer reuses the previous layer's top-k), got {short(types)}",
            source=r.source,
            field=field,
        )
    return tuple(i for i, t in enumerate(types) if t == "shared")


def _glm_moe_dsa(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    # GlmMoeDsaAttention: DeepseekV32Attention whose "shared" layers build no GlmMoeDsaIndexer and reuse the
    # previous layer's top-k, which GlmMoeDsaModel's loop carries from layer to layer
    r = _with_defaults(r, _GLM_DSA_DEFAULTS)
    f = _deepseek_v32(r, name, mt)
    ix = f["mla"].indexer.model_copy(
        update={"shared_layers": _shared_layers(r, f["num_layers"]), "carries_topk": True}
    )
    f["mla"] = f["mla"].model_copy(update={"indexer": ix})
    return f


READERS["glm_moe_dsa"] = _glm_moe_dsa
# GlmMoeDsaTopkRouter: fp32 router; GlmMoeDsaModel.forward: allow_is_causal_skip=False as DeepSeek-V3.2
TRAITS["glm_moe_dsa"] = {"router": "fp32", "always_mask": True}


# models/kimi_k25/configuration_kimi_k25.py Kimi_K25VisionConfig: the class defaults (MoonViT of Kimi-K2.5).
# transformers 5.24 reads these names only: a checkpoint's remote-code keys (vt_hidden_size,
# init_pos_emb_height, ...) are not mapped onto them, so the tower is built from these defaults
_KIMI_VISION = {
    "patch_size": 14,
    "pos_emb_height": 64,
    "pos_emb_width": 64,
    "num_hidden_layers": 27,
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "merge_kernel_size": [2, 2],
}
# DeepseekV3Config (models/deepseek_v3/configuration_deepseek_v3.py): the text_config's class
_V3_DEFAULTS = {k: v for k, v in _V32_DEFAULTS.items() if not k.startswith("index_")} | {
    "max_position_embeddings": 4096
}


def _kimi_vision(r: ConfigReader, v: ConfigReader, text_hidden: int) -> VisionSpec:
    """Kimi_K25VisionModel: patch_embed.proj Conv2d(3, h, patch, patch) with bias, the learned
    pos_emb.position_embeddings [height, width, h] (the time table is a buffer), per
    Kimi_K25VisionEncoderLayer two LayerNorms, q/k/v/proj Linear(h, h) and fc1/fc2 with biases,
    final_layernorm; the rotary table is a buffer. Kimi_K25MultimodalProjection: pre_norm
    LayerNorm(projection_hidden_size), in_proj
    Linear(h m, h m) and out_proj Linear(h m, text hidden), biased (m = the merge kernel's cells)."""
    h, inter, p = v.int("hidden_size"), v.int("intermediate_size"), v.int("patch_size")
    kernel = v.get("merge_kernel_size")
    if (
        not isinstance(kernel, list | tuple)
        or len(kernel) != 2
        or not all(isinstance(k, int) and k > 0 for k in kernel)
    ):
        raise GpumemInputError(
            f"must be two positive integers, got {short(kernel)}", source=v.source, field="merge_kernel_size"
        )
    pos = v.int("pos_emb_height") * v.int("pos_emb_width") * h
    layer = 4 * h + 4 * (h * h + h) + (h * inter + inter) + (inter * h + h)
    tower = (3 * p * p * h + h) + pos + v.int("num_hidden_layers") * layer + 2 * h
    hm = h * kernel[0] * kernel[1]
    projector = (
        2 * r.int("projection_hidden_size", default=1152) + (hm * hm + hm) + (hm * text_hidden + text_hidden)
    )
    for what, n in (("vision tower", tower), ("projector", projector)):
        if n > MAX_SIZE:
            raise GpumemInputError(
                f"the {what} would have {n:,} parameters; gpumem describes up to {MAX_SIZE:,}",
                source=r.source,
                field="vision_config",
            )
    # the position table is an nn.Parameter read by F.embedding_bag, not an nn.Embedding: in the tower's
    # count, not among the embedding tables (position_embedding_params)
    return VisionSpec(kind="moonvit", tower_params=tower, projector_params=projector)


def _kimi_k25(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    # Kimi_K25Config: text_config a DeepseekV3Config (model_type kimi_k2 is read as deepseek_v3),
    # vision_config a Kimi_K25VisionConfig; Kimi_K25ForConditionalGeneration's lm_head tied by
    # tie_word_embeddings (default True)
    parts = {}
    for key in ("text_config", "vision_config"):
        sub = r.get(key, default={})
        if not isinstance(sub, dict):
            raise GpumemInputError("must be an object", source=r.source, field=key)
        parts[key] = sub
    tr = ConfigReader(
        {**_V3_DEFAULTS, **{k: v for k, v in parts["text_config"].items() if v is not None}},
        f"{r.source} (text_config)",
    )
    f = _deepseek(tr, name, "deepseek_v3")
    f["tie_word_embeddings"] = r.bool("tie_word_embeddings", default=True)
    vr = ConfigReader(
        {**_KIMI_VISION, **{k: v for k, v in parts["vision_config"].items() if k in _KIMI_VISION}},
        f"{r.source} (vision_config)",
    )
    f["vision"] = _kimi_vision(r, vr, f["hidden_size"])
    f["model_type"] = mt
    return f


READERS["kimi_k25"] = _kimi_k25
# the language model is DeepseekV3ForCausalLM's (fp32 router)
TRAITS["kimi_k25"] = {"router": "fp32"}


# models/mistral4/configuration_mistral4.py Mistral4Config: the class defaults (the config of
# mistralai/Mistral-Small-4-119B-2603, the checkpoint its docstring names)
_MISTRAL4_DEFAULTS: dict[str, Any] = {
    "vocab_size": 131072,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "n_shared_experts": 1,
    "n_routed_experts": 128,
    "kv_lora_rank": 256,
    "q_lora_rank": 1024,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "qk_nope_head_dim": 64,
    "num_experts_per_tok": 4,
    "first_k_dense_replace": 0,
    "max_position_embeddings": 1048576,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "attention_bias": False,
}


def mistral4(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    """Mistral4ForCausalLM (DeepseekV3ForCausalLM's code): Mistral4Attention is DeepseekV3Attention (the MLA
    latent cached) whose queries are scaled by get_llama_4_attn_scale; Mistral4DecoderLayer builds
    Mistral4MoE from layer ``first_k_dense_replace`` on (no ``moe_layer_freq``: a file's key is ignored);
    Mistral4TopkRouter's weight has the model dtype and no correction bias (no parameter either way)."""
    cfg = {k: v for k, v in r.cfg.items() if k != "moe_layer_freq"}
    return _deepseek(_with_defaults(ConfigReader(cfg, r.source), _MISTRAL4_DEFAULTS), name, mt)


READERS["mistral4"] = mistral4
# Mistral4TopkRouter: logits in the activation dtype, replayed as TopKRouter's (the router's softmax and group
# mask stay in that dtype: a few [tokens, experts] tensors, within 0.05 % on the traces of
# synthetic__mistral4-tiny); Mistral4Attention: query_states * get_llama_4_attn_scale(...)
TRAITS["mistral4"] = {"query_position_scale": True}
