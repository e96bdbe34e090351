"""Readers of the model types issue 14 adds, group hybrid: models whose layers mix attention with a recurrent
(linear-attention) token mixer that keeps a fixed state per sequence. The fields each transformers config
class uses and its defaults (``models/<type>/configuration_<type>.py``, transformers 5.24), and each type's
traits (``models/<type>/modeling_<type>.py``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpumem_gui.core.errors import GpumemInputError, short
from gpumem_gui.core.readers.config_fields import ConfigReader, rotary_factor
from gpumem_gui.core.readers.hf_modern import _moe, _qwen_moe_layers
from gpumem_gui.core.spec.linear import LinearAttentionSpec, ShortConvSpec
from gpumem_gui.core.spec.model import MoESpec

# model_type -> reader (ConfigReader, name, model_type) -> ModelSpec fields
READERS: dict[str, Callable[[ConfigReader, str, str], dict[str, Any]]] = {}
# model_type -> ArchTraits values that differ from Llama's
TRAITS: dict[str, dict[str, Any]] = {}
# model_type -> (config, source) -> trait values a config file sets
CONFIG_TRAITS: dict[str, Callable[[Mapping[str, Any], str], dict[str, Any]]] = {}

_HYBRID_TYPES = ("linear_attention", "full_attention")


def _hybrid_layer_types(r: ConfigReader, n_layers: int) -> tuple[str, ...]:
    """``layer_types`` as the file lists them (linear_attention / full_attention), else
    ``Qwen3NextConfig.__post_init__``: layer i is full attention when (i + 1) % full_attention_interval == 0
    (default 4)."""
    lt = r.get("layer_types", default=None)
    if lt is None:
        interval = r.int("full_attention_interval", default=4)
        return tuple(
            "full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n_layers)
        )
    if not isinstance(lt, list) or len(lt) != n_layers or any(t not in _HYBRID_TYPES for t in lt):
        raise GpumemInputError(
            f"must list linear_attention or full_attention for each of the {n_layers} layers, "
            f"got {short(lt)}",
            source=r.source,
            field="layer_types",
        )
    return tuple(lt)


def _gated_deltanet(r: ConfigReader, split: bool) -> LinearAttentionSpec:
    """Qwen3NextConfig's linear_* fields (defaults 16 key heads, 32 value heads, 128-wide heads, conv 4);
    ``split``: Qwen3.5's separate projections."""
    kh = r.int("linear_num_key_heads", default=16)
    vh = r.int("linear_num_value_heads", default=32)
    if vh % kh:
        raise GpumemInputError(
            f"({vh}) must be a multiple of linear_num_key_heads ({kh})",
            source=r.source,
            field="linear_num_value_heads",
        )
    return LinearAttentionSpec(
        key_heads=kh,
        value_heads=vh,
        key_head_dim=r.int("linear_key_head_dim", default=128),
        value_head_dim=r.int("linear_value_head_dim", default=128),
        conv_kernel=r.int("linear_conv_kernel_dim", default=4),
        split_projections=split,
    )


# The class defaults that differ between the three text configs (Qwen3NextConfig; Qwen3_5TextConfig and
# Qwen3_5MoeTextConfig override them); the rest are Qwen3NextConfig's (16 heads of 256, partial rotary 0.25)
_DEFAULTS = {
    "qwen3_next": {"vocab_size": 151936, "hidden_size": 2048, "num_hidden_layers": 48, "kv": 2},
    "qwen3_5": {"vocab_size": 248320, "hidden_size": 4096, "num_hidden_layers": 32, "kv": 4},
    "qwen3_5_moe": {"vocab_size": 248320, "hidden_size": 2048, "num_hidden_layers": 40, "kv": 2},
}


def _hybrid(r: ConfigReader, name: str, mt: str, family: str) -> dict[str, Any]:
    """The fields the three share. Qwen3NextAttention (Qwen3_5Attention is the same class): attention_bias
    on q/k/v/o, per-head zero-centred q_norm/k_norm, q_proj doubled for the output gate, partial rotary
    (0.25); the gated DeltaNet on the linear_attention layers (full_attention_interval 4 by default)."""
    d = _DEFAULTS[family]
    bias = r.bool("attention_bias", default=False)
    n = r.int("num_hidden_layers", default=d["num_hidden_layers"])
    f: dict[str, Any] = dict(
        name=name,
        model_type=mt,
        hidden_size=r.int("hidden_size", default=d["hidden_size"]),
        num_layers=n,
        num_attention_heads=r.int("num_attention_heads", default=16),
        num_kv_heads=r.int("num_key_value_heads", default=d["kv"]),
        head_dim=r.int("head_dim", default=256),
        vocab_size=r.int("vocab_size", default=d["vocab_size"]),
        max_position_embeddings=r.int("max_position_embeddings", default=32768),
        activation=str(r.get("hidden_act", default="silu")),
        qkv_bias=bias,
        o_bias=bias,
        qk_norm="per_head",
        tie_word_embeddings=r.bool("tie_word_embeddings", default=False),
        attn_output_gate=True,
    )
    if f["activation"] != "silu":
        raise GpumemInputError(
            f"must be silu (Qwen3NextRMSNormGated and the conv use it), got {short(f['activation'])}",
            source=r.source,
            field="hidden_act",
        )
    rd = int(f["head_dim"] * rotary_factor(r, 0.25))
    if rd < 2 or rd % 2:
        raise GpumemInputError(
            f"gives {rd} rotary channels of head_dim {f['head_dim']}; need an even number",
            source=r.source,
            field="partial_rotary_factor",
        )
    f["rotary_dim"] = rd if rd < f["head_dim"] else None
    f["layer_types"] = types = _hybrid_layer_types(r, n)
    split = family != "qwen3_next"
    f["linear_attention"] = _gated_deltanet(r, split) if "linear_attention" in types else None
    return f


def _shared_moe(r: ConfigReader, dense_layers: tuple[int, ...]) -> MoESpec:
    """Qwen3NextSparseMoeBlock (Qwen3_5MoeSparseMoeBlock): routed experts, a shared expert and its sigmoid
    gate (a Linear(hidden, 1) built whatever the shared width)."""
    return _moe(
        r,
        "num_experts",
        expert_intermediate_size=r.int("moe_intermediate_size", default=512),
        shared_expert_intermediate_size=r.int("shared_expert_intermediate_size", default=512),
        shared_expert_gate=True,
        dense_layers=dense_layers,
    )


def _qwen3_next(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    """Qwen3NextConfig: Qwen3NextSparseMoeBlock where (i + 1) % decoder_sparse_step == 0 and i is not in
    mlp_only_layers (none without experts), else Qwen3NextMLP of intermediate_size (default 5632)."""
    f = _hybrid(r, name, mt, "qwen3_next")
    f["intermediate_size"] = r.int("intermediate_size", default=5632)
    if r.int("num_experts", default=512, minimum=0) > 0:
        f["moe"] = _shared_moe(r, _qwen_moe_layers(r, f["num_layers"]))
    return f


def _text(r: ConfigReader) -> ConfigReader:
    """The ``text_config`` of a Qwen3.5 wrapper (Qwen3_5Config / Qwen3_5MoeConfig): AutoModelForCausalLM
    builds Qwen3_5ForCausalLM / Qwen3_5MoeForCausalLM from it ("VLM compatibility", models/auto/
    modeling_auto.py), without the vision tower."""
    tc = r.get("text_config", default={})
    if not isinstance(tc, Mapping):
        raise GpumemInputError("must be an object", source=r.source, field="text_config")
    return ConfigReader(tc, f"{r.source} text_config")


def _qwen3_5(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    """Qwen3_5TextConfig (a wrapper's text_config): dense Qwen3_5MLP of intermediate_size (default 12288) on
    every layer; the gated DeltaNet's separate projections; the multimodal rotary over text positions."""
    r = _text(r) if mt == "qwen3_5" else r
    f = _hybrid(r, name, mt, "qwen3_5")
    f["intermediate_size"] = r.int("intermediate_size", default=12288)
    return f


def _qwen3_5_moe(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    """Qwen3_5MoeTextConfig (a wrapper's text_config): Qwen3_5MoeSparseMoeBlock on every layer (256 experts,
    top-8 by default; no dense width, so intermediate_size stands for the expert width)."""
    r = _text(r) if mt == "qwen3_5_moe" else r
    f = _hybrid(r, name, mt, "qwen3_5_moe")
    f["moe"] = _shared_moe(r, ())
    f["intermediate_size"] = f["moe"].expert_intermediate_size
    return f


def _norm_topk(cfg: Mapping[str, Any], source: str) -> dict[str, Any]:
    """``norm_topk_prob`` (Qwen3NextConfig default True): Qwen3NextTopKRouter renormalises the top-k
    weights."""
    v = cfg.get("norm_topk_prob", True)
    if not isinstance(v, bool):
        raise GpumemInputError(
            f"must be true or false, got {short(v)}", source=source, field="norm_topk_prob"
        )
    return {"router_renormalize": v}


READERS["qwen3_next"] = _qwen3_next
READERS["qwen3_5"] = READERS["qwen3_5_text"] = _qwen3_5
READERS["qwen3_5_moe"] = READERS["qwen3_5_moe_text"] = _qwen3_5_moe
# Qwen3NextRMSNorm: (1 + weight) in fp32 (zero-centred, as GemmaRMSNorm); Qwen3NextSparseMoeBlock runs the
# shared expert before the router (as Qwen2MoeSparseMoeBlock); llama.cpp LLM_ARCH_QWEN3NEXT ("qwen3next")
TRAITS["qwen3_next"] = {"norm_weight_offset": True, "shared_expert_first": True, "gguf_arch": "qwen3next"}
CONFIG_TRAITS["qwen3_next"] = _norm_topk
# Qwen3_5TextModel / Qwen3_5MoeTextModel: Qwen3-Next's layers, the multimodal rotary
# (Qwen3_5TextRotaryEmbedding); Qwen3_5MoeTopKRouter always renormalises the top-k weights; llama.cpp
# LLM_ARCH_QWEN35 ("qwen35") / LLM_ARCH_QWEN35MOE ("qwen35moe")
_QWEN3_5 = {**TRAITS["qwen3_next"], "rotary_mrope": True}
TRAITS["qwen3_5"] = TRAITS["qwen3_5_text"] = {**_QWEN3_5, "gguf_arch": "qwen35"}
TRAITS["qwen3_5_moe"] = TRAITS["qwen3_5_moe_text"] = {**_QWEN3_5, "gguf_arch": "qwen35moe"}


def _lfm2_ffn(r: ConfigReader, width: int) -> int:
    """Lfm2MLP.__init__: with block_auto_adjust_ff_dim (default True) the width is int(2/3 x width), times
    block_ffn_dim_multiplier (default 1.0), rounded up to a multiple of block_multiple_of (default 256)."""
    if not r.bool("block_auto_adjust_ff_dim", default=True):
        return width
    width = int(2 * width / 3)
    mult = r.get("block_ffn_dim_multiplier", default=1.0)
    if mult is not None:
        if isinstance(mult, bool) or not isinstance(mult, int | float) or not 0 < mult <= 64:
            raise GpumemInputError(
                f"must be a positive number, got {short(mult)}",
                source=r.source,
                field="block_ffn_dim_multiplier",
            )
        width = int(mult * width)
        step = r.int("block_multiple_of", default=256)
        width = step * ((width + step - 1) // step)
    if width < 1:
        raise GpumemInputError(
            "gives an empty feed-forward width", source=r.source, field="intermediate_size"
        )
    return width


def _lfm2_types(r: ConfigReader, n: int) -> tuple[str, ...]:
    """layer_types (full_attention / conv), else Lfm2Config.__post_init__: full attention on full_attn_idxs
    (default: every layer), conv elsewhere."""
    lt = r.get("layer_types", default=None)
    if lt is not None:
        if not isinstance(lt, list) or len(lt) != n or any(t not in ("full_attention", "conv") for t in lt):
            raise GpumemInputError(
                f"must list full_attention or conv for each of the {n} layers, got {short(lt)}",
                source=r.source,
                field="layer_types",
            )
        return tuple(lt)
    idxs = r.get("full_attn_idxs", default=list(range(n)))
    if not isinstance(idxs, list) or not all(isinstance(i, int) and 0 <= i < n for i in idxs):
        raise GpumemInputError(
            f"must be a list of layer indices in [0, {n})", source=r.source, field="full_attn_idxs"
        )
    return tuple("full_attention" if i in idxs else "conv" for i in range(n))


def _lfm2(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    """Lfm2Config (defaults: the class attributes; tie_embedding and block_ff_dim are the older names of
    tie_word_embeddings and intermediate_size). Lfm2Attention: no biases, per-head q/k layernorm, out_proj;
    Lfm2ShortConv on the conv layers; Lfm2MLP w1/w3/w2 of the adjusted width."""
    h = r.int("hidden_size", default=2560)
    a = r.int("num_attention_heads", default=32)
    n = r.int("num_hidden_layers", default=32)
    types = _lfm2_types(r, n)
    f: dict[str, Any] = dict(
        name=name,
        model_type=mt,
        hidden_size=h,
        num_layers=n,
        num_attention_heads=a,
        num_kv_heads=r.int("num_key_value_heads", default=8),
        head_dim=r.head_dim(h, a),
        intermediate_size=_lfm2_ffn(r, r.int("block_ff_dim", "intermediate_size", default=12288)),
        vocab_size=r.int("vocab_size", default=65536),
        max_position_embeddings=r.int("max_position_embeddings", default=128000),
        qk_norm="per_head",
        tie_word_embeddings=r.bool("tie_embedding", "tie_word_embeddings", default=True),
        layer_types=types,
    )
    if "conv" in types:
        f["short_conv"] = ShortConvSpec(
            kernel=r.int("conv_L_cache", default=3), bias=r.bool("conv_bias", default=False)
        )
    return f


READERS["lfm2"] = _lfm2
# Lfm2Attention.out_proj, Lfm2MLP w1 (gate) / w3 (up) / w2 (down): the names PEFT targets; llama.cpp
# LLM_ARCH_LFM2
TRAITS["lfm2"] = {
    "module_names": (("o_proj", "out_proj"), ("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2")),
    "gguf_arch": "lfm2",
}
