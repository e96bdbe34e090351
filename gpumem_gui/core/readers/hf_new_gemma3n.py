"""The towers of the multimodal Gemma 3n checkpoint (``gemma3n``, Gemma3nForConditionalGeneration,
transformers 5.24 ``models/gemma3n/modeling_gemma3n.py``): the text model is ``gemma3n_text``
(readers/hf_new_gemma.py); this module counts what the wrapper adds.

* The vision tower is a timm model the config only names (``vision_config.architecture``, loaded by
  TimmWrapperModel): its weights are not described by the config, so they come from a table of the
  architectures Gemma 3n checkpoints name, each counted by building the timm model
  (``validation/gemma3n_towers.py``, timm 1.0.31).
* The audio tower (Gemma3nAudioEncoder) is described by ``audio_config``: a sub-sampling convolution
  projection (two Conv2d + norm blocks, then a linear over channels x reduced frequencies) and
  ``conf_num_hidden_layers`` conformer blocks (two macaron feed-forwards of 4 x hidden, relative-position
  attention with a per-dimension query scale, a light depthwise convolution, a final norm).
* ``embed_vision`` / ``embed_audio`` (Gemma3nMultimodalEmbedder): a hard-token table of ``vocab_size`` rows
  of the tower's width, a hard and a soft embedding norm, and a projection to the text width (the
  post-projection norm has no weight).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.readers.config_fields import ConfigReader
from gpumem_gui.core.spec.model import VisionSpec

# timm architecture -> parameters of TimmWrapperModel's model (timm.create_model(name, num_classes=0)):
# counted by validation/gemma3n_towers.py with timm 1.0.31 (timm/models/mobilenetv5.py _gen_mobilenet_v5)
TIMM_TOWER_PARAMS: dict[str, int] = {"mobilenetv5_300m_enc": 294_126_912}

# Gemma3nVisionConfig / Gemma3nAudioConfig defaults (configuration_gemma3n.py): the released geometry
_VISION = {"architecture": "mobilenetv5_300m_enc", "hidden_size": 2048, "vocab_size": 128}
_AUDIO = {
    "hidden_size": 1536,
    "input_feat_size": 128,
    "vocab_size": 128,
    "conf_num_hidden_layers": 12,
    "conf_num_attention_heads": 8,
    "conf_conv_kernel_size": 5,
    "sscp_conv_channel_size": [128, 32],
    "sscp_conv_kernel_size": [[3, 3], [3, 3]],
    "sscp_conv_stride_size": [[2, 2], [2, 2]],
}


def _sub(r: ConfigReader, key: str, defaults: Mapping[str, Any]) -> ConfigReader:
    sub = r.get(key, default=None)
    if sub is None:
        return ConfigReader(dict(defaults), f"{r.source} ({key}, class defaults)")
    if not isinstance(sub, Mapping):
        raise GpumemInputError("must be an object", source=r.source, field=key)
    return ConfigReader({**defaults, **sub}, f"{r.source} ({key})")


def _pairs(a: ConfigReader, key: str) -> list[tuple[int, int]]:
    v = a.get(key)
    ok = isinstance(v, list) and len(v) == 2
    ok = ok and all(isinstance(p, list) and len(p) == 2 for p in v)
    ok = ok and all(isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= 64 for p in v for x in p)
    if not ok:
        raise GpumemInputError(
            "must be two [height, width] pairs of integers 1..64", source=a.source, field=key
        )
    return [(p[0], p[1]) for p in v]


def _channels(a: ConfigReader) -> tuple[int, int]:
    v = a.get("sscp_conv_channel_size")
    if not (
        isinstance(v, list)
        and len(v) == 2
        and all(isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= 65536 for x in v)
    ):
        raise GpumemInputError(
            "must be two channel counts (integers 1..65536)", source=a.source, field="sscp_conv_channel_size"
        )
    return v[0], v[1]


def audio_tower_params(a: ConfigReader) -> int:
    """Gemma3nAudioEncoder: Gemma3nAudioSubSampleConvProjection (each Gemma3nAudioSSCPConvBlock a Conv2d
    without bias and a channel norm; the frequency axis padded by 1 on each side), then the conformer
    blocks (Gemma3nAudioConformerBlock)."""
    h, feat = a.int("hidden_size"), a.int("input_feat_size")
    c0, c1 = _channels(a)
    kernels, strides = _pairs(a, "sscp_conv_kernel_size"), _pairs(a, "sscp_conv_stride_size")
    f = feat
    for (_, kw), (_, sw) in zip(kernels, strides, strict=True):
        f = (f + 2 - kw) // sw + 1
        if f < 1:
            raise GpumemInputError(
                "leaves no frequency bins after the sub-sampling convolutions",
                source=a.source,
                field="input_feat_size",
            )
    (k0h, k0w), (k1h, k1w) = kernels
    sscp = c0 * k0h * k0w + c0 + c1 * c0 * k1h * k1w + c1 + h * c1 * f
    heads = a.int("conf_num_attention_heads")
    if h % heads:
        raise GpumemInputError(
            f"must divide hidden_size ({h})", source=a.source, field="conf_num_attention_heads"
        )
    kernel = a.int("conf_conv_kernel_size")
    ffw = 2 * (2 * h * 4 * h + 2 * h)  # ffw_layer_start and _end: pre/post norms, h -> 4h -> h
    attention = (
        5 * h * h + 2 * h + h // heads
    )  # pos_proj, q, k, v, post; pre_attn_norm, post_norm; per_dim_scale
    lconv = 2 * h * h + h * h + h * kernel + 2 * h  # linear_start (2h), linear_end, depthwise, two norms
    per_layer = ffw + attention + lconv + h  # the block's final norm
    return sscp + a.int("conf_num_hidden_layers") * per_layer


def _embedder(tower_width: int, vocab: int, text_width: int) -> int:
    """Gemma3nMultimodalEmbedder: embedding, hard_embedding_norm, soft_embedding_norm,
    embedding_projection (no bias); embedding_post_projection_norm has no weight."""
    return vocab * tower_width + 2 * tower_width + text_width * tower_width


def towers(r: ConfigReader, text_width: int) -> VisionSpec:
    """The vision and audio towers of a Gemma3nConfig file, with their embedders."""
    v, a = _sub(r, "vision_config", _VISION), _sub(r, "audio_config", _AUDIO)
    arch = v.get("architecture")
    if arch not in TIMM_TOWER_PARAMS:
        raise GpumemInputError(
            f"names a timm vision tower gpumem does not know ({arch!r}); known: "
            + ", ".join(TIMM_TOWER_PARAMS),
            source=v.source,
            field="architecture",
        )
    vision = TIMM_TOWER_PARAMS[arch]
    audio = audio_tower_params(a)
    embedders = _embedder(v.int("hidden_size"), v.int("vocab_size"), text_width) + _embedder(
        a.int("hidden_size"), a.int("vocab_size"), text_width
    )
    tables = v.int("vocab_size") * v.int("hidden_size") + a.int("vocab_size") * a.int("hidden_size")
    image_tokens = r.int("vision_soft_tokens_per_image", default=256)
    return VisionSpec(
        kind="gemma3n_vision_audio",
        tower_params=vision + audio,
        projector_params=embedders,
        embedding_table_params=tables,
        image_tokens=image_tokens,
    )
