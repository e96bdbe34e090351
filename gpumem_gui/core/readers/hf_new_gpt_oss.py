"""Readers of the model types issue 14 adds, group gpt_oss: the fields each transformers config class uses and
its defaults (``models/<type>/configuration_<type>.py``, transformers 5.24), and each type's traits
(``models/<type>/modeling_<type>.py``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.readers.config_fields import ConfigReader, common, layer_types_explicit, positive_number
from gpumem_gui.core.readers.hf_modern import _moe

# GptOssConfig's class defaults (models/gpt_oss/configuration_gpt_oss.py), for the keys a file leaves out
_GPT_OSS_DEFAULTS: dict[str, Any] = {
    "num_hidden_layers": 36,
    "num_local_experts": 128,
    "vocab_size": 201088,
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "head_dim": 64,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "max_position_embeddings": 131072,
    "num_experts_per_tok": 4,
    "hidden_act": "silu",
}


def _gpt_oss(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    """GptOssForCausalLM: q/k/v/o biases (attention_bias, default True), a sink logit per head, layers
    alternating sliding (even) and full (odd) attention (GptOssConfig.__post_init__), every layer a MoE of
    ``num_local_experts`` (attribute_map ``num_experts``) experts of ``intermediate_size`` with biases and a
    router with a bias (GptOssExperts, GptOssTopKRouter)."""
    d = ConfigReader({**_GPT_OSS_DEFAULTS, **r.cfg}, r.source)
    bias = d.bool("attention_bias", default=True)
    f = common(d, name, mt, qkv_bias=bias, o_bias=bias, attention_sinks=True)
    f["tie_word_embeddings"] = d.bool("tie_word_embeddings", default=False)
    n = f["num_layers"]
    window = d.window(128)  # GptOssConfig.sliding_window = 128
    types = layer_types_explicit(d, n) or tuple(
        "sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)
    )
    if "sliding_attention" in types and window is None:
        raise GpumemInputError(
            "is null but layer_types has sliding layers", source=r.source, field="sliding_window"
        )
    f["layer_types"], f["sliding_window"] = types, window
    # attribute_map: a file's num_experts sets num_local_experts
    experts_key = "num_experts" if "num_experts" in r.cfg and "num_local_experts" not in r.cfg else None
    f["moe"] = _moe(
        d,
        experts_key or "num_local_experts",
        expert_intermediate_size=f["intermediate_size"],
        router_bias=True,
        expert_bias=True,
    )
    for key, default in (("swiglu_alpha", 1.702), ("swiglu_limit", 7.0)):  # GptOssConfig defaults
        positive_number(d.get(key, default=default), r.source, key)  # values that change no byte, checked
    return f


# model_type -> reader (ConfigReader, name, model_type) -> ModelSpec fields
READERS: dict[str, Callable[[ConfigReader, str, str], dict[str, Any]]] = {"gpt_oss": _gpt_oss}
# model_type -> ArchTraits values that differ from Llama's
TRAITS: dict[str, dict[str, Any]] = {
    # GptOssPreTrainedModel (_supports_sdpa False), GptOssRotaryEmbedding / _apply_rotary_emb, GptOssRMSNorm,
    # GptOssTopKRouter, GptOssExperts._apply_gate; llama.cpp LLM_ARCH_OPENAI_MOE ("gpt-oss"); SGLang lists
    # GptOssForCausalLM as hybrid-SWA (model_config.py is_hybrid_swa_model)
    "gpt_oss": {
        "sdpa_supported": False,
        "rotary_half_tables": True,
        "norm_product_fp32": True,
        "router_topk_softmax": True,
        "experts_gate": "clamped_swiglu",
        "gguf_arch": "gpt-oss",
        "sglang_hybrid_swa": True,
    },
}
# model_type -> (config, source) -> trait values a config file sets
CONFIG_TRAITS: dict[str, Callable[[Mapping[str, Any], str], dict[str, Any]]] = {}
