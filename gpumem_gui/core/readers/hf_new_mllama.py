"""Readers of the model types issue 14 adds, group mllama: Llama 3.2 Vision (fields and defaults:
``models/mllama/configuration_mllama.py``, transformers 5.24; layers: ``models/mllama/modeling_mllama.py``).

* ``mllama`` (MllamaConfig / MllamaForConditionalGeneration): the text model (MllamaTextModel) is Llama's
  decoder with a gated cross-attention layer at each ``cross_attention_layers`` index
  (MllamaCrossAttentionDecoderLayer: q/k/v/o without biases, q_norm / k_norm RMSNorms over head_dim, the
  scalar ``cross_attn_attn_gate`` / ``cross_attn_mlp_gate``, MllamaTextMLP) in place of a self-attention
  layer; its token table has ``vocab_size + 8`` rows, the head ``vocab_size``. A text-only forward skips the
  cross-attention layers (spec/cross_attention.py, replay/cross_attention.py).
* MllamaVisionModel: a Conv2d patch embedding (no bias), the class token, gated position and tile tables,
  a ``num_hidden_layers`` local encoder and a ``num_global_layers`` gated global encoder (LayerNorm blocks,
  q/k/v/o without biases, fc1/fc2 with biases); MllamaModel.multi_modal_projector: Linear(vision_output_dim,
  hidden) with bias.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gpumem_gui.core.errors import GpumemInputError, short
from gpumem_gui.core.readers.config_fields import ConfigReader, common
from gpumem_gui.core.spec.model import MAX_SIZE, VisionSpec

# MllamaTextConfig class defaults (the 11B's text model)
_TEXT: dict[str, Any] = {
    "vocab_size": 128256,
    "hidden_size": 4096,
    "hidden_act": "silu",
    "num_hidden_layers": 40,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "max_position_embeddings": 131072,
    "cross_attention_layers": [3, 8, 13, 18, 23, 28, 33, 38],
}
# MllamaVisionConfig class defaults
_VISION: dict[str, Any] = {
    "hidden_size": 1280,
    "num_hidden_layers": 32,
    "num_global_layers": 8,
    "attention_heads": 16,
    "num_channels": 3,
    "intermediate_size": 5120,
    "vision_output_dim": 7680,
    "image_size": 448,
    "patch_size": 14,
    "max_num_tiles": 4,
    "supported_aspect_ratios": [[1, 1], [1, 2], [1, 3], [1, 4], [2, 1], [2, 2], [3, 1], [4, 1]],
}
# MllamaTextModel.embed_tokens: nn.Embedding(config.vocab_size + 8, hidden_size, padding_idx)
_EMBEDDING_PADDING_ROWS = 8


def _sub(r: ConfigReader, key: str, defaults: Mapping[str, Any]) -> ConfigReader:
    """``text_config`` / ``vision_config`` over its config class's defaults."""
    sub = r.get(key, default={})
    if not isinstance(sub, Mapping):
        raise GpumemInputError("must be an object", source=r.source, field=key)
    return ConfigReader({**defaults, **sub}, f"{r.source} ({key})")


def _cross_layers(r: ConfigReader, n: int) -> frozenset[int]:
    v = r.get("cross_attention_layers")
    ok = isinstance(v, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in v)
    if not ok or not all(0 <= i < n for i in v):
        raise GpumemInputError(
            f"must be a list of layer indices below num_hidden_layers ({n}), got {short(v)}",
            source=r.source,
            field="cross_attention_layers",
        )
    return frozenset(v)


def _side(v: ConfigReader, key: str) -> int:
    """``image_size`` / ``patch_size``: an int (MllamaVisionModel squares it: ``(image_size // patch_size)
    ** 2``); a [h, w] pair of equal sides reads as that side."""
    x = v.get(key)
    if isinstance(x, list | tuple) and len(x) == 2 and x[0] == x[1]:
        x = x[0]
    if isinstance(x, bool) or not isinstance(x, int) or x < 1:
        raise GpumemInputError(f"must be a positive integer, got {short(x)}", source=v.source, field=key)
    return x


def _vision(v: ConfigReader) -> tuple[int, int, int]:
    """(tower, its nn.Embedding tables, patches per tile) of MllamaVisionModel."""
    h, inter = v.int("hidden_size"), v.int("intermediate_size")
    heads = v.int("attention_heads", "num_attention_heads")
    if h % heads:
        raise GpumemInputError(
            f"hidden_size ({h}) must be divisible by attention_heads ({heads}) (MllamaVisionAttention)",
            source=v.source,
            field="attention_heads",
        )
    tiles = v.int("max_num_tiles")
    ratios = v.get("supported_aspect_ratios")
    if not isinstance(ratios, list) or not ratios:
        raise GpumemInputError(
            f"must be a non-empty list, got {short(ratios)}", source=v.source, field="supported_aspect_ratios"
        )
    ids = len(ratios) + 1  # max_aspect_ratio_id + 1 rows (id 0: padding)
    img, patch = _side(v, "image_size"), _side(v, "patch_size")
    patches = (img // patch) ** 2 + 1  # + the class token
    # MllamaPrecomputedPositionEmbedding: gate, embedding [patches, h], tile_embedding (ids, tiles x patches
    # x h)
    position = 1 + patches * h + ids * tiles * patches * h
    # pre/post MllamaPrecomputedAspectRatioEmbedding: embedding (ids, tiles x h) and a gate each
    aspect = 2 * (ids * tiles * h + 1)
    # patch_embedding Conv2d (no bias), class_embedding, layernorm_pre / layernorm_post (weight and bias)
    embed = v.int("num_channels") * patch * patch * h + h + 2 * 2 * h
    # MllamaVisionEncoderLayer: q/k/v/o without biases, fc1/fc2 with biases, two LayerNorms; global layers
    # add gate_attn and gate_ffn
    layer = 4 * h * h + (h * inter + inter) + (inter * h + h) + 2 * 2 * h
    local, glob = v.int("num_hidden_layers", minimum=0), v.int("num_global_layers", minimum=0)
    tower = embed + position + aspect + local * layer + glob * (layer + 2)
    return tower, ids * tiles * patches * h + aspect - 2, patches


def _mllama(r: ConfigReader, name: str, mt: str) -> dict[str, Any]:
    """MllamaConfig: MllamaTextConfig from ``text_config``, MllamaVisionConfig from ``vision_config``;
    MllamaTextSelfAttention / MllamaTextCrossAttention take head_dim = hidden / heads."""
    tr = _sub(r, "text_config", _TEXT)
    f = common(tr, name, mt)
    h, a, n = f["hidden_size"], f["num_attention_heads"], f["num_layers"]
    if h % a:
        raise GpumemInputError(
            f"hidden_size ({h}) must be divisible by num_attention_heads ({a}) (MllamaTextSelfAttention)",
            source=tr.source,
            field="num_attention_heads",
        )
    f["head_dim"] = h // a
    cross = _cross_layers(tr, n)
    f["layer_types"] = tuple("cross_attention" if i in cross else "full_attention" for i in range(n))
    f["tie_word_embeddings"] = tr.bool("tie_word_embeddings", default=False)
    f["embedding_padding_rows"] = _EMBEDDING_PADDING_ROWS
    vr = _sub(r, "vision_config", _VISION)
    tower, position, patches = _vision(vr)
    projector = vr.int("vision_output_dim") * h + h  # multi_modal_projector, with bias
    for what, count in (("vision tower", tower), ("projector", projector)):
        if count > MAX_SIZE:
            raise GpumemInputError(
                f"the {what} would have {count:,} parameters; gpumem describes up to {MAX_SIZE:,}",
                source=r.source,
                field="vision_config",
            )
    # image_tokens: the vision tokens one image gives each cross-attention layer (every tile is padded to
    # max_num_tiles by MllamaImageProcessor; MllamaForConditionalGeneration._prepare_static_cache sizes the
    # cross-attention cache num_images x max_num_tiles x num_patches); it adds one <|image|> token to the text
    f["vision"] = VisionSpec(
        kind="mllama_vision",
        tower_params=tower,
        projector_params=projector,
        position_embedding_params=position,
        image_tokens=vr.int("max_num_tiles") * patches,
    )
    return f


# model_type -> reader (ConfigReader, name, model_type) -> ModelSpec fields
READERS: dict[str, Callable[[ConfigReader, str, str], dict[str, Any]]] = {"mllama": _mllama}
# model_type -> ArchTraits values that differ from Llama's (MllamaForConditionalGeneration's head keeps the
# activation dtype, no .float(); the cross-attention layers are a layer type): the GGUF architecture name of
# Ollama's llama3.2-vision files (general.architecture "mllama", Ollama's llama.cpp LLM_ARCH_MLLAMA)
TRAITS: dict[str, dict[str, Any]] = {"mllama": {"gguf_arch": "mllama"}}
CONFIG_TRAITS: dict[str, Callable[[Mapping[str, Any], str], dict[str, Any]]] = {}
