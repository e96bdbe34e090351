"""Readers of the model types issue 14 adds, group dense_b: the fields each transformers config class uses and
its defaults (``models/<type>/configuration_<type>.py``, transformers 5.24), and each type's traits
(``models/<type>/modeling_<type>.py``). The multimodal Mistral-3 wrapper and GPT-BigCode are in
:mod:`.hf_new_dense_b_2`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.readers import hf_new_dense_b_2 as part2
from gpumem_gui.core.readers.config_fields import ConfigReader, common, rotary_factor


def _glm(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    """GlmConfig / Glm4Config: head_dim 128 and 2 KV heads by default (the class attributes, not hidden /
    heads); attention_bias (default True) on q/k/v, o_proj without; fused gate_up_proj; partial rotary
    (``partial_rotary_factor`` 0.5 by default, ``Glm4RotaryEmbedding`` dim = int(head_dim x factor)).
    Glm4DecoderLayer adds post_self_attn_layernorm and post_mlp_layernorm: four norms a layer."""
    f = common(r, name, mt, qkv_bias=r.bool("attention_bias", default=True), o_bias=False)
    f["num_kv_heads"] = r.int("num_key_value_heads", default=2)
    f["head_dim"] = r.int("head_dim", default=128)
    f["max_position_embeddings"] = r.int("max_position_embeddings", default=131072)
    f["tie_word_embeddings"] = r.bool("tie_word_embeddings", default=False)
    rd = int(f["head_dim"] * rotary_factor(r, 0.5))
    if rd < 2 or rd % 2:
        raise GpumemInputError(
            f"gives {rd} rotary channels of head_dim {f['head_dim']}; need an even number",
            source=r.source,
            field="partial_rotary_factor",
        )
    f["rotary_dim"] = rd if rd < f["head_dim"] else None
    if mt == "glm4":
        f["norms_per_layer"] = 4
    return f


def _internlm3(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    """InternLM3Config (a LlamaConfig built as LlamaForCausalLM, models/auto/modeling_auto.py): attribute_map
    qkv_bias -> attention_bias, bias -> mlp_bias, which must agree (validate_architecture); 2 KV heads and
    head_dim 128 by default."""
    attn_bias = r.bool("attention_bias", "qkv_bias", default=False)
    mlp_bias = r.bool("mlp_bias", "bias", default=False)
    if attn_bias != mlp_bias:
        raise GpumemInputError(
            f"({mlp_bias}) must equal qkv_bias / attention_bias ({attn_bias}) (InternLM3Config)",
            source=r.source,
            field="bias",
        )
    f = common(r, name, mt, qkv_bias=attn_bias, o_bias=attn_bias, mlp_bias=mlp_bias)
    f["num_kv_heads"] = r.int("num_key_value_heads", default=2)
    f["head_dim"] = r.int("head_dim", default=128)
    f["max_position_embeddings"] = r.int("max_position_embeddings", default=32768)
    f["tie_word_embeddings"] = r.bool("tie_word_embeddings", default=False)
    return f


def _seed_oss(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    """SeedOssConfig: attention_bias (default True) on q/k/v, attention_out_bias (default False) on o_proj,
    mlp_bias (default False); 8 KV heads, head_dim 128 by default."""
    f = common(
        r,
        name,
        mt,
        qkv_bias=r.bool("attention_bias", default=True),
        o_bias=r.bool("attention_out_bias", default=False),
        mlp_bias=r.bool("mlp_bias", default=False),
    )
    f["num_kv_heads"] = r.int("num_key_value_heads", default=f["num_attention_heads"])
    f["head_dim"] = r.int("head_dim", default=128)
    f["max_position_embeddings"] = r.int("max_position_embeddings", default=524288)
    f["tie_word_embeddings"] = r.bool("tie_word_embeddings", default=False)
    return f


def _hunyuan(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    """HunYuanDenseV1Config: attention_bias on q/k/v/o; query_layernorm / key_layernorm over head_dim (applied
    after the rotary, HunYuanDenseV1Attention.forward). HunYuanDenseV1Attention reads config.head_dim, which
    the class defaults to None: a file without it cannot be built."""
    bias = r.bool("attention_bias", default=False)
    f = common(r, name, mt, qkv_bias=bias, o_bias=bias, qk_norm="per_head")
    f["head_dim"] = r.int("head_dim")
    f["tie_word_embeddings"] = r.bool("tie_word_embeddings", default=False)
    return f


def _ernie4_5(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    """Ernie4_5Config: use_bias (default False) on every q/k/v/o and MLP projection; tied embeddings by
    default; 2 KV heads, head_dim 128 by default."""
    bias = r.bool("use_bias", default=False)
    f = common(r, name, mt, qkv_bias=bias, o_bias=bias, mlp_bias=bias)
    f["num_kv_heads"] = r.int("num_key_value_heads", default=2)
    f["head_dim"] = r.int("head_dim", default=128)
    f["max_position_embeddings"] = r.int("max_position_embeddings", default=131072)
    f["tie_word_embeddings"] = r.bool("tie_word_embeddings", default=True)
    return f


def _seed_oss_dropouts(cfg: Mapping[str, Any], source: str) -> dict[str, Any]:
    """SeedOssConfig defaults attention_dropout and residual_dropout to 0.1 (a file leaving them out)."""
    out: dict[str, Any] = {}
    if cfg.get("residual_dropout") is None:
        out["hidden_dropout"] = 0.1
    if cfg.get("attention_dropout") is None:
        out["attention_dropout"] = 0.1
    return out


def _ernie_dropouts(cfg: Mapping[str, Any], source: str) -> dict[str, Any]:
    """Ernie4_5Attention fixes attention_dropout = 0.0 whatever the config says."""
    return {"attention_dropout": 0.0}


# model_type -> reader (ConfigReader, name, model_type) -> ModelSpec fields
READERS: dict[str, Callable[[ConfigReader, str, str], dict[str, Any]]] = {
    "glm": _glm,
    "glm4": _glm,
    "internlm3": _internlm3,
    "seed_oss": _seed_oss,
    "hunyuan_v1_dense": _hunyuan,
    "ernie4_5": _ernie4_5,
    **part2.READERS,
}
# model_type -> ArchTraits values that differ from Llama's
TRAITS: dict[str, dict[str, Any]] = {
    # GlmMLP / Glm4MLP gate_up_proj chunked; apply_rotary_pos_emb over interleaved pairs of the first
    # rotary_dim channels; llama.cpp: LLM_ARCH_CHATGLM ("chatglm") for glm, LLM_ARCH_GLM4 ("glm4")
    "glm": {"fused_gate_up": True, "rope_interleaved": True, "gguf_arch": "chatglm"},
    # Glm4DecoderLayer: input_layernorm, post_self_attn_layernorm, post_attention_layernorm,
    # post_mlp_layernorm
    "glm4": {
        "fused_gate_up": True,
        "rope_interleaved": True,
        "norm_placement": "sandwich",
        "gguf_arch": "glm4",
    },
    # built as LlamaForCausalLM; llama.cpp converts InternLM3 as LLM_ARCH_LLAMA
    "internlm3": {"gguf_arch": "llama"},
    # SeedOssAttention / SeedOssMLP: nn.functional.dropout(residual_dropout) on both outputs
    "seed_oss": {"residual_dropout": True, "gguf_arch": "seed_oss"},
    # HunYuanDenseV1Attention: query_layernorm / key_layernorm after apply_rotary_pos_emb
    "hunyuan_v1_dense": {"qk_norm_after_rope": True, "gguf_arch": "hunyuan-dense"},
    # Ernie4_5RotaryEmbedding keeps cos/sin in fp32; apply_rotary_pos_emb: interleaved, in fp32, cast back
    "ernie4_5": {"rope_interleaved": True, "rope_fp32": True, "gguf_arch": "ernie4_5"},
    **part2.TRAITS,
}
# model_type -> (config, source) -> trait values a config file sets
CONFIG_TRAITS: dict[str, Callable[[Mapping[str, Any], str], dict[str, Any]]] = {
    "seed_oss": _seed_oss_dropouts,
    "ernie4_5": _ernie_dropouts,
    **part2.CONFIG_TRAITS,
}
