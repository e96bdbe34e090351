"""Readers of the model types issue 14 adds, group dense_a: the fields each transformers config class uses and
its defaults (``models/<type>/configuration_<type>.py``, transformers 5.24), and each type's traits
(``models/<type>/modeling_<type>.py``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpumem_gui.core.errors import GpumemInputError, short
from gpumem_gui.core.readers.config_fields import ConfigReader, common, layer_types_explicit, positive_number

# model_type -> reader (ConfigReader, name, model_type) -> ModelSpec fields
READERS: dict[str, Callable[[ConfigReader, str, str], dict[str, Any]]] = {}
# model_type -> ArchTraits values that differ from Llama's
TRAITS: dict[str, dict[str, Any]] = {}
# model_type -> (config, source) -> trait values a config file sets
CONFIG_TRAITS: dict[str, Callable[[Mapping[str, Any], str], dict[str, Any]]] = {}

# The activations whose op sequence the replay knows (replay/mlp.py act, replay/activations.py): SiLU, GPT-2's
# NewGELU, the one-kernel GELUs (F.gelu saves its input, tanh or erf alike), ReLU^2 and xIELU; any other name
# (transformers activations.py ACT2CLS) is an error here rather than a silent stand-in.
KNOWN_ACTIVATIONS = ("silu", "swish", "gelu_new", "gelu_pytorch_tanh", "gelu", "relu2", "xielu")


def activation(r: ConfigReader, default: str, *keys: str) -> str:
    """The config's activation name (first of ``keys`` present, else the config class's ``default``), one the
    replay models."""
    name = r.get(*(keys or ("hidden_act",)), default=default)
    if name not in KNOWN_ACTIVATIONS:
        raise GpumemInputError(
            f"activation {short(name)} is not modelled for this model type; modelled: "
            f"{', '.join(KNOWN_ACTIVATIONS)}",
            source=r.source,
            field=(keys or ("hidden_act",))[0],
        )
    return str(name)


def flags(r: ConfigReader, key: str, n_layers: int) -> tuple[int, ...] | None:
    """A per-layer list of 0/1 flags (at least one per layer; transformers reads ``[layer_idx]``)."""
    v = r.get(key, default=None)
    if v is None:
        return None
    if (
        not isinstance(v, list)
        or len(v) < n_layers
        or not all(isinstance(x, int) and not isinstance(x, float) and x in (0, 1) for x in v)
    ):
        raise GpumemInputError(
            f"must list a 0 or 1 for each of the {n_layers} layers, got {short(v)}",
            source=r.source,
            field=key,
        )
    return tuple(int(x) for x in v[:n_layers])


def _smollm3(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    # SmolLM3Config: attention_bias -> q/k/v/o biases, mlp_bias, tie_word_embeddings True, 32768 positions
    bias = r.bool("attention_bias", default=False)
    f = common(r, name, mt, qkv_bias=bias, o_bias=bias, mlp_bias=r.bool("mlp_bias", default=False))
    f["activation"] = activation(r, "silu")
    f["max_position_embeddings"] = r.int("max_position_embeddings", default=32768)
    f["tie_word_embeddings"] = r.bool("tie_word_embeddings", default=True)
    n = f["num_layers"]
    # SmolLM3Config.__post_init__: no_rope_layers[i] = 1 uses rope; default: layer i is NoPE when
    # (i + 1) % no_rope_layer_interval == 0
    rope = flags(r, "no_rope_layers", n)
    if rope is None:
        interval = r.int("no_rope_layer_interval", default=4)
        rope = tuple(int((i + 1) % interval != 0) for i in range(n))
    f["nope_layers"] = tuple(i for i in range(n) if not rope[i])
    # layer_types default: sliding on the NoPE layers when use_sliding_window and sliding_window are set
    # (explicit layer_types decide the masks and the cache layers, create_sliding_window_causal_mask)
    use = r.bool("use_sliding_window", default=False)
    window = r.opt_int("sliding_window")
    explicit = layer_types_explicit(r, n)
    if explicit is not None:
        types = explicit
    elif use and window is not None:
        types = tuple("full_attention" if rope[i] else "sliding_attention" for i in range(n))
    else:
        types = ("full_attention",) * n
    f["layer_types"] = types if "sliding_attention" in types else ()
    f["sliding_window"] = window if f["layer_types"] else None
    return f


READERS["smollm3"] = _smollm3
# llama.cpp LLM_ARCH_SMOLLM3
TRAITS["smollm3"] = {"gguf_arch": "smollm3"}


def _olmo3(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    # Olmo3Config: Olmo2's layout (attention_bias -> q/k/v/o biases, q_norm/k_norm over the whole
    # projections, post-attention and post-feed-forward norms only, tie False) with sliding_window 4096 on
    # three of every four layers (__post_init__: layer i slides unless (i + 1) % 4 == 0)
    bias = r.bool("attention_bias", default=False)
    f = common(r, name, mt, qkv_bias=bias, o_bias=bias, qk_norm="full_width")
    f["activation"] = activation(r, "silu")
    f["tie_word_embeddings"] = r.bool("tie_word_embeddings", default=False)
    n = f["num_layers"]
    explicit = layer_types_explicit(r, n)
    types = explicit or tuple("sliding_attention" if (i + 1) % 4 else "full_attention" for i in range(n))
    f["layer_types"] = types
    f["sliding_window"] = r.window(4096)
    return f


READERS["olmo3"] = _olmo3
# Olmo3DecoderLayer: post_attention_layernorm / post_feedforward_layernorm only (as Olmo2); Olmo3Model
# computes one (cos, sin) per layer type of the config (Olmo3RotaryEmbedding.forward(x, position_ids,
# layer_type)). llama.cpp converts Olmo3ForCausalLM as LLM_ARCH_OLMO2 (convert_hf_to_gguf.py Olmo2Model)
TRAITS["olmo3"] = {
    "norm_placement": "post",
    "rotary_per_layer_type": True,
    "rope_tables_fp32": True,  # Olmo3RotaryEmbedding.forward: cos/sin not cast to x's dtype
    "gguf_arch": "olmo2",
}


def _exaone_pattern(r: ConfigReader, n: int) -> tuple[str, ...]:
    """Layer types from ``sliding_window_pattern``: an int p (layer i full when (i + 1) % p == 0,
    Exaone4Config.__post_init__) or a string of L (local, sliding) and G (global) repeated over the layers
    (the published files' "LLLG")."""
    p = r.get("sliding_window_pattern", default=4)
    if isinstance(p, str):
        if not p or set(p) - {"L", "G"}:
            raise GpumemInputError(
                f"must be an integer or a string of L and G, got {short(p)}",
                source=r.source,
                field="sliding_window_pattern",
            )
        return tuple("sliding_attention" if p[i % len(p)] == "L" else "full_attention" for i in range(n))
    k = r.int("sliding_window_pattern")
    return tuple("sliding_attention" if (i + 1) % k else "full_attention" for i in range(n))


def _exaone4(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    # Exaone4Config: no attention or MLP biases (Exaone4Attention / Exaone4MLP bias=False), per-head q_norm /
    # k_norm, post-attention and post-feed-forward norms only, tie False, 2048 positions, sliding_window
    # 4096 on three of every four layers (sliding_window_pattern 4; a string such as "LLLG" comes with
    # explicit layer_types in the published files); sliding_window null: every layer full
    f = common(r, name, mt, qk_norm="per_head")
    f["activation"] = activation(r, "silu")
    f["tie_word_embeddings"] = r.bool("tie_word_embeddings", default=False)
    n = f["num_layers"]
    window = r.window(4096)
    explicit = layer_types_explicit(r, n)
    if explicit is not None:
        types = explicit
    elif window is None:
        types = ("full_attention",) * n
    else:
        types = _exaone_pattern(r, n)
    f["layer_types"] = types if "sliding_attention" in types else ()
    f["sliding_window"] = window if f["layer_types"] else None
    # Exaone4Attention applies the rotary only when sliding_window is None or the layer slides
    if window is not None:
        f["nope_layers"] = tuple(i for i in range(n) if types[i] == "full_attention")
    return f


READERS["exaone4"] = _exaone4
# Exaone4DecoderLayer: post_attention_layernorm / post_feedforward_layernorm only; llama.cpp LLM_ARCH_EXAONE4
TRAITS["exaone4"] = {"norm_placement": "post", "gguf_arch": "exaone4"}


def _arcee(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    # ArceeConfig: Llama's attention (attention_bias, head_dim), a non-gated MLP up_proj -> act -> down_proj
    # (ArceeMLP, mlp_bias) with hidden_act relu2, tie False, 4096 positions
    bias = r.bool("attention_bias", default=False)
    f = common(r, name, mt, qkv_bias=bias, o_bias=bias, mlp_bias=r.bool("mlp_bias", default=False))
    f["activation"] = activation(r, "relu2")
    f["mlp_gated"] = False
    f["max_position_embeddings"] = r.int("max_position_embeddings", default=4096)
    f["tie_word_embeddings"] = r.bool("tie_word_embeddings", default=False)
    return f


READERS["arcee"] = _arcee
# llama.cpp LLM_ARCH_ARCEE
TRAITS["arcee"] = {"gguf_arch": "arcee"}


def _apertus(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    # ApertusConfig: attention_bias -> q/k/v/o biases, per-head q_norm / k_norm, a non-gated MLP without
    # biases (ApertusMLP up_proj -> act -> down_proj) with hidden_act xielu (XIELUActivation: alpha_p and
    # alpha_n parameters), tie False, 65536 positions
    bias = r.bool("attention_bias", default=False)
    f = common(r, name, mt, qkv_bias=bias, o_bias=bias, qk_norm="per_head")
    f["activation"] = activation(r, "xielu")
    f["mlp_gated"] = False
    f["max_position_embeddings"] = r.int("max_position_embeddings", default=65536)
    f["tie_word_embeddings"] = r.bool("tie_word_embeddings", default=False)
    return f


READERS["apertus"] = _apertus
# ApertusDecoderLayer: attention_layernorm / feedforward_layernorm before each sublayer (Llama's placement);
# llama.cpp LLM_ARCH_APERTUS
TRAITS["apertus"] = {"gguf_arch": "apertus"}


def _cohere2(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    # Cohere2Config: attention_bias -> q/k/v/o biases, a gated MLP without biases, head_dim always
    # hidden_size / num_attention_heads (__post_init__), one LayerNorm without bias per layer feeding
    # attention and MLP in parallel, tie True, 8192 positions, logit_scale 0.0625, sliding_window 4096 on
    # three of every four layers (sliding_window_pattern 4, or layer_types)
    bias = r.bool("attention_bias", default=False)
    f = common(r, name, mt, qkv_bias=bias, o_bias=bias, norm="layernorm", norms_per_layer=1)
    f["activation"] = activation(r, "silu")
    f["head_dim"] = ConfigReader({}, r.source).head_dim(f["hidden_size"], f["num_attention_heads"])
    f["parallel_attn_mlp"] = True
    f["max_position_embeddings"] = r.int("max_position_embeddings", default=8192)
    f["tie_word_embeddings"] = r.bool("tie_word_embeddings", default=True)
    positive_number(r.get("logit_scale", default=0.0625), r.source, "logit_scale")
    n = f["num_layers"]
    window = r.window(4096)
    types = layer_types_explicit(r, n)
    if types is None:
        p = r.int("sliding_window_pattern", default=4)
        types = tuple("sliding_attention" if (i + 1) % p else "full_attention" for i in range(n))
    f["layer_types"] = types if "sliding_attention" in types and window is not None else ()
    f["sliding_window"] = window if f["layer_types"] else None
    # Cohere2Attention applies the rotary on sliding layers only (self.sliding_window is not None)
    f["nope_layers"] = tuple(i for i in range(n) if types[i] != "sliding_attention" or window is None)
    return f


READERS["cohere2"] = _cohere2
# Cohere2LayerNorm (fp32 ops, no bias), Cohere2 apply_rotary_pos_emb (fp32 q/k, interleaved rotate_half),
# Cohere2ForCausalLM logits * logit_scale; llama.cpp LLM_ARCH_COHERE2
TRAITS["cohere2"] = {
    "layernorm_ops": True,
    "rope_upcast": True,
    "logits_scaled": True,
    "gguf_arch": "cohere2",
}


def _gptj(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    # GPTJConfig (attribute_map: n_embd, n_layer, n_head, n_positions): q/k/v/out_proj without biases,
    # fc_in / fc_out with biases (GPTJMLP), n_inner default 4 x n_embd, one nn.LayerNorm (ln_1, with bias)
    # feeding attention and MLP in parallel (GPTJBlock), head_dim n_embd / n_head, rotary over the first
    # rotary_dim (64) channels of each head, lm_head with a bias, tie False, 2048 positions, gelu_new
    h = r.int("n_embd", "hidden_size")
    a = r.int("n_head", "num_attention_heads")
    d = ConfigReader({}, r.source).head_dim(h, a)
    rd = r.int("rotary_dim", default=64)
    if rd > d or rd % 2:
        raise GpumemInputError(
            f"must be even and at most the head dim ({d}), got {rd}", source=r.source, field="rotary_dim"
        )
    n_pos = r.int("n_positions", "max_position_embeddings", default=2048)
    return dict(
        name=name,
        model_type=mt,
        hidden_size=h,
        num_layers=r.int("n_layer", "num_hidden_layers"),
        num_attention_heads=a,
        num_kv_heads=a,
        head_dim=d,
        intermediate_size=r.int("n_inner", default=4 * h),
        vocab_size=r.int("vocab_size"),
        max_position_embeddings=n_pos,
        activation=activation(r, "gelu_new", "activation_function"),
        norm="layernorm",
        norm_bias=True,
        norms_per_layer=1,
        parallel_attn_mlp=True,
        mlp_gated=False,
        mlp_bias=True,
        lm_head_bias=True,
        tie_word_embeddings=r.bool("tie_word_embeddings", default=False),
        rotary_dim=rd if rd < d else None,
    )


READERS["gptj"] = _gptj
# GPTJAttention (out_proj; its own rotary and eager code, replay/gptj.py), GPTJMLP fc_in / fc_out;
# rotate_every_two pairs adjacent channels; resid_dropout on the attention and MLP outputs, embd_pdrop on the
# embeddings; llama.cpp LLM_ARCH_GPTJ
TRAITS["gptj"] = {
    "rope_interleaved": True,
    "attention_code": "gptj",
    "residual_dropout": True,
    "embedding_dropout": True,
    "module_names": (("o_proj", "out_proj"), ("up_proj", "fc_in"), ("down_proj", "fc_out")),
    "gguf_arch": "gptj",
}
