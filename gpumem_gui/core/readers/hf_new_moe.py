"""Readers of the model types issue 14 adds, group moe: the fields each transformers config class uses and
its defaults (``models/<type>/configuration_<type>.py``, transformers 5.24), and each type's traits
(``models/<type>/modeling_<type>.py``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpumem_gui.core.errors import GpumemInputError, short
from gpumem_gui.core.readers.config_fields import (
    ConfigReader,
    common,
    layer_types_explicit,
    rotary_factor,
    uniform_sliding,
)
from gpumem_gui.core.readers.hf_modern import _moe
from gpumem_gui.core.spec.model import MoESpec

# model_type -> reader (ConfigReader, name, model_type) -> ModelSpec fields
READERS: dict[str, Callable[[ConfigReader, str, str], dict[str, Any]]] = {}
# model_type -> ArchTraits values that differ from Llama's
TRAITS: dict[str, dict[str, Any]] = {}
# model_type -> (config, source) -> trait values a config file sets
CONFIG_TRAITS: dict[str, Callable[[Mapping[str, Any], str], dict[str, Any]]] = {}


def _config_bool(cfg: Mapping[str, Any], source: str, key: str, default: bool) -> bool:
    v = cfg.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise GpumemInputError(f"must be true or false, got {short(v)}", source=source, field=key)
    return v


def _jitter(cfg: Mapping[str, Any], source: str, key: str) -> bool:
    """Whether a jitter-noise setting (a number in [0, 1), default 0.0) is on."""
    v = cfg.get(key)
    if v is None:
        return False
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < 1:
        raise GpumemInputError(f"must be a number in [0, 1), got {short(v)}", source=source, field=key)
    return v > 0


def _defaults(r: ConfigReader, **values: Any) -> ConfigReader:
    """The config read with its class's defaults for the MoE fields it may leave out (a null keeps the
    default too, as ConfigReader.get skips nulls)."""
    return ConfigReader({**values, **{k: v for k, v in r.cfg.items() if v is not None}}, r.source)


def _norm_topk(default: bool) -> Callable[[Mapping[str, Any], str], dict[str, Any]]:
    """``norm_topk_prob``: the top-k weights renormalised in place (the router's ``/=``), with the config
    class's default."""
    return lambda cfg, source: {"router_renormalize": _config_bool(cfg, source, "norm_topk_prob", default)}


def _olmoe(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    # OlmoeConfig: attention_bias -> q/k/v/o biases; tie_word_embeddings False; every layer an
    # OlmoeSparseMoeBlock of num_experts (alias num_local_experts) experts of intermediate_size.
    # OlmoeAttention: q_norm over hidden_size, k_norm over (hidden / heads) x kv heads (the full projections)
    bias = r.bool("attention_bias", default=False)
    f = common(r, name, mt, qkv_bias=bias, o_bias=bias, qk_norm="full_width")
    f["head_dim"] = r.head_dim(f["hidden_size"], f["num_attention_heads"])
    f["tie_word_embeddings"] = r.bool("tie_word_embeddings", default=False)
    f["max_position_embeddings"] = r.int("max_position_embeddings", default=4096)
    key = "num_local_experts" if "num_local_experts" in r.cfg else "num_experts"
    f["moe"] = _moe(
        _defaults(r, **{key: 64, "num_experts_per_tok": 8}),
        key,
        expert_intermediate_size=f["intermediate_size"],
    )
    return f


READERS["olmoe"] = _olmoe
# llama.cpp LLM_ARCH_OLMOE
TRAITS["olmoe"] = {"gguf_arch": "olmoe"}
# OlmoeConfig.norm_topk_prob defaults to False (OlmoeTopKRouter.forward)
CONFIG_TRAITS["olmoe"] = _norm_topk(False)


def _phimoe(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    # PhimoeConfig: attention_bias -> q/k/v/o biases, lm_head_bias, nn.LayerNorm (with bias) for the layer and
    # final norms, max_position_embeddings 4096 * 32, sliding_window None (create_sliding_window_causal_mask
    # when set), every layer a PhimoeSparseMoeBlock of num_local_experts experts of intermediate_size
    bias = r.bool("attention_bias", default=False)
    f = common(r, name, mt, qkv_bias=bias, o_bias=bias, norm="layernorm", norm_bias=True)
    f["lm_head_bias"] = r.bool("lm_head_bias", default=False)
    f["tie_word_embeddings"] = r.bool("tie_word_embeddings", default=False)
    f["max_position_embeddings"] = r.int("max_position_embeddings", default=4096 * 32)
    f["layer_types"], f["sliding_window"] = uniform_sliding(r, f["num_layers"])
    if r.int("num_experts_per_tok", default=2) != 2:  # sparsemixer picks two experts whatever top_k says
        raise GpumemInputError(
            "must be 2: Phi-MoE's sparsemixer routes every token to exactly two experts",
            source=r.source,
            field="num_experts_per_tok",
        )
    moe_r = _defaults(r, num_local_experts=16, num_experts_per_tok=2)
    f["moe"] = _moe(moe_r, "num_local_experts", expert_intermediate_size=f["intermediate_size"])
    return f


READERS["phimoe"] = _phimoe
# PhimoeTopKRouter + sparsemixer; llama.cpp LLM_ARCH_PHIMOE
TRAITS["phimoe"] = {"router": "sparsemixer", "gguf_arch": "phimoe"}
# PhimoeConfig.input_jitter_noise (default 0.0): PhimoeSparseMoeBlock and PhimoeTopKRouter each scale their
# input by noise in place in training
CONFIG_TRAITS["phimoe"] = lambda cfg, source: {
    "moe_input_jitter": 2 if _jitter(cfg, source, "input_jitter_noise") else 0
}


def _rotary_dim(r: ConfigReader, head_dim: int, default: float) -> int | None:
    """``int(head_dim x partial_rotary_factor)`` rotary channels (None: the whole head), e.g.
    Glm4MoeRotaryEmbedding / MiniMaxM2RotaryEmbedding ``dim = int(head_dim * partial_rotary_factor)``."""
    rd = int(head_dim * rotary_factor(r, default))
    if rd < 2 or rd % 2:
        raise GpumemInputError(
            f"gives {rd} rotary channels of head_dim {head_dim}; need an even number",
            source=r.source,
            field="partial_rotary_factor",
        )
    return rd if rd < head_dim else None


def _deepseek_style_moe(r: ConfigReader, n_layers: int, first_dense: int, shared: int | None) -> MoESpec:
    """n_routed_experts of moe_intermediate_size, n_shared_experts x moe_intermediate_size shared, the first
    ``first_k_dense_replace`` layers dense (Glm4MoeDecoderLayer, Dots1DecoderLayer)."""
    moe_f = r.int("moe_intermediate_size", default=1408)
    shared = r.int("n_shared_experts", **({} if shared is None else {"default": shared}), minimum=0)
    first = r.int("first_k_dense_replace", default=first_dense, minimum=0)
    return _moe(
        r,
        "n_routed_experts",
        expert_intermediate_size=moe_f,
        shared_expert_intermediate_size=shared * moe_f,
        dense_layers=tuple(range(min(first, n_layers))),
    )


def _glm4_moe(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    # Glm4MoeConfig: head_dim (default hidden / heads), attention_bias on q/k/v (o_proj never), use_qk_norm
    # -> per-head q_norm/k_norm, partial_rotary_factor 0.5 (__post_init__), first_k_dense_replace 1,
    # n_routed_experts 128 (alias num_local_experts), n_shared_experts 1, max_position_embeddings 131072.
    # The num_nextn_predict_layers MTP layers are not built by Glm4MoeForCausalLM.
    f = common(r, name, mt, qkv_bias=r.bool("attention_bias", default=False), o_bias=False)
    if r.bool("use_qk_norm", default=False):
        f["qk_norm"] = "per_head"
    f["max_position_embeddings"] = r.int("max_position_embeddings", default=131072)
    f["tie_word_embeddings"] = r.bool("tie_word_embeddings", default=False)
    f["rotary_dim"] = _rotary_dim(r, f["head_dim"], 0.5)
    moe_r = _defaults(r, n_routed_experts=128, num_experts_per_tok=8)
    f["moe"] = _deepseek_style_moe(moe_r, f["num_layers"], 1, 1)
    return f


READERS["glm4_moe"] = _glm4_moe
# Glm4MoeTopkRouter: fp32 router (sigmoid, e_score_correction_bias, group-limited top-k) as DeepseekV3's;
# llama.cpp LLM_ARCH_GLM4_MOE
TRAITS["glm4_moe"] = {"router": "fp32", "gguf_arch": "glm4moe"}


def _uniform(r: ConfigReader, key: str, n_layers: int, default: Any) -> int:
    """A per-layer list (HunYuan's moe_topk, num_experts) that must hold one value, or a plain integer."""
    v = r.get(key, default=default)
    if isinstance(v, list):
        if len(v) != n_layers or len(set(map(str, v))) != 1:
            raise GpumemInputError(
                f"must be one value for every layer (gpumem describes uniform MoE layers), got {short(v)}",
                source=r.source,
                field=key,
            )
        v = v[0]
    return ConfigReader({key: v}, r.source).int(key)


def _hunyuan_moe(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    # HunYuanMoEV1Config: attention_bias on q/k/v/o, per-head query_layernorm / key_layernorm after the
    # rotary, tie_word_embeddings False, max_position_embeddings 2048; every layer a HunYuanMoEV1Moe:
    # num_experts (alias num_local_experts) experts and a shared_mlp, both of intermediate_size, top
    # moe_topk (alias num_experts_per_tok; an int or a per-layer list)
    bias = r.bool("attention_bias", default=False)
    f = common(r, name, mt, qkv_bias=bias, o_bias=bias, qk_norm="per_head")
    f["tie_word_embeddings"] = r.bool("tie_word_embeddings", default=False)
    n = f["num_layers"]
    experts = _uniform(r, "num_experts", n, 1)
    top_k = _uniform(r, "moe_topk", n, 1)
    if top_k > experts:
        raise GpumemInputError(
            f"is {top_k}, more than the {experts} experts (num_experts)", source=r.source, field="moe_topk"
        )
    f["moe"] = MoESpec(
        num_experts=experts,
        experts_per_token=top_k,
        expert_intermediate_size=f["intermediate_size"],
        shared_expert_intermediate_size=f["intermediate_size"],
    )
    return f


READERS["hunyuan_v1_moe"] = _hunyuan_moe
# HunYuanMoEV1Gate: an fp32 wg over an fp32 copy of the input, fp32 softmax, top-k renormalised, kept fp32;
# HunYuanMoEV1Moe runs shared_mlp first; HunYuanMoEV1Attention norms q/k after the rotary; llama.cpp
# LLM_ARCH_HUNYUAN_MOE
TRAITS["hunyuan_v1_moe"] = {
    "router": "fp32",
    "shared_expert_first": True,
    "qk_norm_after_rope": True,
    "gguf_arch": "hunyuan-moe",
}


def _ernie_moe_layers(r: ConfigReader, n_layers: int) -> tuple[int, ...]:
    # Ernie4_5_MoeDecoderLayer: experts when (i + 1) % moe_layer_interval == 0 and moe_layer_start_index <= i
    # <= moe_layer_end_index (-1: the last layer, Ernie4_5_MoeConfig.__post_init__); the dense layers here
    start = r.int("moe_layer_start_index", default=1, minimum=0)
    end = r.get("moe_layer_end_index", default=-1)
    end = n_layers - 1 if end == -1 else r.int("moe_layer_end_index", minimum=0)
    step = r.int("moe_layer_interval", default=1)
    return tuple(i for i in range(n_layers) if (i + 1) % step or not start <= i <= end)


def _ernie4_5_moe(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    # Ernie4_5_MoeConfig: use_bias on q/k/v/o, the dense and shared MLPs and lm_head; 4 KV heads, tied
    # embeddings, max_position_embeddings 131072; moe_num_experts (alias num_experts) of
    # moe_intermediate_size, moe_k (alias num_experts_per_tok), moe_num_shared_experts x moe_intermediate_size
    # shared
    bias = r.bool("use_bias", default=False)
    f = common(r, name, mt, qkv_bias=bias, o_bias=bias, mlp_bias=bias, lm_head_bias=bias)
    f["num_kv_heads"] = r.int("num_key_value_heads", default=4)
    f["max_position_embeddings"] = r.int("max_position_embeddings", default=131072)
    f["tie_word_embeddings"] = r.bool("tie_word_embeddings", default=True)
    experts, top_k = r.int("moe_num_experts", default=64), r.int("moe_k", default=6)
    if top_k > experts:
        raise GpumemInputError(
            f"is {top_k}, more than the {experts} experts (moe_num_experts)", source=r.source, field="moe_k"
        )
    moe_f = r.int("moe_intermediate_size", default=1536)
    f["moe"] = MoESpec(
        num_experts=experts,
        experts_per_token=top_k,
        expert_intermediate_size=moe_f,
        shared_expert_intermediate_size=r.int("moe_num_shared_experts", default=2, minimum=0) * moe_f,
        dense_layers=_ernie_moe_layers(r, f["num_layers"]),
        score_bias_param=True,
    )
    return f


READERS["ernie4_5_moe"] = _ernie4_5_moe
# Ernie4_5_MoeTopKRouter (fp32, autocast off, bias-corrected top-k); the shared experts run first
# (Ernie4_5_MoeSparseMoeBlock.forward); apply_rotary_pos_emb interleaved on fp32 copies as Ernie 4.5's;
# llama.cpp LLM_ARCH_ERNIE4_5_MOE
TRAITS["ernie4_5_moe"] = {
    "router": "fp32_softmax",
    "shared_expert_first": True,
    "rope_interleaved": True,
    "rope_fp32": True,
    "gguf_arch": "ernie4_5-moe",
}
# Ernie4_5_MoeAttention fixes attention_dropout = 0.0 whatever the config says
CONFIG_TRAITS["ernie4_5_moe"] = lambda cfg, source: {"attention_dropout": 0.0}


def _dots1(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    # Dots1Config: attention_bias on q/k/v/o, per-head q_norm/k_norm, max_position_embeddings 2048; layer i
    # slides when sliding_window (default 4096) is set and i >= max_window_layers (default 62), or as
    # layer_types says; n_routed_experts / n_shared_experts / num_experts_per_tok have no usable defaults
    # (None); the first first_k_dense_replace (default 0) layers are dense
    bias = r.bool("attention_bias", default=False)
    f = common(r, name, mt, qkv_bias=bias, o_bias=bias, qk_norm="per_head")
    f["tie_word_embeddings"] = r.bool("tie_word_embeddings", default=False)
    n = f["num_layers"]
    explicit = layer_types_explicit(r, n)
    window = r.window(4096)
    if explicit is None and window is not None:
        first = r.int("max_window_layers", default=62, minimum=0)
        explicit = tuple("sliding_attention" if i >= first else "full_attention" for i in range(n))
    slides = explicit is not None and "sliding_attention" in explicit
    f["layer_types"] = explicit or ()
    f["sliding_window"] = window if slides else None
    f["moe"] = _deepseek_style_moe(r, n, 0, None)  # Dots1Config: no usable n_shared_experts default
    return f


READERS["dots1"] = _dots1
# Dots1TopkRouter: fp32 router as DeepseekV3's (sigmoid, e_score_correction_bias); llama.cpp LLM_ARCH_DOTS1
TRAITS["dots1"] = {"router": "fp32", "gguf_arch": "dots1"}


def _minimax_m2(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    # MiniMaxM2Config: head_dim 128 and 8 KV heads by default (class attributes), no biases, q_norm / k_norm
    # over the full projections, partial rotary from the legacy rotary_dim (convert_rope_params_to_dict:
    # partial_rotary_factor = rotary_dim / head_dim) or partial_rotary_factor, max_position_embeddings
    # 196608; every layer a MiniMaxM2SparseMoeBlock of num_local_experts (alias num_experts) experts of
    # intermediate_size, no shared expert. The checkpoint's quantization_config (fp8 blocks) is not read here:
    # this is the bf16 architecture.
    f = common(r, name, mt, qk_norm="full_width")
    f["num_kv_heads"] = r.int("num_key_value_heads", default=8)
    f["head_dim"] = r.int("head_dim", default=128)
    f["max_position_embeddings"] = r.int("max_position_embeddings", default=196608)
    f["tie_word_embeddings"] = r.bool("tie_word_embeddings", default=False)
    rd = r.opt_int("rotary_dim")
    if rd is not None:
        if rd % 2 or rd > f["head_dim"]:
            raise GpumemInputError(
                f"must be even and at most head_dim ({f['head_dim']}), got {rd}",
                source=r.source,
                field="rotary_dim",
            )
        f["rotary_dim"] = rd if rd < f["head_dim"] else None
    else:
        f["rotary_dim"] = _rotary_dim(r, f["head_dim"], 1.0)
    key = "num_experts" if "num_experts" in r.cfg else "num_local_experts"
    moe_r = _defaults(r, **{key: 256, "num_experts_per_tok": 8})
    f["moe"] = _moe(moe_r, key, expert_intermediate_size=f["intermediate_size"])
    return f


READERS["minimax_m2"] = _minimax_m2
# MiniMaxM2TopKRouter: sigmoid over the logits + e_score_correction_bias (a buffer of the block), top-k
# renormalised in fp32; llama.cpp LLM_ARCH_MINIMAX_M2
TRAITS["minimax_m2"] = {"router": "sigmoid", "gguf_arch": "minimax-m2"}
# MiniMaxM2Config.router_jitter_noise (default 0.0): MiniMaxM2SparseMoeBlock scales its input in place in
# training
CONFIG_TRAITS["minimax_m2"] = lambda cfg, source: {
    "moe_input_jitter": int(_jitter(cfg, source, "router_jitter_noise"))
}
