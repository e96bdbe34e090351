"""A vision tower's forward shape (:class:`VisionTower`) and what ``images`` square images of ``image_size``
pixels become: patches for the tower, placeholder tokens in the text sequence (:func:`image_grid`).

An image is taken as the model sees it after its processor's resize: a side of ``image_size`` pixels rounded
down to whole merged patches (``patch_size * spatial_merge_size``), ``g = side / patch_size`` patches a side;
a fixed-size tower (Gemma 3's SigLIP: every image resized to 896 px) ignores ``image_size``, its
``spatial_merge_size`` is the projector's average-pooling kernel.
Per image (``Qwen2VLProcessor``): ``g^2`` patches, ``(g / merge)^2`` image tokens between ``<|vision_start|>``
and ``<|vision_end|>``. The trace worker builds the same inputs (``gpumem_trace_worker/vision.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.spec.base import Frozen, NonNegInt, PositiveInt


class VisionTower(Frozen):
    """The vision encoder's forward, as far as its activations depend on it."""

    kind: Literal["qwen2_5_vl", "qwen3_vl", "pixtral", "siglip", "llama4"] = Field(
        description="Qwen2_5_VisionTransformerPretrainedModel (RMSNorm, gated MLP, windowed blocks), "
        "Qwen3VLVisionModel (LayerNorm, GELU MLP, learned position table, deepstack mergers), "
        "PixtralVisionModel + Mistral3MultiModalProjector (every image in one sequence, a block mask) or "
        "SiglipVisionModel + Gemma3MultiModalProjector (a fixed image side, average-pooled features) or "
        "Llama4VisionModel (tiles with a class token, complex rotary, pixel shuffle and an MLP adapter)"
    )
    hidden_size: PositiveInt
    depth: PositiveInt
    num_heads: PositiveInt
    intermediate_size: PositiveInt
    patch_size: PositiveInt
    temporal_patch_size: PositiveInt
    in_channels: PositiveInt
    spatial_merge_size: PositiveInt
    out_hidden_size: PositiveInt
    window_size: NonNegInt = Field(0, description="window side in pixels (Qwen2.5-VL); 0: every block full")
    fullatt_block_indexes: tuple[int, ...] = Field((), description="blocks with full attention (Qwen2.5-VL)")
    deepstack_visual_indexes: tuple[int, ...] = Field((), description="blocks feeding a deepstack merger")
    max_side: PositiveInt = Field(description="largest image side in pixels the processor passes")
    fixed_side: NonNegInt = Field(
        0,
        description="the side every image is resized to whatever its size (Gemma3ImageProcessor: the SigLIP "
        "tower's image_size); 0: the run's image_size",
    )
    tile_side: NonNegInt = Field(
        0,
        description="the side of one tile (Llama4ImageProcessor: vision_config.image_size, 336 px); an image "
        "is resized onto a canvas of up to max_tiles tiles, plus a global tile when there are several; 0: "
        "no tiling",
    )
    max_tiles: NonNegInt = Field(
        0, description="tiles of the largest canvas (Llama4ImageProcessor.max_patches)"
    )
    adapter_size: NonNegInt = Field(
        0, description="Llama4VisionPixelShuffleMLP's width (projector_input_dim = projector_output_dim)"
    )
    block_mask: bool = Field(
        False,
        description="the processor's token_type_ids make each image's tokens attend to each other: the text "
        "model's causal and sliding masks are OR-ed with a block mask, so SDPA gets every mask materialised "
        "(Gemma3Model.forward: create_masks_for_vision_model, allow_is_causal_skip off)",
    )
    config_layers: NonNegInt = Field(
        0,
        description="the vision config's num_hidden_layers (SiglipVisionConfig, PixtralVisionConfig, "
        "Llama4VisionConfig); 0: the config names its depth otherwise (the Qwen towers' depth)",
    )
    extra_tokens: NonNegInt = Field(
        2,
        description="text tokens around each image's features besides Pixtral's row breaks: Qwen's "
        "<|vision_start|> / <|vision_end|>, Gemma 3's '\\n\\n<start_of_image>' ... '<end_of_image>\\n\\n'",
    )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def unit(self) -> int:
        """Pixels of one merged patch's side."""
        return self.patch_size * self.spatial_merge_size


@dataclass(frozen=True)
class ImageGrid:
    """One image as the tower and the text model see it."""

    side: int  # pixels after rounding down to whole merged patches
    grid: int  # patches a side
    patches: int  # patches of the image (rows of the tower's sequence)
    features: int  # merged patches: rows of the projector's output
    tokens: int  # placeholder tokens it adds to the text sequence
    tiles: int = 1  # sequences the tower runs (Llama 4's tiles; ``side`` and ``grid`` are then a tile's)


def image_grid(tower: VisionTower, image_size: int) -> ImageGrid:
    """The grid of one square image of ``image_size`` pixels (one-line error when out of range)."""
    if tower.tile_side:
        return _tiled_grid(tower, image_size)
    if tower.fixed_side:  # the processor resizes every image to this side: image_size has no effect
        image_size = tower.fixed_side
    if image_size < tower.unit or image_size > tower.max_side:
        raise GpumemInputError(
            f"must be between {tower.unit} (one merged patch) and {tower.max_side} pixels for this model, "
            f"got {image_size}",
            field="image_size",
        )
    side = image_size // tower.unit * tower.unit
    g = side // tower.patch_size
    features = (g // tower.spatial_merge_size) ** 2
    # Pixtral: an [IMG_BREAK] ending each row ([IMG_END] the last); the others: a fixed count
    extra = g // tower.spatial_merge_size if tower.kind == "pixtral" else tower.extra_tokens
    return ImageGrid(side=side, grid=g, patches=g * g, features=features, tokens=features + extra)


def canvas_tiles(tile: int, size: int, max_tiles: int) -> tuple[int, int]:
    """(rows, columns) of tiles of the canvas for a square image of ``size`` pixels (Llama4ImageProcessor,
    transformers 5.24: ``find_supported_resolutions`` lists every h x w with h * w <= max_patches;
    ``get_best_fit`` takes the smallest upscale, else the least downscale, then the smallest area)."""
    canvases = [(h, n // h) for n in range(1, max_tiles + 1) for h in range(1, n + 1) if n % h == 0]
    scale = {c: min(c) * tile / size for c in canvases}
    up = [v for v in scale.values() if v >= 1]
    best = min(up) if up else max(scale.values())
    return min((c for c in canvases if scale[c] == best), key=lambda c: c[0] * c[1])


def _tiled_grid(tower: VisionTower, image_size: int) -> ImageGrid:
    """Llama 4: the canvas's tiles and a global one when there are several, each ``g^2`` patches and a class
    token through the tower, ``(g / merge)^2`` features after the pixel shuffle; the tokens of
    Llama4Processor._prompt_split_image (<|image_start|>, a separator after each tile, <|image|>,
    <|image_end|>)."""
    if image_size < 1 or image_size > tower.max_side:
        raise GpumemInputError(
            f"must be between 1 and {tower.max_side} pixels, got {image_size}", field="image_size"
        )
    h, w = canvas_tiles(tower.tile_side, image_size, tower.max_tiles)
    tiles = h * w + (1 if h * w > 1 else 0)
    g = tower.tile_side // tower.patch_size
    features = tiles * (g // tower.spatial_merge_size) ** 2
    seps = h * w if h * w > 1 else 0
    return ImageGrid(
        side=tower.tile_side,
        grid=g,
        patches=tiles * (g * g + 1),
        features=features,
        tokens=features + seps + tower.extra_tokens,
        tiles=tiles,
    )


def window_chunks(tower: VisionTower, grid: int) -> tuple[int, int]:
    """(patches of the last window, windows) of one image in a windowed block
    (``transformers.vision_utils.get_vision_window_index``: windows of ``window_size / merge / patch`` merged
    patches a side, the grid padded to whole windows, empty windows dropped)."""
    m = tower.spatial_merge_size
    w = tower.window_size // m // tower.patch_size
    llm = grid // m
    rem = llm % w or w
    n = -(-llm // w)
    return rem * rem * m * m, n * n
