"""Readers of group dense_b, second part: Ministral, the ``text_config``-wrapped Mistral-3 checkpoints
(Mistral-Small-3.1/3.2) with their Pixtral vision tower and projector, and GPT-BigCode (StarCoder,
SantaCoder, OctoCoder). Fields and defaults: ``models/<type>/configuration_<type>.py`` (transformers 5.24)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.readers import hf_legacy, hf_modern, hf_new_mla
from gpumem_gui.core.readers.config_fields import ConfigReader, common, uniform_sliding
from gpumem_gui.core.readers.vision_tower import pixtral_tower
from gpumem_gui.core.spec.model import MAX_SIZE, VisionSpec


def _ministral(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    """MinistralConfig: Mistral's fields, sliding_window default 4096, layer_types (default: every layer
    sliding when a window is set), head_dim default hidden / heads, 8 KV heads by default."""
    f = common(r, name, mt, tie_word_embeddings=r.bool("tie_word_embeddings", default=False))
    f["num_kv_heads"] = r.int("num_key_value_heads", default=8)
    f["max_position_embeddings"] = r.int("max_position_embeddings", default=4096 * 32)
    f["layer_types"], f["sliding_window"] = uniform_sliding(r, f["num_layers"], 4096)
    if "sliding_attention" not in f["layer_types"]:
        f["sliding_window"] = None  # MinistralModel builds no sliding mask then; the cache keeps every token
    return f


def _ministral3(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    """Ministral3Config: head_dim 128 and 8 KV heads by default, sliding_window None (Ministral3Model builds a
    sliding mask only when one is set), max_position_embeddings 262144; every layer scales its queries by
    position (the config's rope_parameters carry llama_4_scaling_beta)."""
    f = common(r, name, mt, tie_word_embeddings=r.bool("tie_word_embeddings", default=False))
    f["num_kv_heads"] = r.int("num_key_value_heads", default=8)
    f["head_dim"] = r.int("head_dim", default=128)
    f["max_position_embeddings"] = r.int("max_position_embeddings", default=262144)
    f["layer_types"], f["sliding_window"] = uniform_sliding(r, f["num_layers"])
    return f


# Mistral3Config.sub_configs_defaults: the text_config a file without one gets (Mistral-Small-3.1-24B)
_MISTRAL3_TEXT = {
    "model_type": "mistral",
    "head_dim": 128,
    "hidden_size": 5120,
    "intermediate_size": 32768,
    "max_position_embeddings": 131072,
    "num_attention_heads": 32,
    "num_hidden_layers": 40,
    "num_key_value_heads": 8,
    "sliding_window": None,
    "vocab_size": 131072,
}
# ... and its vision_config (PixtralVisionConfig defaults under it: num_channels 3)
_MISTRAL3_VISION = {
    "intermediate_size": 4096,
    "hidden_size": 1024,
    "patch_size": 14,
    "image_size": 1540,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "num_channels": 3,
}
# PixtralVisionConfig defaults for the fields a vision_config leaves out
_PIXTRAL_DEFAULTS = {
    "hidden_size": 1024,
    "intermediate_size": 4096,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "num_channels": 3,
    "image_size": 1024,
    "patch_size": 16,
}
_TEXT_READERS: dict[str, Callable[[ConfigReader, str, str], dict[str, Any]]] = {
    "mistral": hf_modern._mistral,
    "ministral": _ministral,
    "ministral3": _ministral3,
    "mistral4": hf_new_mla.mistral4,  # Mistral-Small-4: MLA and MoE (Mistral3Model's language_model)
}


def _sub(r: ConfigReader, key: str, defaults: Mapping[str, Any]) -> ConfigReader:
    sub = r.get(key, default=None)
    if sub is None:
        return ConfigReader(dict(defaults), f"{r.source} ({key}, class defaults)")
    if not isinstance(sub, Mapping):
        raise GpumemInputError("must be an object", source=r.source, field=key)
    return ConfigReader(sub, f"{r.source} ({key})")


def _pixtral_params(v: ConfigReader) -> int:
    """PixtralVisionModel: patch_conv (Conv2d without bias), ln_pre, and per layer attention_norm, ffn_norm,
    q/k/v/o (no bias) and a gated MLP (gate/up/down, no bias); the rotary table is a buffer."""
    h, inter = v.int("hidden_size"), v.int("intermediate_size")
    ch, patch = v.int("num_channels"), v.int("patch_size")
    per_layer = 2 * h + 4 * h * h + 3 * h * inter
    return ch * patch * patch * h + h + v.int("num_hidden_layers") * per_layer


def _mistral3(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    """Mistral3ForConditionalGeneration: the text model (``text_config``, Mistral or Ministral) replayed as it
    is, the Pixtral tower and Mistral3MultiModalProjector counted into VisionSpec: norm RMSNorm(vision
    hidden), patch_merger.merging_layer Linear(vh x merge^2 -> vh, no bias), linear_1 (vh x feature layers ->
    text hidden) and linear_2 (text -> text), biased when multimodal_projector_bias."""
    tr = _sub(r, "text_config", _MISTRAL3_TEXT)
    text_type = tr.get("model_type", default="mistral")
    reader = _TEXT_READERS.get(text_type) if isinstance(text_type, str) else None
    if reader is None:
        raise GpumemInputError(
            f"{text_type!r} is not supported; supported: {sorted(_TEXT_READERS)}",
            source=tr.source,
            field="model_type",
        )
    f = reader(tr, name, text_type)
    f["model_type"] = mt
    if r.get("vision_config", default=None) is None and "text_config" in r.cfg:
        return f  # no vision tower (a text-only export)
    vr = _sub(r, "vision_config", _MISTRAL3_VISION)
    vr = ConfigReader({**_PIXTRAL_DEFAULTS, **vr.cfg}, vr.source)
    vh, th = vr.int("hidden_size"), f["hidden_size"]
    merge = r.int("spatial_merge_size", default=2)
    layers = r.get("vision_feature_layer", default=-1)
    n_feat = len(layers) if isinstance(layers, list) else 1
    bias = r.bool("multimodal_projector_bias", default=False)
    projector = vh + vh * merge * merge * vh + (vh * n_feat * th + th * th) + (2 * th if bias else 0)
    tower = _pixtral_params(vr)
    for what, n in (("Pixtral tower", tower), ("projector", projector)):
        if n > MAX_SIZE:
            raise GpumemInputError(
                f"the {what} would have {n:,} parameters; gpumem describes up to {MAX_SIZE:,}",
                source=r.source,
                field="vision_config",
            )
    side = vr.int("image_size") // (vr.int("patch_size") * merge)
    f["vision"] = VisionSpec(
        kind="pixtral",
        tower_params=tower,
        projector_params=projector,
        # a full-size image: side x side merged patches, an [IMG_BREAK] ending each row ([IMG_END] the last)
        image_tokens=side * side + side,
        tower=pixtral_tower(vr, merge, th) if isinstance(layers, int) else None,  # replay/vision_pixtral.py
    )
    # Mistral3ForConditionalGeneration ties lm_head to the text embedding by the top-level key
    # (Mistral3Config.tie_word_embeddings, default True; measured: a file without it builds a tied head)
    f["tie_word_embeddings"] = r.bool("tie_word_embeddings", default=True)
    return f


def _gpt_bigcode(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    """GPTBigCodeConfig: GPT-2's fields (n_embd, n_layer, n_head, n_inner, n_positions) and blocks, with
    multi_query (default True: one K/V head, GPTBigCodeAttention kv_heads) in c_attn [h + 2 x kv_dim];
    activation_function default gelu_pytorch_tanh; head_dim = hidden / heads."""
    f = hf_legacy._gpt2(r, name, mt)
    if r.bool("add_cross_attention", default=False):
        raise GpumemInputError(
            "cross-attention GPT-BigCode models are not supported",
            source=r.source,
            field="add_cross_attention",
        )
    f["num_kv_heads"] = 1 if r.bool("multi_query", default=True) else f["num_attention_heads"]
    f["activation"] = str(r.get("activation_function", default="gelu_pytorch_tanh"))
    f["head_dim"] = f["hidden_size"] // f["num_attention_heads"]
    if f["head_dim"] * f["num_attention_heads"] != f["hidden_size"]:
        raise GpumemInputError(
            "n_embd must be divisible by n_head (GPTBigCodeAttention)", source=r.source, field="n_head"
        )
    return f


def _mistral3_text_traits(cfg: Mapping[str, Any], source: str) -> dict[str, Any]:
    """A Mistral-3 wrapper around a Ministral-3 text model has its traits: Ministral3Attention's query
    scaling, llama.cpp's LLM_ARCH_MISTRAL3."""
    text = cfg.get("text_config")
    if isinstance(text, Mapping) and text.get("model_type") == "ministral3":
        return dict(TRAITS["ministral3"])
    if isinstance(text, Mapping) and text.get("model_type") == "mistral4":
        return {**hf_new_mla.TRAITS["mistral4"], "gguf_arch": None}  # not llama's: an MLA model
    return {}


def _bigcode_dropouts(cfg: Mapping[str, Any], source: str) -> dict[str, Any]:
    """GPTBigCodeConfig defaults resid_pdrop, embd_pdrop and attn_pdrop to 0.1 (a file leaving them out)."""
    out: dict[str, Any] = {}
    if cfg.get("resid_pdrop") is None:
        out["hidden_dropout"] = 0.1
    if cfg.get("attn_pdrop") is None:
        out["attention_dropout"] = 0.1
    return out


READERS: dict[str, Callable[[ConfigReader, str, str], dict[str, Any]]] = {
    "ministral": _ministral,
    "ministral3": _ministral3,
    "mistral3": _mistral3,
    "gpt_bigcode": _gpt_bigcode,
}
_GPT2_NAMES = (("qkv_proj", "c_attn"), ("o_proj", "c_proj"), ("up_proj", "c_fc"), ("down_proj", "c_proj"))
TRAITS: dict[str, dict[str, Any]] = {
    # MinistralForCausalLM is Mistral's code with per-layer attention types; llama.cpp converts it as llama
    "ministral": {"gguf_arch": "llama"},
    # the text model is MistralModel; convert_hf_to_gguf.py writes Mistral3ForConditionalGeneration's text
    # model as LLM_ARCH_LLAMA
    "mistral3": {"gguf_arch": "llama"},
    # Ministral3Attention: queries scaled by get_llama_4_attn_scale; llama.cpp LLM_ARCH_MISTRAL3
    "ministral3": {"query_position_scale": True, "gguf_arch": "mistral3"},
    # GPTBigCodeAttention.c_attn (fused q/k/v), resid_dropout; GPTBigCodeMLP c_fc / c_proj and dropout;
    # GPTBigCodeModel.drop; GPTBigCodeBlock keeps attn_output to its end; eager softmax in fp32
    # (eager_attention_forward softmax(dtype=float32)); llama.cpp LLM_ARCH_STARCODER
    "gpt_bigcode": {
        "fused_qkv": True,
        "module_names": _GPT2_NAMES,
        "residual_dropout": True,
        "embedding_dropout": True,
        "attn_output_kept": True,
        "causal_mask_buffer": True,  # GPTBigCodeModel.bias [n_positions, n_positions] bool
        "gguf_arch": "starcoder",
    },
}
CONFIG_TRAITS: dict[str, Callable[[Mapping[str, Any], str], dict[str, Any]]] = {
    "gpt_bigcode": _bigcode_dropouts,
    "mistral3": _mistral3_text_traits,
}
