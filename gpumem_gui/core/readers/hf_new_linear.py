"""Readers of the model types issue 14 adds, group linear: hybrids whose recurrent layers come beside MoE
feed-forwards (LFM2-MoE's short convolutions, MiniMax's lightning attention, Kimi Linear's and Ling's KDA
beside MLA). The fields each transformers config class uses and its defaults
(``models/<type>/configuration_<type>.py``, transformers 5.24), and each type's traits
(``models/<type>/modeling_<type>.py``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpumem_gui.core.errors import GpumemInputError, short
from gpumem_gui.core.readers.config_fields import ConfigReader
from gpumem_gui.core.readers.hf_new_mla import _mlp_dense_layers as mlp_dense_layers
from gpumem_gui.core.spec.linear import LinearAttentionSpec, ShortConvSpec
from gpumem_gui.core.spec.model import MLASpec, MoESpec

# model_type -> reader (ConfigReader, name, model_type) -> ModelSpec fields
READERS: dict[str, Callable[[ConfigReader, str, str], dict[str, Any]]] = {}
# model_type -> ArchTraits values that differ from Llama's
TRAITS: dict[str, dict[str, Any]] = {}
# model_type -> (config, source) -> trait values a config file sets
CONFIG_TRAITS: dict[str, Callable[[Mapping[str, Any], str], dict[str, Any]]] = {}

_LFM2_TYPES = ("full_attention", "conv")


def _lfm2_moe_types(r: ConfigReader, n: int) -> tuple[str, ...]:
    """``layer_types`` (full_attention / conv per layer): Lfm2MoeConfig has no default for it
    (Lfm2MoeDecoderLayer reads ``config.layer_types[layer_idx]``), so a file without it cannot be built."""
    lt = r.get("layer_types", default=None)
    if not isinstance(lt, list) or len(lt) != n or any(t not in _LFM2_TYPES for t in lt):
        raise GpumemInputError(
            f"must list full_attention or conv for each of the {n} layers, got {short(lt)}",
            source=r.source,
            field="layer_types",
        )
    return tuple(lt)


def _lfm2_moe(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    """Lfm2MoeConfig (defaults: its class attributes; ``tie_embedding`` is the older name of
    tie_word_embeddings). Lfm2MoeAttention and Lfm2MoeShortConv as LFM2's; Lfm2MoeMLP (w1/w3/w2 of
    ``intermediate_size`` as given, no LFM2 width adjustment) on the first ``num_dense_layers`` layers,
    Lfm2MoeSparseMoeBlock (Lfm2MoeExperts of ``moe_intermediate_size``, a bias-free router) elsewhere."""
    h = r.int("hidden_size", default=2048)
    a = r.int("num_attention_heads", default=32)
    n = r.int("num_hidden_layers", default=32)
    experts = r.int("num_experts", default=32)
    top_k = r.int("num_experts_per_tok", default=4)
    if top_k > experts:
        raise GpumemInputError(
            f"is {top_k}, more than the {experts} experts (num_experts)",
            source=r.source,
            field="num_experts_per_tok",
        )
    dense = r.int("num_dense_layers", default=2, minimum=0)
    types = _lfm2_moe_types(r, n)
    f: dict[str, Any] = dict(
        name=name,
        model_type=mt,
        hidden_size=h,
        num_layers=n,
        num_attention_heads=a,
        num_kv_heads=r.int("num_key_value_heads", default=8),
        head_dim=r.head_dim(h, a),
        intermediate_size=r.int("intermediate_size", default=7168),
        vocab_size=r.int("vocab_size", default=65536),
        max_position_embeddings=r.int("max_position_embeddings", default=128000),
        qk_norm="per_head",
        tie_word_embeddings=r.bool("tie_embedding", "tie_word_embeddings", default=True),
        layer_types=types,
        moe=MoESpec(
            num_experts=experts,
            experts_per_token=top_k,
            expert_intermediate_size=r.int("moe_intermediate_size", default=1792),
            dense_layers=tuple(range(min(dense, n))),
        ),
    )
    if "conv" in types:
        f["short_conv"] = ShortConvSpec(
            kernel=r.int("conv_L_cache", default=3), bias=r.bool("conv_bias", default=False)
        )
    return f


def _lfm2_moe_router(cfg: Mapping[str, Any], source: str) -> dict[str, Any]:
    """Lfm2MoeTopKRouter: ``use_expert_bias`` (default True) picks the top-k of sigmoid + the fp32
    ``expert_bias`` buffer and gathers the sigmoid scores; without it, the top-k of the scores themselves;
    ``norm_topk_prob`` (default True) divides by their sum + 1e-6."""
    out: dict[str, Any] = {}
    for key, default in (("use_expert_bias", True), ("norm_topk_prob", True)):
        v = cfg.get(key, default)
        if not isinstance(v, bool):
            raise GpumemInputError(f"must be true or false, got {short(v)}", source=source, field=key)
        out[key] = v
    scale = cfg.get("routed_scaling_factor", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, int | float) or scale <= 0:
        raise GpumemInputError(
            f"must be a positive number, got {short(scale)}", source=source, field="routed_scaling_factor"
        )
    return {
        "router": "sigmoid_bias" if out["use_expert_bias"] else "sigmoid_topk",
        "router_renormalize": out["norm_topk_prob"],
    }


READERS["lfm2_moe"] = _lfm2_moe
# Lfm2MoeAttention.out_proj, Lfm2MoeMLP w1 (gate) / w3 (up) / w2 (down): the names PEFT targets; llama.cpp
# LLM_ARCH_LFM2MOE ("lfm2moe")
TRAITS["lfm2_moe"] = {
    "module_names": (("o_proj", "out_proj"), ("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2")),
    "gguf_arch": "lfm2moe",
}
CONFIG_TRAITS["lfm2_moe"] = _lfm2_moe_router


_MINIMAX_TYPES = ("linear_attention", "full_attention")


def _minimax_types(r: ConfigReader, n: int) -> tuple[str, ...]:
    """``layer_types``, else MiniMaxConfig.__post_init__: full attention where (i + 1) is odd, lightning
    (linear_attention) elsewhere."""
    lt = r.get("layer_types", default=None)
    if lt is None:
        return tuple("full_attention" if (i + 1) % 2 else "linear_attention" for i in range(n))
    if not isinstance(lt, list) or len(lt) != n or any(t not in _MINIMAX_TYPES for t in lt):
        raise GpumemInputError(
            f"must list linear_attention or full_attention for each of the {n} layers, got {short(lt)}",
            source=r.source,
            field="layer_types",
        )
    return tuple(lt)


def _minimax(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    """MiniMaxConfig (defaults: its class attributes). MiniMaxAttention: Mistral's (no biases, rotary over
    the whole head); MiniMaxLightningAttention on the linear_attention layers (heads and head width of the
    attention, ``block_size`` default 256); MiniMaxSparseMoeBlock on every layer (experts of
    ``intermediate_size``, ``num_local_experts`` default 8, top-2)."""
    h = r.int("hidden_size", default=4096)
    a = r.int("num_attention_heads", default=32)
    n = r.int("num_hidden_layers", default=32)
    experts = r.int("num_local_experts", "num_experts", default=8)
    top_k = r.int("num_experts_per_tok", default=2)
    if top_k > experts:
        raise GpumemInputError(
            f"is {top_k}, more than the {experts} experts (num_local_experts)",
            source=r.source,
            field="num_experts_per_tok",
        )
    if r.get("sliding_window", default=None) is not None:
        raise GpumemInputError(
            "is not modelled for MiniMax (MiniMaxCache keeps every token while the mask slides); "
            "set it to null",
            source=r.source,
            field="sliding_window",
        )
    act = str(r.get("hidden_act", default="silu"))
    if act != "silu":
        raise GpumemInputError(
            f"must be silu (the lightning attention's SiLU is modelled), got {short(act)}",
            source=r.source,
            field="hidden_act",
        )
    hd = r.opt_int("head_dim") or h // a
    ffn = r.int("intermediate_size", default=14336)
    types = _minimax_types(r, n)
    f: dict[str, Any] = dict(
        name=name,
        model_type=mt,
        hidden_size=h,
        num_layers=n,
        num_attention_heads=a,
        num_kv_heads=r.int("num_key_value_heads", default=a),
        head_dim=hd,
        intermediate_size=ffn,
        vocab_size=r.int("vocab_size", default=32000),
        max_position_embeddings=r.int("max_position_embeddings", default=4096 * 32),
        tie_word_embeddings=r.bool("tie_word_embeddings", default=False),
        activation=act,
        layer_types=types,
        moe=MoESpec(num_experts=experts, experts_per_token=top_k, expert_intermediate_size=ffn),
    )
    if "linear_attention" in types:
        f["linear_attention"] = LinearAttentionSpec(
            kind="lightning",
            key_heads=a,
            value_heads=a,
            key_head_dim=hd,
            value_head_dim=hd,
            conv_kernel=0,
            chunk_size=r.int("block_size", default=256),
        )
    return f


READERS["minimax"] = _minimax
# MiniMaxDecoderLayer (normed residuals, scaled sums: replay/lightning.py); MiniMaxTopKRouter keeps its
# renormalised top-k weights in fp32; MiniMaxSparseMoeBlock's router_jitter_noise (default 0) is not read
# here; llama.cpp has no MiniMax-Text-01 architecture
TRAITS["minimax"] = {"block": "minimax", "router": "softmax_fp32_weights"}


_KDA_TYPES = ("full_attention", "linear_attention")


def _checked_types(r: ConfigReader, lt: Any, n: int, field: str) -> tuple[str, ...]:
    if not isinstance(lt, list) or len(lt) != n or any(t not in _KDA_TYPES for t in lt):
        raise GpumemInputError(
            f"must list full_attention or linear_attention for each of the {n} layers, got {short(lt)}",
            source=r.source,
            field=field,
        )
    return tuple(lt)


def _kimi_types(r: ConfigReader, n: int, lac: Mapping[str, Any]) -> tuple[str, ...]:
    """KimiLinearConfig.__post_init__: ``layer_types``, else ``linear_attn_config``'s 1-based
    ``full_attn_layers`` / ``kda_layers``, else full attention where ``i and i % 4 == 0``."""
    lt = r.get("layer_types", default=None)
    if lt is not None:
        return _checked_types(r, lt, n, "layer_types")
    if "full_attn_layers" in lac and "kda_layers" in lac:
        out: list[Any] = [None] * n
        for key, kind in (("full_attn_layers", "full_attention"), ("kda_layers", "linear_attention")):
            ids = lac[key]
            if not isinstance(ids, list) or any(
                isinstance(j, bool) or not isinstance(j, int) or not 1 <= j <= n for j in ids
            ):
                raise GpumemInputError(
                    f"must list 1-based layer numbers up to {n}, got {short(ids)}",
                    source=r.source,
                    field=f"linear_attn_config.{key}",
                )
            for j in ids:
                out[j - 1] = kind
        return _checked_types(r, out, n, "linear_attn_config.kda_layers")
    return tuple("full_attention" if i and i % 4 == 0 else "linear_attention" for i in range(n))


def _kda_model(
    r: ConfigReader, name: str, mt: str, types: tuple[str, ...], la: LinearAttentionSpec, first_dense: int
) -> dict[str, Any]:
    """What KimiLinearConfig and BailingHybridConfig share (DeepseekV3Config's fields, defaults merged into
    ``r``): MLA caching the latent; KimiLinearMLP on the ``mlp_layer_types`` "dense" layers (else the first
    ``first_k_dense_replace``), else KimiLinearMoE (DeepseekV3 experts and ``n_shared_experts``)."""
    n, bias = len(types), r.bool("attention_bias", default=False)
    act = str(r.get("hidden_act", default="silu"))
    if act != "silu":  # the conv's activation (KimiLinearDeltaAttention.activation) and the MLPs'
        raise GpumemInputError(f"must be silu, got {short(act)}", source=r.source, field="hidden_act")
    a = r.int("num_attention_heads")
    mla = MLASpec(
        q_lora_rank=r.opt_int("q_lora_rank"),
        kv_lora_rank=r.int("kv_lora_rank"),
        qk_nope_head_dim=r.int("qk_nope_head_dim"),
        qk_rope_head_dim=r.int("qk_rope_head_dim"),
        v_head_dim=r.int("v_head_dim"),
        head_gate=mt == "bailing_hybrid",  # BailingHybridAttention.g_proj
    )
    experts = r.int("num_experts", "num_local_experts", "n_routed_experts")
    top_k = r.int("num_experts_per_token", "num_experts_per_tok")
    if top_k > experts:
        msg = f"is {top_k}, more than the {experts} experts (num_experts)"
        raise GpumemInputError(msg, source=r.source, field="num_experts_per_tok")
    moe_f = r.int("moe_intermediate_size")
    return dict(
        name=name,
        model_type=mt,
        hidden_size=r.int("hidden_size"),
        num_layers=n,
        num_attention_heads=a,
        num_kv_heads=a,  # MLA caches the latent; the decompressed heads for reference (as DeepSeek's reader)
        head_dim=mla.qk_head_dim,
        intermediate_size=r.int("intermediate_size"),
        vocab_size=r.int("vocab_size"),
        max_position_embeddings=r.int("model_max_length", "max_position_embeddings"),
        tie_word_embeddings=r.bool("tie_word_embeddings", default=False),
        qkv_bias=bias,
        o_bias=bias,
        layer_types=types,
        mla=mla,
        linear_attention=la,
        moe=MoESpec(
            num_experts=experts,
            experts_per_token=top_k,
            expert_intermediate_size=moe_f,
            shared_expert_intermediate_size=moe_f
            * r.int("num_shared_experts", "n_shared_experts", minimum=0),
            dense_layers=mlp_dense_layers(r, n, first_dense),
        ),
    )


# models/kimi_linear/configuration_kimi_linear.py KimiLinearConfig: the class defaults (Kimi-Linear-48B-A3B);
# checkpoints spell them as the attribute_map targets (num_experts, num_experts_per_token, model_max_length)
_KIMI_DEFAULTS: dict[str, Any] = {
    "vocab_size": 163840,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "moe_intermediate_size": 1024,
    "num_hidden_layers": 27,
    "num_attention_heads": 32,
    "n_shared_experts": 1,
    "kv_lora_rank": 512,
    "q_lora_rank": None,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "qk_nope_head_dim": 128,
    "num_experts_per_tok": 8,
    "max_position_embeddings": 1048576,
    "num_local_experts": 256,
}


def _kimi_linear(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    """KimiLinearConfig: KimiLinearDeltaAttention (``linear_attn_config``'s head_dim / num_heads /
    short_conv_kernel_size, else linear_head_dim / linear_num_heads / linear_conv_kernel_dim: 128 / 32 / 4)
    on the linear_attention layers, KimiLinearAttention (MLA without rotary: KimiLinearModel deletes its
    rotary_emb) on the others."""
    r = ConfigReader({**_KIMI_DEFAULTS, **r.cfg}, r.source)
    lac = r.get("linear_attn_config", default={}) or {}
    if not isinstance(lac, Mapping):
        raise GpumemInputError("must be an object", source=r.source, field="linear_attn_config")
    sub = ConfigReader(dict(lac), r.source)
    heads = sub.int("num_heads", default=r.int("linear_num_heads", default=32))
    hd = sub.int("head_dim", default=r.int("linear_head_dim", default=128))
    la = LinearAttentionSpec(
        kind="kda",
        key_heads=heads,
        value_heads=heads,
        key_head_dim=hd,
        value_head_dim=hd,
        conv_kernel=sub.int("short_conv_kernel_size", default=r.int("linear_conv_kernel_dim", default=4)),
        kda_gates="low_rank",
    )
    n = r.int("num_hidden_layers")
    first = r.int("first_k_dense_replace", default=1, minimum=0)
    f = _kda_model(r, name, mt, _kimi_types(r, n, lac), la, first)
    f["position_embedding"] = "none"
    return f


READERS["kimi_linear"] = _kimi_linear
# KimiLinearTopkRouter: DeepseekV3TopkRouter (fp32 weight and logits, sigmoid, e_score_correction_bias
# buffer, group-limited top-k); llama.cpp LLM_ARCH_KIMI_LINEAR ("kimi-linear")
TRAITS["kimi_linear"] = {"router": "fp32", "gguf_arch": "kimi-linear"}


# models/bailing_hybrid/configuration_bailing_hybrid.py BailingHybridConfig: the class defaults
_BAILING_DEFAULTS: dict[str, Any] = {
    "vocab_size": 157184,
    "hidden_size": 2560,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_hidden_layers": 42,
    "num_attention_heads": 32,
    "n_shared_experts": 1,
    "kv_lora_rank": 512,
    "q_lora_rank": None,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "qk_nope_head_dim": 128,
    "num_experts_per_tok": 8,
    "max_position_embeddings": 262144,
    "num_local_experts": 512,
}


def _bailing_hybrid(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    """BailingHybridConfig: BailingHybridDeltaAttention (num_attention_heads heads of ``head_dim``, default
    128; ``short_conv_kernel_size`` 4; full-rank forget and output gates, bounded with ``kda_safe_gate``) on
    the linear_attention layers (``layer_types``, else every layer but the last of each
    ``layer_group_size``), BailingHybridAttention (MLA, interleaved rotary, a per-head output gate) on the
    rest. The checkpoint's ``num_mtp_layers`` MTP layers are not built (BailingHybridModel ignores them)."""
    r = ConfigReader({**_BAILING_DEFAULTS, **r.cfg}, r.source)
    n = r.int("num_hidden_layers")
    lt = r.get("layer_types", default=None)
    if lt is None:
        g = r.int("layer_group_size", default=6)
        lt = ["full_attention" if (i + 1) % g == 0 else "linear_attention" for i in range(n)]
    a = r.int("num_attention_heads")
    hd = r.int("head_dim", default=128)
    la = LinearAttentionSpec(
        kind="kda",
        key_heads=a,
        value_heads=a,
        key_head_dim=hd,
        value_head_dim=hd,
        conv_kernel=r.int("short_conv_kernel_size", default=4),
        kda_gates="full_safe" if r.bool("kda_safe_gate", default=True) else "full",
    )
    first = r.int("first_k_dense_replace", default=2, minimum=0)
    return _kda_model(r, name, mt, _checked_types(r, lt, n, "layer_types"), la, first)


READERS["bailing_hybrid"] = _bailing_hybrid
# BailingHybridTopkRouter: DeepseekV3TopkRouter's; BailingHybridAttention: apply_rotary_pos_emb_interleave
TRAITS["bailing_hybrid"] = {"router": "fp32", "rope_interleaved": True}
