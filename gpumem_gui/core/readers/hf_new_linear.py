"""Readers of the model types issue 14 adds, group linear: hybrids whose recurrent layers come beside MoE
feed-forwards (LFM2-MoE's short convolutions, MiniMax's lightning attention). The fields each transformers
config class uses and its defaults (``models/<type>/configuration_<type>.py``, transformers 5.24), and each
type's traits (``models/<type>/modeling_<type>.py``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpumem_gui.core.errors import GpumemInputError, short
from gpumem_gui.core.readers.config_fields import ConfigReader
from gpumem_gui.core.spec.linear import LinearAttentionSpec, ShortConvSpec
from gpumem_gui.core.spec.model import MoESpec

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
