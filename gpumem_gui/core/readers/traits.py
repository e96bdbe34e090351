"""Architecture traits per ``model_type``: what each transformers modeling file does differently from Llama's.

The one table that turns an architecture's name into :class:`~gpumem_gui.core.spec.model.ArchTraits`; every
reader (``config.json``, GGUF, the catalog) calls :func:`traits_for`, and nothing outside the readers looks at
``model_type``. Sources are the modeling files of transformers 5.24 (``models/<type>/modeling_<type>.py``)
named in each entry, and llama.cpp's architecture names (``src/llama-arch.cpp``) for ``gguf_arch``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpumem_gui.core.errors import GpumemInputError, short
from gpumem_gui.core.readers.config_fields import positive_number
from gpumem_gui.core.readers.new_types import NEW_CONFIG_TRAITS, NEW_TRAITS
from gpumem_gui.core.spec.model import ArchTraits

_GEMMA = {"embedding_scale": True, "norm_weight_offset": True}  # GemmaTextScaledWordEmbedding, GemmaRMSNorm
# FalconAttention / BloomAttention / GPTNeoXAttention: query_key_value, dense; their MLPs dense_h_to_4h,
# dense_4h_to_h
_QKV_DENSE = (
    ("qkv_proj", "query_key_value"),
    ("o_proj", "dense"),
    ("up_proj", "dense_h_to_4h"),
    ("down_proj", "dense_4h_to_h"),
)

# model_type -> trait values that differ from Llama's. fused_qkv also decides the GGUF layout:
# convert_hf_to_gguf.py keeps the fused projection as attn_qkv for Phi-3, Falcon, GPT-2, GPT-NeoX and BLOOM
# (gguf-py tensor_mapping.py MODEL_TENSOR.ATTN_QKV). gguf_arch "llama" is the only architecture with
# llama.cpp's LLM_TYPE_70B rules.
TRAITS: dict[str, dict[str, Any]] = {
    "llama": {"gguf_arch": "llama"},
    "granite": {"gguf_arch": "granite"},
    # llama.cpp converts Mistral and Mixtral checkpoints as LLM_ARCH_LLAMA (convert_hf_to_gguf.py)
    "mistral": {"gguf_arch": "llama"},
    "mixtral": {"gguf_arch": "llama"},
    "qwen2": {"gguf_arch": "qwen2"},
    # Qwen2MoeSparseMoeBlock: norm_topk_prob (Qwen2MoeConfig default False) leaves the top-k weights alone
    # Qwen2MoeSparseMoeBlock runs the shared expert first; Qwen2MoeModel always builds both masks
    "qwen2_moe": {
        "gguf_arch": "qwen2moe",
        "router_renormalize": False,
        "shared_expert_first": True,
        "sliding_mask_always": True,
    },
    "qwen3": {"gguf_arch": "qwen3"},
    "qwen3_moe": {"gguf_arch": "qwen3moe"},
    "gemma": {**_GEMMA, "gguf_arch": "gemma"},
    # Gemma2DecoderLayer: pre/post attention and pre/post feed-forward norms; attn_logit_softcapping in eager
    "gemma2": {**_GEMMA, "norm_placement": "sandwich", "gguf_arch": "gemma2"},
    # Gemma3TextModel: rotary_emb (global) and rotary_emb_local (sliding layers)
    "gemma3_text": {
        **_GEMMA,
        "norm_placement": "sandwich",
        "rotary_per_layer_type": True,
        "gguf_arch": "gemma3",
    },
    "gemma3": {**_GEMMA, "norm_placement": "sandwich", "rotary_per_layer_type": True, "gguf_arch": "gemma3"},
    # Phi3Attention.qkv_proj, Phi3MLP.gate_up_proj
    "phi3": {"fused_qkv": True, "fused_gate_up": True, "gguf_arch": "phi3"},
    # Olmo2DecoderLayer: post_attention_layernorm / post_feedforward_layernorm after each sublayer only
    "olmo2": {"norm_placement": "post", "gguf_arch": "olmo2"},
    # Starcoder2MLP c_fc / c_proj; residual_dropout on attention and MLP outputs, embedding_dropout
    "starcoder2": {
        "gguf_arch": "starcoder2",
        "module_names": (("up_proj", "c_fc"), ("down_proj", "c_proj")),
        "residual_dropout": True,
        "embedding_dropout": True,
    },
    # DeepseekV2/V3TopkRouter: fp32 router, weights left in fp32
    "deepseek_v2": {"gguf_arch": "deepseek2", "router": "fp32"},
    "deepseek_v3": {"gguf_arch": "deepseek2", "router": "fp32"},
    # GPT2Attention.c_attn; gpt2 eager_attention_forward keeps the softmax in the activation dtype; GPT2Model
    # .drop; GPT2Block keeps attn_output; GPT2Config attn/resid/embd_pdrop 0.1
    "gpt2": {
        "fused_qkv": True,
        # GPT2Attention c_attn / c_proj, GPT2MLP c_fc / c_proj (Conv1D, which PEFT adapts like nn.Linear)
        "module_names": (
            ("qkv_proj", "c_attn"),
            ("o_proj", "c_proj"),
            ("up_proj", "c_fc"),
            ("down_proj", "c_proj"),
        ),
        "eager_softmax_fp32": False,
        "residual_dropout": True,
        "embedding_dropout": True,
        "attn_output_kept": True,
        "hidden_dropout": 0.1,
        "attention_dropout": 0.1,
        "gguf_arch": "gpt2",
    },
    # OPTDecoderLayer dropouts (OPTConfig dropout 0.1)
    # OPTConfig: dropout 0.1 (hidden), attention_dropout 0.0
    "opt": {
        "residual_dropout": True,
        "hidden_dropout": 0.1,
        # OPTAttention out_proj, OPTDecoderLayer fc1 / fc2
        "module_names": (("o_proj", "out_proj"), ("up_proj", "fc1"), ("down_proj", "fc2")),
    },
    "bloom": {"fused_qkv": True, "block": "bloom", "gguf_arch": "bloom", "module_names": _QKV_DENSE},
    # FalconAttention: query_key_value, softmax in the activation dtype, a float mask always, K/V broadcast
    "falcon": {
        "fused_qkv": True,
        "eager_softmax_fp32": False,
        "always_mask": True,
        "sdpa_broadcast_kv": True,
        "block": "falcon",
        "gguf_arch": "falcon",
        "module_names": _QKV_DENSE,
    },
    # GPTNeoXAttention.query_key_value; GPTNeoXModel emb_dropout; GPTNeoXLayer post_attention/mlp_dropout
    "gpt_neox": {
        "fused_qkv": True,
        "module_names": _QKV_DENSE,
        "residual_dropout": True,
        "embedding_dropout": True,
        "gguf_arch": "gptneox",
    },
    **NEW_TRAITS,
}


# PEFT 0.21 on transformers 5 (peft/utils/transformers_weight_conversion.py ``_convert_peft_config_moe``,
# called by ``BaseTuner.inject_adapter``) renames v4 expert targets onto the fused stacks for the model types
# transformers' conversion_mapping.py ``_MODEL_TO_CONVERSION_PATTERN`` (5.24) maps to "mixtral" or "qwen2_moe"
# (PEFT adds mixtral itself; qwen2_moe, the pattern's own name, is not a key there and is left alone), with
# ``_MOE_TARGET_MODULE_MAPPING``'s names for each pattern
_PEFT_MIXTRAL = (("w1", "gate_up_proj"), ("w3", "gate_up_proj"), ("w2", "down_proj"))
_PEFT_QWEN2_MOE = (("gate_proj", "gate_up_proj"), ("up_proj", "gate_up_proj"), ("down_proj", "down_proj"))
_PEFT_EXPERT_TARGETS = {
    **dict.fromkeys(("mixtral", "minimax", "minimax_m2"), _PEFT_MIXTRAL),
    **dict.fromkeys(
        (
            "afmoe",
            "deepseek_v2",
            "deepseek_v3",
            "deepseek_v32",
            "dots1",
            "ernie4_5_moe",
            "glm4_moe",
            "glm4_moe_lite",
            "glm_moe_dsa",
            "glm4v_moe",
            "longcat_flash",
            "solar_open",
            "mellum",
            "qwen3_moe",
            "beam",
            "qwen3_omni_moe",
            "qwen3_omni_moe_thinker",
            "qwen3_omni_moe_text",
            "qwen3_next",
            "hunyuan_v1_moe",
            "flex_olmo",
            "olmoe",
            "sarvam_mla",
            "exaone_moe",
            "cohere2_moe",
        ),
        _PEFT_QWEN2_MOE,
    ),
}


# config keys of the dropout probabilities, first present wins (GPT-2's *_pdrop, OPT's dropout, Starcoder2's
# residual_dropout, BLOOM/Falcon/GPT-NeoX hidden_dropout); absent keys leave the config class's default
_HIDDEN_DROPOUT_KEYS = ("resid_pdrop", "residual_dropout", "hidden_dropout", "dropout")
_ATTENTION_DROPOUT_KEYS = ("attn_pdrop", "attention_dropout", "attention_probs_dropout_prob")


def _dropouts(cfg: Mapping[str, Any], source: str) -> dict[str, float]:
    out = {}
    for trait, keys in (
        ("hidden_dropout", _HIDDEN_DROPOUT_KEYS),
        ("attention_dropout", _ATTENTION_DROPOUT_KEYS),
    ):
        key = next((k for k in keys if cfg.get(k) is not None), None)
        if key is None:
            continue
        p = cfg[key]
        if isinstance(p, bool) or not isinstance(p, int | float) or not 0 <= p < 1:
            raise GpumemInputError(
                f"must be a probability in [0, 1), got {short(p)}", source=source, field=key
            )
        out[trait] = float(p)
    return out


def _ssm_state_dtype(cfg: Mapping[str, Any], source: str) -> dict[str, bool]:
    """A config naming the SSM state's dtype (Qwen3.5 ``mamba_ssm_dtype``, in its text_config too; Nemotron-H
    ``mamba_ssm_cache_dtype``), which vLLM's config hooks take when --mamba-ssm-cache-dtype is auto."""
    text = cfg.get("text_config")
    for where in (cfg, text if isinstance(text, Mapping) else {}):
        for key in ("mamba_ssm_dtype", "mamba_ssm_cache_dtype"):
            if key in where:
                v = where[key]
                if v not in ("float32", "float16", "bfloat16", "auto"):
                    raise GpumemInputError(
                        f"must be float32, float16, bfloat16 or auto, got {short(v)}",
                        source=source,
                        field=key,
                    )
                return {"vllm_ssm_state_fp32": v == "float32"}
    return {}


def traits_for(
    model_type: str, config: Mapping[str, Any] | None = None, source: str = "config"
) -> ArchTraits:
    """The traits of ``model_type``; ``config`` supplies the values a config file sets (Gemma-2's
    ``attn_logit_softcapping``, default 50.0 in Gemma2Config)."""
    values = dict(TRAITS.get(model_type, {}))
    cfg = config or {}
    values.update(_dropouts(cfg, source))
    if cfg.get("is_hybrid_swa") is True:  # SGLang's opt-in for hybrid-SWA pools (model_config.py)
        values["sglang_hybrid_swa"] = True
    if model_type in NEW_CONFIG_TRAITS:
        values.update(NEW_CONFIG_TRAITS[model_type](cfg, source))
    values.update(_ssm_state_dtype(cfg, source))
    if model_type in _PEFT_EXPERT_TARGETS:
        values["peft_expert_targets"] = _PEFT_EXPERT_TARGETS[model_type]
    if model_type == "gemma2":
        cap = cfg.get("attn_logit_softcapping", 50.0)
        values["attn_logit_softcapping"] = (
            positive_number(cap, source, "attn_logit_softcapping") if cap is not None else None
        )
    return ArchTraits(**values)
