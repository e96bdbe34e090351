"""Hugging Face ``config.json`` -> :class:`ModelSpec`, per ``model_type``.

Each supported ``model_type`` has a reader that knows which fields its transformers config class uses,
which defaults apply when ``save_pretrained`` left a field out (serialized configs omit values equal to
the base-class defaults, e.g. ``tie_word_embeddings: true``), and which tensors its modeling code builds
(biases, extra norms, fused experts). Defaults below are those of the transformers config classes
(``src/transformers/models/<type>/configuration_<type>.py``, transformers 5.x).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gpumem_gui.core.errors import GpumemInputError, describe_validation_error
from gpumem_gui.core.readers.traits import traits_for
from gpumem_gui.core.spec.model import (
    MAX_LAYERS,
    MAX_SIZE,
    MLASpec,
    ModelSpec,
    MoESpec,
    Provenance,
    VisionSpec,
)

Config = Mapping[str, Any]
_MISSING = object()
_LAYER_FIELDS = {"num_hidden_layers", "n_layer", "max_window_layers", "first_k_dense_replace"}


class _Reader:
    """Typed access to one config dict with errors that name the file and the field."""

    def __init__(self, cfg: Config, source: str) -> None:
        self.cfg = cfg
        self.source = source

    def get(self, *names: str, default: Any = _MISSING) -> Any:
        for n in names:
            if n in self.cfg and self.cfg[n] is not None:
                return self.cfg[n]
        if default is _MISSING:
            raise GpumemInputError("required field is missing", source=self.source, field=names[0])
        return default

    def int(self, *names: str, default: Any = _MISSING, minimum: int = 1) -> int:
        v = self.get(*names, default=default)
        if v is None:
            return v
        if (
            isinstance(v, bool)
            or not isinstance(v, int | float)
            or v != v
            or v in (float("inf"), float("-inf"))
        ):
            raise GpumemInputError(f"must be an integer, got {v!r}", source=self.source, field=names[0])
        if int(v) != v:
            raise GpumemInputError(f"must be an integer, got {v!r}", source=self.source, field=names[0])
        if v < minimum:
            raise GpumemInputError(f"must be >= {minimum}, got {v}", source=self.source, field=names[0])
        maximum = MAX_LAYERS if names[0] in _LAYER_FIELDS else MAX_SIZE
        if v > maximum:
            raise GpumemInputError(f"must be <= {maximum}, got {v}", source=self.source, field=names[0])
        return int(v)

    def opt_int(self, *names: str, minimum: int = 1) -> int | None:
        return self.int(*names, default=None, minimum=minimum)

    def window(self, class_default: int | None) -> int | None:
        """``sliding_window``: an explicit null disables it; an absent key takes the config class default."""
        if "sliding_window" not in self.cfg:
            return class_default
        return self.opt_int("sliding_window")

    def bool(self, *names: str, default: Any = _MISSING) -> bool:
        v = self.get(*names, default=default)
        if not isinstance(v, bool):
            raise GpumemInputError(f"must be true or false, got {v!r}", source=self.source, field=names[0])
        return v

    def head_dim(self, hidden: int, heads: int) -> int:
        hd = self.opt_int("head_dim")
        if hd is not None:
            return hd
        if hidden % heads:
            raise GpumemInputError(
                f"hidden_size ({hidden}) is not divisible by num_attention_heads ({heads}) and no head_dim "
                "is given",
                source=self.source,
                field="num_attention_heads",
            )
        return hidden // heads


def _layer_types_explicit(r: _Reader, n_layers: int) -> tuple[str, ...] | None:
    lt = r.get("layer_types", default=None)
    if lt is None:
        return None
    if not isinstance(lt, list) or len(lt) != n_layers:
        raise GpumemInputError(
            f"must list one type per layer ({n_layers})", source=r.source, field="layer_types"
        )
    allowed = {"full_attention", "sliding_attention"}
    bad = sorted({str(t) for t in lt} - allowed)
    if bad:
        raise GpumemInputError(
            f"unsupported layer type(s) {bad}; supported: {sorted(allowed)}",
            source=r.source,
            field="layer_types",
        )
    return tuple(lt)


def _uniform_sliding(
    r: _Reader, n_layers: int, class_default: int | None = None
) -> tuple[tuple[str, ...], int | None]:
    """Mistral / Phi-3 / Starcoder2: every layer slides when ``sliding_window`` is set."""
    explicit = _layer_types_explicit(r, n_layers)
    window = r.window(class_default)
    if explicit is not None:
        return explicit, window
    if window is None:
        return (), None
    return ("sliding_attention",) * n_layers, window


def _qwen_sliding(r: _Reader, n_layers: int) -> tuple[tuple[str, ...], int | None]:
    """Qwen2/Qwen3: sliding only with ``use_sliding_window``, from layer ``max_window_layers`` on."""
    explicit = _layer_types_explicit(r, n_layers)
    use = r.bool("use_sliding_window", default=False)
    window = r.opt_int("sliding_window") if use else None
    if explicit is not None:
        return explicit, window if "sliding_attention" in explicit else None
    if window is None:
        return (), None
    first = r.int("max_window_layers", default=n_layers, minimum=0)
    types = tuple("sliding_attention" if i >= first else "full_attention" for i in range(n_layers))
    return (types if "sliding_attention" in types else ()), (window if "sliding_attention" in types else None)


def _pattern_sliding(r: _Reader, n_layers: int, default_pattern: int) -> tuple[tuple[str, ...], int | None]:
    """Gemma-2 (every other layer) and Gemma-3 (5 sliding : 1 global): layer i is full when (i+1) % p == 0.

    Gemma2Config and Gemma3TextConfig default ``sliding_window`` to 4096.
    """
    explicit = _layer_types_explicit(r, n_layers)
    window = r.window(4096)
    if explicit is not None:
        return explicit, window
    if window is None:
        return (), None
    p = r.int("sliding_window_pattern", "_sliding_window_pattern", default=default_pattern)
    return tuple("sliding_attention" if (i + 1) % p else "full_attention" for i in range(n_layers)), window


def _common(r: _Reader, name: str, model_type: str, **over: Any) -> dict[str, Any]:
    """Fields shared by the Llama-style families (hidden_size, num_hidden_layers, ...)."""
    h = r.int("hidden_size")
    a = r.int("num_attention_heads")
    n_layers = r.int("num_hidden_layers")
    fields: dict[str, Any] = dict(
        name=name,
        model_type=model_type,
        hidden_size=h,
        num_layers=n_layers,
        num_attention_heads=a,
        num_kv_heads=r.int("num_key_value_heads", default=a),
        head_dim=r.head_dim(h, a),
        intermediate_size=r.int("intermediate_size"),
        vocab_size=r.int("vocab_size"),
        max_position_embeddings=r.int("max_position_embeddings", default=2048),
        activation=str(r.get("hidden_act", "hidden_activation", default="silu")),
    )
    fields.update(over)
    return fields


# ---- readers per model_type ------------------------------------------------------------------------


def _llama(r: _Reader, name: str, mt: str) -> dict[str, Any]:
    # LlamaConfig: attention_bias -> q/k/v/o biases; mlp_bias -> gate/up/down biases; tie default False
    bias = r.bool("attention_bias", default=False)
    f = _common(r, name, mt, qkv_bias=bias, o_bias=bias, mlp_bias=r.bool("mlp_bias", default=False))
    f["tie_word_embeddings"] = r.bool("tie_word_embeddings", default=False)
    f["layer_types"], f["sliding_window"] = _uniform_sliding(r, f["num_layers"])
    return f


def _mistral(r: _Reader, name: str, mt: str) -> dict[str, Any]:
    f = _common(r, name, mt, tie_word_embeddings=r.bool("tie_word_embeddings", default=False))
    # MistralConfig defaults sliding_window to 4096 when the file omits it; MixtralConfig to None.
    default_window = 4096 if mt == "mistral" else None
    f["layer_types"], f["sliding_window"] = _uniform_sliding(r, f["num_layers"], default_window)
    return f


def _mixtral(r: _Reader, name: str, mt: str) -> dict[str, Any]:
    f = _mistral(r, name, mt)
    f["moe"] = MoESpec(
        num_experts=r.int("num_local_experts"),
        experts_per_token=r.int("num_experts_per_tok"),
        expert_intermediate_size=f["intermediate_size"],
    )
    return f


def _qwen_moe_layers(r: _Reader, n_layers: int) -> tuple[int, ...]:
    # Qwen2MoeDecoderLayer / Qwen3MoeDecoderLayer: experts when layer not in mlp_only_layers and
    # (layer + 1) % decoder_sparse_step == 0
    only = r.get("mlp_only_layers", default=[])
    if not isinstance(only, list) or not all(isinstance(i, int) and 0 <= i < n_layers for i in only):
        raise GpumemInputError(
            f"must be a list of layer indices in [0, {n_layers})", source=r.source, field="mlp_only_layers"
        )
    step = r.int("decoder_sparse_step", default=1)
    return tuple(i for i in range(n_layers) if i in only or (i + 1) % step)


def _qwen2(r: _Reader, name: str, mt: str) -> dict[str, Any]:
    # Qwen2Attention: q/k/v carry biases, o_proj does not.
    f = _common(r, name, mt, qkv_bias=True, o_bias=False)
    f["tie_word_embeddings"] = r.bool("tie_word_embeddings", default=False)
    f["layer_types"], f["sliding_window"] = _qwen_sliding(r, f["num_layers"])
    if mt == "qwen2_moe":
        shared = r.int("shared_expert_intermediate_size", default=0, minimum=0)
        f["moe"] = MoESpec(
            num_experts=r.int("num_experts"),
            experts_per_token=r.int("num_experts_per_tok"),
            expert_intermediate_size=r.int("moe_intermediate_size"),
            shared_expert_intermediate_size=shared,
            shared_expert_gate=shared > 0,
            dense_layers=_qwen_moe_layers(r, f["num_layers"]),
        )
    return f


def _qwen3(r: _Reader, name: str, mt: str) -> dict[str, Any]:
    bias = r.bool("attention_bias", default=False)
    f = _common(r, name, mt, qkv_bias=bias, o_bias=bias, qk_norm="per_head")
    f["tie_word_embeddings"] = r.bool("tie_word_embeddings", default=False)
    f["layer_types"], f["sliding_window"] = _qwen_sliding(r, f["num_layers"])
    if mt == "qwen3_moe":
        f["moe"] = MoESpec(
            num_experts=r.int("num_experts"),
            experts_per_token=r.int("num_experts_per_tok"),
            expert_intermediate_size=r.int("moe_intermediate_size"),
            dense_layers=_qwen_moe_layers(r, f["num_layers"]),
        )
    return f


def _gemma(r: _Reader, name: str, mt: str) -> dict[str, Any]:
    bias = r.bool("attention_bias", default=False)
    f = _common(
        r,
        name,
        mt,
        qkv_bias=bias,
        o_bias=bias,
        activation=str(r.get("hidden_activation", "hidden_act", default="gelu_pytorch_tanh")),
    )
    f["tie_word_embeddings"] = r.bool("tie_word_embeddings", default=True)
    if mt in ("gemma2", "gemma3_text"):
        # pre/post attention and pre/post feed-forward norms
        f["norms_per_layer"] = 4
        # Gemma2Config defaults final_logit_softcapping to 30.0, Gemma3TextConfig to None
        cap = r.get("final_logit_softcapping", default=30.0 if mt == "gemma2" else None)
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int | float) or cap <= 0):
            raise GpumemInputError(
                f"must be a positive number, got {cap!r}", source=r.source, field="final_logit_softcapping"
            )
        f["final_logit_softcapping"] = float(cap) if cap is not None else None
        f["layer_types"], f["sliding_window"] = _pattern_sliding(
            r, f["num_layers"], 2 if mt == "gemma2" else 6
        )
    if mt == "gemma3_text":
        f["qk_norm"] = "per_head"
    return f


_GEMMA3_TEXT_DEFAULTS = {
    # Gemma3TextConfig defaults (the 4B config.json leaves most of them out)
    "vocab_size": 262208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "max_position_embeddings": 131072,
    "sliding_window": 4096,
    "sliding_window_pattern": 6,
    "hidden_activation": "gelu_pytorch_tanh",
}

_SIGLIP_DEFAULTS = {
    # SiglipVisionConfig defaults
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "num_channels": 3,
    "image_size": 224,
    "patch_size": 16,
    "vision_use_head": True,
}


def _siglip_params(v: _Reader) -> tuple[int, int]:
    """(tower params, position-table params) of a SigLIP vision tower (SiglipVisionTransformer)."""
    h, inter = v.int("hidden_size"), v.int("intermediate_size")
    layers, ch = v.int("num_hidden_layers"), v.int("num_channels")
    img, patch = v.int("image_size"), v.int("patch_size")
    patches = (img // patch) ** 2
    pos = patches * h
    embed = ch * patch * patch * h + h + pos  # patch conv (weight + bias) + position table
    per_layer = 4 * (h * h + h) + 2 * (2 * h) + (h * inter + inter) + (inter * h + h)
    post_ln = 2 * h
    head = 0
    if v.bool("vision_use_head"):
        # SiglipMultiheadAttentionPoolingHead: probe, MultiheadAttention (in_proj 3h x h + 3h, out_proj),
        # layernorm, MLP
        head = h + (3 * h * h + 3 * h) + (h * h + h) + 2 * h + (h * inter + inter) + (inter * h + h)
    return embed + layers * per_layer + post_ln + head, pos


def _gemma3(r: _Reader, name: str, mt: str) -> dict[str, Any]:
    text_cfg = r.get("text_config", default={})
    if not isinstance(text_cfg, dict):
        raise GpumemInputError("must be an object", source=r.source, field="text_config")
    tr = _Reader({**_GEMMA3_TEXT_DEFAULTS, **text_cfg}, f"{r.source} (text_config)")
    f = _gemma(tr, name, "gemma3_text")
    f["tie_word_embeddings"] = r.bool("tie_word_embeddings", default=True)
    vis_cfg = r.get("vision_config", default=None)
    if vis_cfg is not None:
        if not isinstance(vis_cfg, dict):
            raise GpumemInputError("must be an object", source=r.source, field="vision_config")
        vr = _Reader({**_SIGLIP_DEFAULTS, **vis_cfg}, f"{r.source} (vision_config)")
        tower, pos = _siglip_params(vr)
        vh = vr.int("hidden_size")
        # Gemma3MultiModalProjector: mm_input_projection_weight [vision_hidden, text_hidden]
        # + mm_soft_emb_norm, an RMSNorm(vision_hidden)
        projector = vh * f["hidden_size"] + vh
        f["vision"] = VisionSpec(
            kind="siglip",
            tower_params=tower,
            projector_params=projector,
            position_embedding_params=pos,
            image_tokens=r.int("mm_tokens_per_image", default=256),
        )
    f["model_type"] = mt
    return f


def _phi3(r: _Reader, name: str, mt: str) -> dict[str, Any]:
    # Phi3: fused qkv_proj and gate_up_proj (same element counts as the split layout), no biases.
    f = _common(r, name, mt, tie_word_embeddings=r.bool("tie_word_embeddings", default=False))
    f["layer_types"], f["sliding_window"] = _uniform_sliding(r, f["num_layers"])
    return f


def _olmo2(r: _Reader, name: str, mt: str) -> dict[str, Any]:
    # Olmo2: post-attention and post-feed-forward norms only; q_norm/k_norm over the full projection width
    bias = r.bool("attention_bias", default=False)
    f = _common(r, name, mt, qkv_bias=bias, o_bias=bias, qk_norm="full_width")
    f["tie_word_embeddings"] = r.bool("tie_word_embeddings", default=False)
    return f


def _starcoder2(r: _Reader, name: str, mt: str) -> dict[str, Any]:
    bias = r.bool("use_bias", default=True)
    f = _common(
        r,
        name,
        mt,
        qkv_bias=bias,
        o_bias=bias,
        mlp_bias=bias,
        mlp_gated=False,
        norm="layernorm",
        norm_bias=True,
        activation=str(r.get("hidden_act", default="gelu_pytorch_tanh")),
    )
    f["tie_word_embeddings"] = r.bool("tie_word_embeddings", default=True)
    f["layer_types"], f["sliding_window"] = _uniform_sliding(r, f["num_layers"])
    return f


def _deepseek(r: _Reader, name: str, mt: str) -> dict[str, Any]:
    bias = r.bool("attention_bias", default=False)
    a = r.int("num_attention_heads")
    mla = MLASpec(
        q_lora_rank=r.opt_int("q_lora_rank"),
        kv_lora_rank=r.int("kv_lora_rank"),
        qk_nope_head_dim=r.int("qk_nope_head_dim"),
        qk_rope_head_dim=r.int("qk_rope_head_dim"),
        v_head_dim=r.int("v_head_dim"),
    )
    f = _common(r, name, mt, qkv_bias=bias, o_bias=bias, mla=mla)
    # MLA caches no per-head K/V; num_kv_heads/head_dim describe the decompressed heads for reference.
    f["num_kv_heads"] = a
    f["head_dim"] = mla.qk_head_dim
    f["tie_word_embeddings"] = r.bool("tie_word_embeddings", default=False)
    n_layers = f["num_layers"]
    experts = r.opt_int("n_routed_experts")
    if experts is not None:
        first = r.int("first_k_dense_replace", default=0, minimum=0)
        freq = r.int("moe_layer_freq", default=1)
        shared = r.int("n_shared_experts", default=0, minimum=0)
        moe_f = r.int("moe_intermediate_size")
        f["moe"] = MoESpec(
            num_experts=experts,
            experts_per_token=r.int("num_experts_per_tok"),
            expert_intermediate_size=moe_f,
            shared_expert_intermediate_size=shared * moe_f,
            dense_layers=tuple(i for i in range(n_layers) if i < first or i % freq),
        )
    return f


def _gpt2(r: _Reader, name: str, mt: str) -> dict[str, Any]:
    h = r.int("n_embd", "hidden_size")
    a = r.int("n_head", "num_attention_heads")
    n_pos = r.int("n_positions", "max_position_embeddings", default=1024)
    return dict(
        name=name,
        model_type=mt,
        hidden_size=h,
        num_layers=r.int("n_layer", "num_hidden_layers"),
        num_attention_heads=a,
        num_kv_heads=a,
        head_dim=r.head_dim(h, a),
        intermediate_size=r.int("n_inner", default=4 * h),
        vocab_size=r.int("vocab_size"),
        tie_word_embeddings=r.bool("tie_word_embeddings", default=True),
        position_embedding="learned",
        learned_position_rows=n_pos,
        max_position_embeddings=n_pos,
        norm="layernorm",
        norm_bias=True,
        qkv_bias=True,
        o_bias=True,
        mlp_bias=True,
        mlp_gated=False,
        activation=str(r.get("activation_function", default="gelu_new")),
    )


def _opt(r: _Reader, name: str, mt: str) -> dict[str, Any]:
    h = r.int("hidden_size")
    a = r.int("num_attention_heads")
    bias = r.bool("enable_bias", default=True)
    affine = r.bool("layer_norm_elementwise_affine", default=True)
    if not affine:
        raise GpumemInputError(
            "OPT without affine layer norms is not supported",
            source=r.source,
            field="layer_norm_elementwise_affine",
        )
    max_pos = r.int("max_position_embeddings", default=2048)
    final = r.bool("do_layer_norm_before", default=True) and not r.bool(
        "_remove_final_layer_norm", default=False
    )
    proj = r.int("word_embed_proj_dim", default=h)
    return dict(
        name=name,
        model_type=mt,
        hidden_size=h,
        num_layers=r.int("num_hidden_layers"),
        num_attention_heads=a,
        num_kv_heads=a,
        head_dim=r.head_dim(h, a),
        intermediate_size=r.int("ffn_dim"),
        vocab_size=r.int("vocab_size"),
        tie_word_embeddings=r.bool("tie_word_embeddings", default=True),
        embedding_dim=proj if proj != h else None,
        position_embedding="learned",
        # OPTLearnedPositionalEmbedding keeps 2 extra rows (offset 2)
        learned_position_rows=max_pos + 2,
        max_position_embeddings=max_pos,
        norm="layernorm",
        norm_bias=True,
        final_norm=final,
        qkv_bias=bias,
        o_bias=bias,
        mlp_bias=bias,
        mlp_gated=False,
        activation=str(r.get("activation_function", default="relu")),
    )


def _bloom(r: _Reader, name: str, mt: str) -> dict[str, Any]:
    h = r.int("hidden_size", "n_embed")
    a = r.int("n_head", "num_attention_heads")
    return dict(
        name=name,
        model_type=mt,
        hidden_size=h,
        num_layers=r.int("n_layer", "num_hidden_layers"),
        num_attention_heads=a,
        num_kv_heads=a,
        head_dim=r.head_dim(h, a),
        intermediate_size=4 * h,
        vocab_size=r.int("vocab_size"),
        tie_word_embeddings=r.bool("tie_word_embeddings", default=True),
        embedding_norm=True,
        position_embedding="alibi",
        max_position_embeddings=r.int("seq_length", "max_position_embeddings", default=2048),
        norm="layernorm",
        norm_bias=True,
        qkv_bias=True,
        o_bias=True,
        mlp_bias=True,
        mlp_gated=False,
        activation="gelu",
    )


def _falcon(r: _Reader, name: str, mt: str) -> dict[str, Any]:
    h = r.int("hidden_size")
    a = r.int("num_attention_heads", "n_head")
    new_arch = r.bool("new_decoder_architecture", default=False)
    parallel = r.bool("parallel_attn", default=True)
    if new_arch:
        kv = r.int("num_kv_heads", "n_head_kv", default=a)
    elif r.bool("multi_query", default=True):
        kv = 1
    else:
        kv = a
    n_ln = r.int("num_ln_in_parallel_attn", default=2 if new_arch else 1)
    norms = (2 if new_arch and n_ln == 2 else 1) + (0 if parallel else 1)
    bias = r.bool("bias", default=False)
    alibi = r.bool("alibi", default=False)
    return dict(
        name=name,
        model_type=mt,
        hidden_size=h,
        num_layers=r.int("num_hidden_layers", "n_layer"),
        num_attention_heads=a,
        num_kv_heads=kv,
        head_dim=r.head_dim(h, a),
        intermediate_size=r.int("ffn_hidden_size", default=4 * h),
        vocab_size=r.int("vocab_size"),
        tie_word_embeddings=r.bool("tie_word_embeddings", default=True),
        position_embedding="alibi" if alibi else "rope",
        max_position_embeddings=r.int("max_position_embeddings", default=2048),
        norm="layernorm",
        norm_bias=True,
        norms_per_layer=norms,
        qkv_bias=bias,
        o_bias=bias,
        mlp_bias=bias,
        mlp_gated=False,
        parallel_attn_mlp=parallel,
        transformers_expands_kv=new_arch and kv < a,
        activation=str(r.get("activation", default="gelu")),
    )


def _gpt_neox(r: _Reader, name: str, mt: str) -> dict[str, Any]:
    bias = r.bool("attention_bias", default=True)
    f = _common(
        r,
        name,
        mt,
        qkv_bias=bias,
        o_bias=bias,
        mlp_bias=True,
        mlp_gated=False,
        norm="layernorm",
        norm_bias=True,
        parallel_attn_mlp=r.bool("use_parallel_residual", default=True),
        activation=str(r.get("hidden_act", default="gelu")),
    )
    f["num_kv_heads"] = f["num_attention_heads"]
    f["tie_word_embeddings"] = r.bool("tie_word_embeddings", default=False)
    return f


READERS: dict[str, Callable[[_Reader, str, str], dict[str, Any]]] = {
    "llama": _llama,
    "granite": _llama,
    "mistral": _mistral,
    "mixtral": _mixtral,
    "qwen2": _qwen2,
    "qwen2_moe": _qwen2,
    "qwen3": _qwen3,
    "qwen3_moe": _qwen3,
    "gemma": _gemma,
    "gemma2": _gemma,
    "gemma3_text": _gemma,
    "gemma3": _gemma3,
    "phi3": _phi3,
    "olmo2": _olmo2,
    "starcoder2": _starcoder2,
    "deepseek_v2": _deepseek,
    "deepseek_v3": _deepseek,
    "gpt2": _gpt2,
    "opt": _opt,
    "bloom": _bloom,
    "falcon": _falcon,
    "gpt_neox": _gpt_neox,
}

SUPPORTED_MODEL_TYPES = tuple(sorted(READERS))


def spec_from_config(
    cfg: Config, *, name: str, source: str = "config.json", provenance: Provenance | None = None
) -> ModelSpec:
    """Build a :class:`ModelSpec` from a parsed ``config.json`` dict."""
    if not isinstance(cfg, Mapping):
        raise GpumemInputError("a config.json must hold a JSON object", source=source)
    mt = cfg.get("model_type")
    if not isinstance(mt, str) or not mt:
        raise GpumemInputError(
            "no model_type; is this a Hugging Face config.json?", source=source, field="model_type"
        )
    reader = READERS.get(mt)
    if reader is None:
        raise GpumemInputError(
            f"model_type '{mt}' is not supported; supported: {', '.join(SUPPORTED_MODEL_TYPES)}. "
            "For other architectures, open the model's .safetensors files: their headers give exact "
            "weight sizes.",
            source=source,
            field="model_type",
        )
    fields = reader(_Reader(cfg, source), name, mt)
    fields["traits"] = traits_for(mt, cfg, source)
    fields["provenance"] = provenance or Provenance(kind="config.json", source=source)
    try:
        return ModelSpec(**fields)
    except ValidationError as e:
        raise describe_validation_error(e, source=source) from None


def read_json_file(path: Path) -> Any:
    """Read a JSON file; any problem becomes one :class:`GpumemInputError` naming the file."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise GpumemInputError(f"cannot read file: {e.strerror or e}", source=str(path)) from None
    except UnicodeDecodeError:
        raise GpumemInputError("not a UTF-8 text file", source=str(path)) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise GpumemInputError(
            f"malformed JSON at line {e.lineno} column {e.colno}: {e.msg}", source=str(path)
        ) from None
    except RecursionError:
        raise GpumemInputError("JSON nested too deeply", source=str(path)) from None


def load_config_file(path: Path) -> ModelSpec:
    """``config.json`` file -> spec, named after its folder (``org__name.json`` files: ``org/name``)."""
    cfg = read_json_file(path)
    stem = path.parent.name if path.name == "config.json" else path.stem
    name = stem.replace("__", "/") if stem else "model"
    return spec_from_config(cfg, name=name, source=str(path))
