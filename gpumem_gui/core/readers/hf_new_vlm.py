"""Readers of the model types issue 14 adds, group vlm: ``text_config``-wrapped vision-language checkpoints
(fields and defaults: ``models/<type>/configuration_<type>.py``, transformers 5.24; layers:
``models/<type>/modeling_<type>.py``).

* ``qwen2_5_vl`` (Qwen2_5_VLConfig / Qwen2_5_VLForConditionalGeneration): the text model is Qwen2's layers
  (Qwen2_5_VLDecoderLayer: q/k/v with biases, o_proj without, Qwen2MLP) under the multimodal rotary
  (Qwen2_5_VLRotaryEmbedding); the vision tower (Qwen2_5_VisionTransformerPretrainedModel: Conv3d patch
  embedding, ``depth`` Qwen2_5_VLVisionBlock with window attention but for ``fullatt_block_indexes``) and its
  Qwen2_5_VLPatchMerger are counted into VisionSpec.
* ``qwen3_vl`` / ``qwen3_vl_moe`` (Qwen3VLConfig / Qwen3VLMoeConfig, always ``text_config``-wrapped): Qwen3's
  layers (q/k RMSNorm over head_dim, attention_bias on q/k/v/o) under the interleaved multimodal rotary
  (Qwen3VLTextRotaryEmbedding, as Qwen3.5's); the MoE text model is Qwen3-MoE's (Qwen3VLMoeTextSparseMoeBlock,
  its router always renormalising the top-k). Qwen3VLVisionModel: Conv3d patch embedding with bias, a learned
  position table, LayerNorm blocks with a plain GELU MLP, the merger and one deepstack merger per
  ``deepstack_visual_indexes`` entry (their features are added to the first text layers' image positions, so
  a text-only forward runs none of them).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.readers.config_fields import ConfigReader, common, qwen_sliding
from gpumem_gui.core.readers.hf_modern import _moe, _qwen_moe_layers
from gpumem_gui.core.readers.vision_tower import qwen_tower
from gpumem_gui.core.spec.model import MAX_SIZE, VisionSpec

# Qwen2_5_VLTextConfig class defaults (the 72B's shape), for the fields a text config leaves out
_QWEN2_5_VL_TEXT = {
    "vocab_size": 152064,
    "hidden_size": 8192,
    "intermediate_size": 29568,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
    "use_sliding_window": False,
    "sliding_window": 4096,
    "max_window_layers": 80,
}
# Qwen2_5_VLVisionConfig class defaults
_QWEN2_5_VL_VISION = {
    "depth": 32,
    "hidden_size": 3584,
    "intermediate_size": 3420,
    "num_heads": 16,
    "in_channels": 3,
    "patch_size": 14,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "out_hidden_size": 3584,
    "window_size": 112,
    "fullatt_block_indexes": [7, 15, 23, 31],
}
# The largest image Qwen2VLImageProcessor passes (``max_pixels`` 12845056 = 16384 x 28 x 28 in the Qwen2.5-VL
# checkpoints' preprocessor_config.json): 16384 tokens after the 2 x 2 merge; vLLM's encoder-cache profile
# (Qwen2VLProcessingInfo.get_max_image_tokens) sizes one image by it. A w x h image gives (h/28) x (w/28).
_QWEN2_5_VL_MAX_PIXELS = 12845056


def _text_reader(r: ConfigReader, defaults: Mapping[str, Any], flat: bool) -> ConfigReader:
    """The text config of a wrapper: ``text_config`` when the file has one (transformers 5 saves), else with
    ``flat`` the top-level keys (the flat Hub files; Qwen2_5_VLConfig.__post_init__ pops them into the text
    config), else the text config class's defaults (Qwen3VLConfig builds a default text config)."""
    tc = r.get("text_config", default=None)
    if tc is None:
        return ConfigReader({**defaults, **(r.cfg if flat else {})}, r.source)
    if not isinstance(tc, Mapping):
        raise GpumemInputError("must be an object", source=r.source, field="text_config")
    return ConfigReader({**defaults, **tc}, f"{r.source} (text_config)")


def _vision_reader(r: ConfigReader, defaults: Mapping[str, Any]) -> ConfigReader:
    vc = r.get("vision_config", default={})
    if not isinstance(vc, Mapping):
        raise GpumemInputError("must be an object", source=r.source, field="vision_config")
    return ConfigReader({**defaults, **vc}, f"{r.source} (vision_config)")


def _bounded(r: ConfigReader, **counts: int) -> None:
    for what, n in counts.items():
        if n > MAX_SIZE:
            raise GpumemInputError(
                f"the {what} would have {n:,} parameters; gpumem describes up to {MAX_SIZE:,}",
                source=r.source,
                field="vision_config",
            )


def _qwen2_5_vision(v: ConfigReader, merge: int) -> tuple[int, int]:
    """(tower, merger) parameters of Qwen2_5_VisionTransformerPretrainedModel: patch_embed Conv3d(in_channels,
    hidden, [temporal_patch, patch, patch], no bias); per Qwen2_5_VLVisionBlock two RMSNorms, attn.qkv
    Linear(h, 3h) and attn.proj Linear(h, h) with biases, Qwen2_5_VLMLP(bias=True) gate/up/down; the rotary
    table is a buffer. Qwen2_5_VLPatchMerger: ln_q RMSNorm(h), mlp Linear(h m^2, h m^2) and Linear(h m^2,
    out_hidden_size), both biased."""
    h, inter = v.int("hidden_size"), v.int("intermediate_size")
    patch = v.int("in_channels") * v.int("temporal_patch_size") * v.int("patch_size") ** 2 * h
    block = 2 * h + (3 * h * h + 3 * h) + (h * h + h) + (3 * h * inter + 2 * inter + h)
    wide = h * merge * merge
    merger = h + (wide * wide + wide) + (wide * v.int("out_hidden_size") + v.int("out_hidden_size"))
    return patch + v.int("depth") * block, merger


def _qwen2_5_vl(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    """Qwen2_5_VLConfig: Qwen2_5_VLTextConfig from ``text_config`` (or the flat top level);
    Qwen2_5_VLAttention takes head_dim = hidden / heads whatever the config says; ``tie_word_embeddings`` is
    the wrapper's (default False; a text_config's true carries over, Qwen2_5_VLConfig.__post_init__)."""
    tr = _text_reader(r, _QWEN2_5_VL_TEXT, flat=True)
    f = common(tr, name, mt, qkv_bias=True, o_bias=False)
    h, a = f["hidden_size"], f["num_attention_heads"]
    if h % a:
        raise GpumemInputError(
            f"hidden_size ({h}) must be divisible by num_attention_heads ({a}) (Qwen2_5_VLAttention)",
            source=tr.source,
            field="num_attention_heads",
        )
    f["head_dim"] = h // a
    f["layer_types"], f["sliding_window"] = qwen_sliding(tr, f["num_layers"])
    f["tie_word_embeddings"] = r.bool("tie_word_embeddings", default=False) or tr.bool(
        "tie_word_embeddings", default=False
    )
    vr = _vision_reader(r, _QWEN2_5_VL_VISION)
    merge = vr.int("spatial_merge_size")
    tower, merger = _qwen2_5_vision(vr, merge)
    _bounded(r, **{"vision tower": tower, "patch merger": merger})
    side = vr.int("patch_size") * merge
    f["vision"] = VisionSpec(
        kind="qwen2_5_vl_vision",
        tower_params=tower,
        projector_params=merger,
        image_tokens=_QWEN2_5_VL_MAX_PIXELS // (side * side),
        tower=qwen_tower(vr, "qwen2_5_vl", _QWEN2_5_VL_MAX_PIXELS),  # the activations' replay
    )
    return f


# Qwen3VLTextConfig class defaults (head_dim 128; num_key_value_heads defaults to the head count)
_QWEN3_VL_TEXT = {
    "vocab_size": 151936,
    "hidden_size": 4096,
    "intermediate_size": 22016,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "head_dim": 128,
    "max_position_embeddings": 128000,
}
# Qwen3VLMoeTextConfig class defaults (head_dim: hidden / heads when unset, __post_init__)
_QWEN3_VL_MOE_TEXT = {
    "vocab_size": 151936,
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "max_position_embeddings": 128000,
    "moe_intermediate_size": 1408,
    "num_experts_per_tok": 4,
    "num_experts": 60,
}
# Qwen3VLVisionConfig / Qwen3VLMoeVisionConfig class defaults
_QWEN3_VL_VISION = {
    "depth": 27,
    "hidden_size": 1152,
    "intermediate_size": 4304,
    "num_heads": 16,
    "in_channels": 3,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "out_hidden_size": 3584,
    "num_position_embeddings": 2304,
    "deepstack_visual_indexes": [8, 16, 24],
}
# The Qwen3-VL checkpoints' preprocessor_config.json: size.longest_edge 16777216 (patch 16, merge 2), i.e.
# 16384 tokens for the largest image; a w x h image gives (h/32) x (w/32)
_QWEN3_VL_MAX_PIXELS = 16777216


def _qwen3_vision(v: ConfigReader) -> tuple[int, int, int]:
    """(tower, mergers, position table) of Qwen3VLVisionModel: patch_embed Conv3d with bias, pos_embed
    nn.Embedding(num_position_embeddings, h); per Qwen3VLVisionBlock two LayerNorms, qkv/proj with biases,
    Qwen3VLVisionMLP linear_fc1/linear_fc2 with biases. Qwen3VLVisionPatchMerger: LayerNorm (of h, or of
    h m^2 after the shuffle for the deepstack mergers), linear_fc1 (h m^2 -> h m^2), linear_fc2 (-> out)."""
    h, inter, merge = v.int("hidden_size"), v.int("intermediate_size"), v.int("spatial_merge_size")
    patch = v.int("in_channels") * v.int("temporal_patch_size") * v.int("patch_size") ** 2 * h + h
    pos = v.int("num_position_embeddings") * h
    block = 4 * h + (3 * h * h + 3 * h) + (h * h + h) + (h * inter + inter) + (inter * h + h)
    wide, out = h * merge * merge, v.int("out_hidden_size")
    mlp = (wide * wide + wide) + (wide * out + out)
    deep = v.get("deepstack_visual_indexes")
    if not isinstance(deep, list | tuple) or not all(isinstance(i, int) and i >= 0 for i in deep):
        raise GpumemInputError(
            "must be a list of vision block indices", source=v.source, field="deepstack_visual_indexes"
        )
    mergers = (2 * h + mlp) + len(deep) * (2 * wide + mlp)
    return patch + pos + v.int("depth") * block, mergers, pos


def _qwen3_vl(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    """Qwen3VLConfig / Qwen3VLMoeConfig: the text model from ``text_config`` (Qwen3VLTextAttention: q/k/v/o
    biased by attention_bias, q_norm / k_norm; no sliding window), ``tie_word_embeddings`` the wrapper's
    (default False)."""
    moe = mt == "qwen3_vl_moe"
    tr = _text_reader(r, _QWEN3_VL_MOE_TEXT if moe else _QWEN3_VL_TEXT, flat=False)
    bias = tr.bool("attention_bias", default=False)
    f = common(tr, name, mt, qkv_bias=bias, o_bias=bias, qk_norm="per_head")
    f["tie_word_embeddings"] = r.bool("tie_word_embeddings", default=False)
    if moe and tr.int("num_experts", minimum=0) > 0:
        # Qwen3VLMoeTextDecoderLayer: experts where i is not in mlp_only_layers and (i + 1) % step == 0
        f["moe"] = _moe(
            tr,
            "num_experts",
            expert_intermediate_size=tr.int("moe_intermediate_size"),
            dense_layers=_qwen_moe_layers(tr, f["num_layers"]),
        )
    vr = _vision_reader(r, _QWEN3_VL_VISION)
    tower, mergers, pos = _qwen3_vision(vr)
    _bounded(r, **{"vision tower": tower, "patch mergers": mergers})
    side = vr.int("patch_size") * vr.int("spatial_merge_size")
    f["vision"] = VisionSpec(
        kind="qwen3_vl_vision",
        tower_params=tower,
        projector_params=mergers,
        position_embedding_params=pos,
        image_tokens=_QWEN3_VL_MAX_PIXELS // (side * side),
        tower=qwen_tower(vr, "qwen3_vl", _QWEN3_VL_MAX_PIXELS),  # the activations' replay
    )
    return f


# model_type -> reader (ConfigReader, name, model_type) -> ModelSpec fields
READERS: dict[str, Callable[[ConfigReader, str, str], dict[str, Any]]] = {
    "qwen2_5_vl": _qwen2_5_vl,
    "qwen3_vl": _qwen3_vl,
    "qwen3_vl_moe": _qwen3_vl,
}
# model_type -> ArchTraits values that differ from Llama's
TRAITS: dict[str, dict[str, Any]] = {
    # Qwen2_5_VLRotaryEmbedding: [b, q, d] cos/sin per row (the mrope replay); llama.cpp LLM_ARCH_QWEN2VL
    # ("qwen2vl", convert_hf_to_gguf.py Qwen2VLModel also writes Qwen2_5_VLForConditionalGeneration)
    "qwen2_5_vl": {"rotary_mrope": True, "gguf_arch": "qwen2vl"},
    # Qwen3VLTextRotaryEmbedding: the interleaved recomposition of Qwen3.5 (the mrope replay); llama.cpp
    # LLM_ARCH_QWEN3VL ("qwen3vl") / LLM_ARCH_QWEN3VLMOE ("qwen3vlmoe")
    "qwen3_vl": {"rotary_mrope": True, "gguf_arch": "qwen3vl"},
    "qwen3_vl_moe": {"rotary_mrope": True, "gguf_arch": "qwen3vlmoe"},
}
CONFIG_TRAITS: dict[str, Callable[[Mapping[str, Any], str], dict[str, Any]]] = {}
