"""``config.json`` readers of the Llama-style families (Llama, Mistral/Mixtral, Qwen2/3 and their MoE,
Gemma 1-3, Phi-3, OLMo-2, Starcoder2, DeepSeek-V2/V3): which fields each transformers config class uses and
which defaults apply (``models/<type>/configuration_<type>.py``, transformers 5.x)."""

from __future__ import annotations

from typing import Any

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.readers.config_fields import (
    ConfigReader,
    common,
    pattern_sliding,
    positive_number,
    qwen_sliding,
    uniform_sliding,
)
from gpumem_gui.core.readers.vision_tower import siglip_tower
from gpumem_gui.core.spec.model import MAX_SIZE, MLASpec, MoESpec, VisionSpec


def _moe(r: ConfigReader, experts_key: str, **rest: Any) -> MoESpec:
    """A MoESpec from the config's expert count (``experts_key``) and ``num_experts_per_tok`` (every family
    here spells top-k so); a top-k above the expert count is an error naming the config's own key."""
    experts = r.int(experts_key)
    top_k = r.int("num_experts_per_tok")
    if top_k > experts:
        raise GpumemInputError(
            f"is {top_k}, more than the {experts} experts ({experts_key})",
            source=r.source,
            field="num_experts_per_tok",
        )
    return MoESpec(num_experts=experts, experts_per_token=top_k, **rest)


def _llama(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    # LlamaConfig: attention_bias -> q/k/v/o biases; mlp_bias -> gate/up/down biases; tie default False
    bias = r.bool("attention_bias", default=False)
    f = common(r, name, mt, qkv_bias=bias, o_bias=bias, mlp_bias=r.bool("mlp_bias", default=False))
    f["tie_word_embeddings"] = r.bool("tie_word_embeddings", default=False)
    f["layer_types"], f["sliding_window"] = uniform_sliding(r, f["num_layers"])
    return f


def _mistral(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    f = common(r, name, mt, tie_word_embeddings=r.bool("tie_word_embeddings", default=False))
    # MistralConfig defaults sliding_window to 4096 when the file omits it; MixtralConfig to None.
    default_window = 4096 if mt == "mistral" else None
    f["layer_types"], f["sliding_window"] = uniform_sliding(r, f["num_layers"], default_window)
    return f


def _mixtral(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    f = _mistral(r, name, mt)
    f["moe"] = _moe(r, "num_local_experts", expert_intermediate_size=f["intermediate_size"])
    return f


def _qwen_moe_layers(r: ConfigReader, n_layers: int) -> tuple[int, ...]:
    # Qwen2MoeDecoderLayer / Qwen3MoeDecoderLayer: experts when layer not in mlp_only_layers and
    # (layer + 1) % decoder_sparse_step == 0
    only = r.get("mlp_only_layers", default=[])
    if not isinstance(only, list) or not all(isinstance(i, int) and 0 <= i < n_layers for i in only):
        raise GpumemInputError(
            f"must be a list of layer indices in [0, {n_layers})", source=r.source, field="mlp_only_layers"
        )
    step = r.int("decoder_sparse_step", default=1)
    return tuple(i for i in range(n_layers) if i in only or (i + 1) % step)


def _qwen2(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    # Qwen2Attention: q/k/v carry biases, o_proj does not.
    f = common(r, name, mt, qkv_bias=True, o_bias=False)
    f["tie_word_embeddings"] = r.bool("tie_word_embeddings", default=False)
    f["layer_types"], f["sliding_window"] = qwen_sliding(r, f["num_layers"])
    if mt == "qwen2_moe":
        shared = r.int("shared_expert_intermediate_size", default=0, minimum=0)
        f["moe"] = _moe(
            r,
            "num_experts",
            expert_intermediate_size=r.int("moe_intermediate_size"),
            shared_expert_intermediate_size=shared,
            shared_expert_gate=shared > 0,
            dense_layers=_qwen_moe_layers(r, f["num_layers"]),
        )
    return f


def _qwen3(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    bias = r.bool("attention_bias", default=False)
    f = common(r, name, mt, qkv_bias=bias, o_bias=bias, qk_norm="per_head")
    f["tie_word_embeddings"] = r.bool("tie_word_embeddings", default=False)
    f["layer_types"], f["sliding_window"] = qwen_sliding(r, f["num_layers"])
    if mt == "qwen3_moe":
        f["moe"] = _moe(
            r,
            "num_experts",
            expert_intermediate_size=r.int("moe_intermediate_size"),
            dense_layers=_qwen_moe_layers(r, f["num_layers"]),
        )
    return f


def _gemma(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    bias = r.bool("attention_bias", default=False)
    f = common(
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
        f["final_logit_softcapping"] = (
            positive_number(cap, r.source, "final_logit_softcapping") if cap is not None else None
        )
        f["layer_types"], f["sliding_window"] = pattern_sliding(
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


def _siglip_params(v: ConfigReader) -> tuple[int, int]:
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


def _gemma3(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    text_cfg = r.get("text_config", default={})
    if not isinstance(text_cfg, dict):
        raise GpumemInputError("must be an object", source=r.source, field="text_config")
    tr = ConfigReader({**_GEMMA3_TEXT_DEFAULTS, **text_cfg}, f"{r.source} (text_config)")
    f = _gemma(tr, name, "gemma3_text")
    f["tie_word_embeddings"] = r.bool("tie_word_embeddings", default=True)
    vis_cfg = r.get("vision_config", default=None)
    if vis_cfg is not None:
        if not isinstance(vis_cfg, dict):
            raise GpumemInputError("must be an object", source=r.source, field="vision_config")
        vr = ConfigReader({**_SIGLIP_DEFAULTS, **vis_cfg}, f"{r.source} (vision_config)")
        tower, pos = _siglip_params(vr)
        tokens = r.int("mm_tokens_per_image", default=256)
        vh = vr.int("hidden_size")
        # Gemma3MultiModalProjector: mm_input_projection_weight [vision_hidden, text_hidden]
        # + mm_soft_emb_norm, an RMSNorm(vision_hidden)
        projector = vh * f["hidden_size"] + vh
        for what, n in (("SigLIP tower", tower), ("projector", projector)):
            if n > MAX_SIZE:  # VisionSpec's bound (Gemma 3's own tower has ~0.42 B parameters)
                raise GpumemInputError(
                    f"the {what} would have {n:,} parameters; gpumem describes up to {MAX_SIZE:,}",
                    source=r.source,
                    field="vision_config",
                )
        f["vision"] = VisionSpec(
            kind="siglip",
            tower_params=tower,
            projector_params=projector,
            position_embedding_params=pos,
            image_tokens=tokens,
            tower=siglip_tower(
                vr, tokens, f["hidden_size"]
            ),  # the activations' replay (replay/vision_siglip.py)
        )
    f["model_type"] = mt
    return f


def _phi3(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    # Phi3: fused qkv_proj and gate_up_proj (same element counts as the split layout), no biases.
    f = common(r, name, mt, tie_word_embeddings=r.bool("tie_word_embeddings", default=False))
    f["layer_types"], f["sliding_window"] = uniform_sliding(r, f["num_layers"])
    return f


def _olmo2(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    # Olmo2: post-attention and post-feed-forward norms only; q_norm/k_norm over the full projection width
    bias = r.bool("attention_bias", default=False)
    f = common(r, name, mt, qkv_bias=bias, o_bias=bias, qk_norm="full_width")
    f["tie_word_embeddings"] = r.bool("tie_word_embeddings", default=False)
    return f


def _starcoder2(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    bias = r.bool("use_bias", default=True)
    f = common(
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
    f["layer_types"], f["sliding_window"] = uniform_sliding(r, f["num_layers"])
    return f


def _deepseek(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    bias = r.bool("attention_bias", default=False)
    a = r.int("num_attention_heads")
    mla = MLASpec(
        q_lora_rank=r.opt_int("q_lora_rank"),
        kv_lora_rank=r.int("kv_lora_rank"),
        qk_nope_head_dim=r.int("qk_nope_head_dim"),
        qk_rope_head_dim=r.int("qk_rope_head_dim"),
        v_head_dim=r.int("v_head_dim"),
    )
    f = common(r, name, mt, qkv_bias=bias, o_bias=bias, mla=mla)
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
        f["moe"] = _moe(
            r,
            "n_routed_experts",
            expert_intermediate_size=moe_f,
            shared_expert_intermediate_size=shared * moe_f,
            dense_layers=tuple(i for i in range(n_layers) if i < first or i % freq),
        )
    return f
