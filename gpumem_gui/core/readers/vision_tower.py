"""The vision tower's forward shape (:class:`~gpumem_gui.core.spec.vision.VisionTower`) from a Qwen-VL
``vision_config`` (Qwen2_5_VLVisionConfig / Qwen3VLVisionConfig, transformers 5.24), for the replay of its
activations (:mod:`gpumem_gui.core.replay.vision`)."""

from __future__ import annotations

import math
from typing import Any, Literal

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.readers.config_fields import ConfigReader
from gpumem_gui.core.spec.vision import VisionTower


def _indexes(v: ConfigReader, key: str) -> tuple[int, ...]:
    """Block indices (an index past the last block never matches, as in the modeling code)."""
    raw = v.get(key, default=[])
    if not isinstance(raw, list | tuple) or not all(isinstance(i, int) and i >= 0 for i in raw):
        raise GpumemInputError("must be a list of vision block indices", source=v.source, field=key)
    return tuple(raw)


def _heads(v: ConfigReader, key: str, owner: str) -> tuple[int, int]:
    """(hidden_size, heads): the heads named ``key`` must split hidden_size evenly (``owner``'s head_dim)."""
    h, heads = v.int("hidden_size"), v.int(key)
    if h % heads:
        raise GpumemInputError(
            f"hidden_size ({h}) must be divisible by {key} ({heads}) ({owner})", source=v.source, field=key
        )
    return h, heads


def qwen_tower(v: ConfigReader, kind: Literal["qwen2_5_vl", "qwen3_vl"], max_pixels: int) -> VisionTower:
    """The tower of ``v`` (its class defaults merged in); ``max_pixels``: the processor's largest image."""
    depth = v.int("depth")
    h, heads = _heads(v, "num_heads", "the vision attention's head_dim")
    windowed = kind == "qwen2_5_vl"
    return VisionTower(
        kind=kind,
        hidden_size=h,
        depth=depth,
        num_heads=heads,
        intermediate_size=v.int("intermediate_size"),
        patch_size=v.int("patch_size"),
        temporal_patch_size=v.int("temporal_patch_size"),
        in_channels=v.int("in_channels"),
        spatial_merge_size=v.int("spatial_merge_size"),
        out_hidden_size=v.int("out_hidden_size"),
        window_size=v.int("window_size") if windowed else 0,
        fullatt_block_indexes=_indexes(v, "fullatt_block_indexes") if windowed else (),
        deepstack_visual_indexes=() if windowed else _indexes(v, "deepstack_visual_indexes"),
        max_side=math.isqrt(max_pixels),
    )


def _tower(
    v: ConfigReader, kind: Literal["pixtral", "siglip", "llama4"], text_hidden: int, **fields: Any
) -> VisionTower:
    """The tower of a vision config spelled as transformers' PixtralVisionConfig, SiglipVisionConfig and
    Llama4VisionConfig all spell it (``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``,
    ``intermediate_size``, ``patch_size``, ``num_channels``; one frame a patch) under a projector ending in
    the text model's width (``text_hidden``), with the kind's own ``fields``."""
    return VisionTower(
        kind=kind,
        hidden_size=v.int("hidden_size"),
        depth=v.int("num_hidden_layers"),
        config_layers=v.int("num_hidden_layers"),
        num_heads=v.int("num_attention_heads"),
        intermediate_size=v.int("intermediate_size"),
        patch_size=v.int("patch_size"),
        temporal_patch_size=1,
        in_channels=v.int("num_channels"),
        out_hidden_size=text_hidden,
        **fields,
    )


def pixtral_tower(v: ConfigReader, merge: int, text_hidden: int) -> VisionTower:
    """PixtralVisionConfig (defaults merged in) and Mistral3Config's ``spatial_merge_size``; the projector
    ends in the text model's width; the processor passes images up to ``image_size`` a side."""
    h, heads = v.int("hidden_size"), v.int("num_attention_heads")
    hd = v.int("head_dim", default=h // heads)
    if hd * heads != h:
        raise GpumemInputError(
            f"head_dim x num_attention_heads ({hd} x {heads}) must be hidden_size ({h}) (PixtralAttention)",
            source=v.source,
            field="head_dim",
        )
    return _tower(v, "pixtral", text_hidden, spatial_merge_size=merge, max_side=v.int("image_size"))


def siglip_tower(v: ConfigReader, tokens_per_image: int, text_hidden: int) -> VisionTower | None:
    """SiglipVisionConfig (defaults merged in) under Gemma3MultiModalProjector (``models/gemma3/
    modeling_gemma3.py``): ``image_size / patch_size`` patches a side average-pooled by a kernel of
    ``patches / isqrt(mm_tokens_per_image)`` into ``mm_tokens_per_image`` features of the text model's width.
    None (not replayed) where the pooled grid does not give ``mm_tokens_per_image`` features (transformers
    refuses such images) or where the tower runs its attention-pooling head (``vision_use_head``)."""
    _heads(v, "num_attention_heads", "SiglipAttention")
    side, patch = v.int("image_size"), v.int("patch_size")
    grid = side // patch
    kernel = grid // max(math.isqrt(tokens_per_image), 1)
    if v.bool("vision_use_head") or not kernel or (grid // kernel) ** 2 != tokens_per_image:
        return None
    return _tower(
        v,
        "siglip",
        text_hidden,
        spatial_merge_size=kernel,
        max_side=side,
        fixed_side=side,
        # Gemma3Processor.full_image_sequence: "\n\n<start_of_image>" + image tokens + "<end_of_image>\n\n"
        extra_tokens=4,
        block_mask=True,  # Gemma3Model.forward: token_type_ids -> create_masks_for_vision_model
    )


# Llama4ImageProcessor.max_patches: at most 16 tiles an image (the class default; Meta's
# preprocessor_config.json for Llama-4-Scout / Maverick says the same)
_LLAMA4_MAX_TILES = 16
# the largest image side the run fields accept (runtimes/run.py image_size): larger ones are downscaled
_LLAMA4_MAX_SIDE = 16384


def llama4_tower(v: ConfigReader, text_hidden: int) -> VisionTower | None:
    """Llama4VisionConfig (defaults merged in): tiles of ``image_size`` pixels, ``patch_size`` patches a tile
    side, the pixel shuffle by ``pixel_shuffle_ratio`` (a 2 x 2 merge at 0.5) and Llama4VisionMLP2 of
    ``projector_input_dim``. None (not replayed) where transformers could not run it on images: the shuffled
    width must be ``intermediate_size`` (the adapter's fc1 input) and ``projector_input_dim`` must equal
    ``projector_output_dim`` (fc2 runs on fc1's output) and ``vision_output_dim`` (the projector's input), the
    shuffle must merge whole patches."""
    h, heads = v.int("hidden_size"), v.int("num_attention_heads")
    tile, patch = v.int("image_size"), v.int("patch_size")
    ratio = float(v.get("pixel_shuffle_ratio"))  # validated by the parameter count (hf_new_llama4.py)
    merge = round(1 / ratio)
    g = tile // patch
    inner, adapter = v.int("projector_input_dim"), v.int("projector_output_dim")
    if (
        h % heads
        or abs(merge * ratio - 1) > 1e-9
        or g % merge
        or h * merge * merge != v.int("intermediate_size")
        or inner != adapter
        or v.int("vision_output_dim") != adapter  # Llama4MultiModalProjector.linear_1's input
    ):
        return None
    return _tower(
        v,
        "llama4",
        text_hidden,
        spatial_merge_size=merge,
        max_side=_LLAMA4_MAX_SIDE,
        tile_side=tile,
        max_tiles=_LLAMA4_MAX_TILES,
        adapter_size=adapter,
        extra_tokens=3,  # <|image_start|>, <|image|>, <|image_end|> (Llama4Processor._prompt_split_image)
    )
