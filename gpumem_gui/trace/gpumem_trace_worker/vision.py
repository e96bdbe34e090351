"""Images in an inference prefill: the processor's outputs for ``images`` square images per sequence of
``image_size`` pixels, and the grid arithmetic fake tensors cannot do.

The run's ``images`` and ``image_size`` (a side in pixels as the model sees it: rounded down to whole merged
patches, ``patch_size * spatial_merge_size``) give, per sequence, the placeholder tokens the processor writes
and the tensors it returns:

* Qwen2.5-VL / Qwen3-VL (``Qwen2VLImageProcessor``): ``pixel_values`` as flattened patches
  ``[images * g * g, channels * temporal_patch_size * patch * patch]`` (fp32), ``image_grid_thw``
  ``[[1, g, g], ...]`` with ``g = side / patch``; ``<|vision_start|>``, ``(g / merge)^2`` image tokens,
  ``<|vision_end|>`` per image; ``mm_token_type_ids`` (1 on image tokens) as the processor returns them, and
  the ``[4, batch, tokens]`` position ids ``generate()`` computes before the forward.
* Mistral 3 / Pixtral (``PixtralImageProcessor``, ``PixtralProcessor``): ``pixel_values``
  ``[images, channels, side, side]`` (fp32), ``image_sizes``; ``rows x cols`` image tokens (one per merged
  patch), each row followed by ``[IMG_BREAK]`` (the last by ``[IMG_END]``).

Fake tensors have no values, and the vision towers read the grid's values (window indices, cumulative
sequence lengths, position ids, ``torch.split`` sizes). The grid, the token ids and what is computed from
them alone are made *constant* fake tensors (torch's own constant propagation, ``CONSTANT_NUMEL_LIMIT``
raised while the prefill runs), and ``transformers.vision_utils.get_vision_*`` (which build index tensors
with ``arange`` from the grid) run on the constants' real values and return constant fake tensors. Nothing
allocated changes: the same tensors of the same shapes exist, and they are counted as before.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import sys
from collections.abc import Iterator
from typing import Any

from .building import TraceError, is_multimodal, no_init_weights, same_device_to, text_config, whole_model

# PixtralProcessor's break / end tokens: any id but the image token (only the count matters)
_TEXT_ID = 1


def _unit(cfg: Any) -> tuple[str, int, int] | None:
    """(kind, patch size, spatial merge) of the model's vision tower; None for a vision model whose images
    are not fed here (the run's ``images`` may mean something else to it, e.g. Llama 3.2 Vision's
    cross-attention cache)."""
    vc = getattr(cfg, "vision_config", None)
    if vc is None:
        return None
    if (
        getattr(vc, "temporal_patch_size", None) is not None
        and getattr(cfg, "image_token_id", None) is not None
    ):
        return "qwen", int(vc.patch_size), int(vc.spatial_merge_size)
    if getattr(cfg, "image_token_index", None) is not None and getattr(cfg, "spatial_merge_size", None):
        return "pixtral", int(vc.patch_size), int(cfg.spatial_merge_size)
    if getattr(vc, "pixel_shuffle_ratio", None) and getattr(cfg, "image_token_index", None) is not None:
        return "tiles", int(vc.patch_size), 1  # Llama 4: tiles of vision_config.image_size
    if getattr(cfg, "mm_tokens_per_image", None) and getattr(cfg, "boi_token_index", None) is not None:
        return "siglip", int(vc.patch_size), 1  # Gemma 3: a fixed image_size, pooled by the projector
    return None  # another kind of vision model: its images are not fed here


def image_request(cfg: Any, run: dict[str, Any]) -> tuple[int, int] | None:
    """(images per sequence, side in pixels after rounding) of the run, None without images."""
    images = int(run.get("images", 0) or 0)
    if images < 0:
        raise TraceError(f"images must be 0 or more, got {images}", field="images")
    unit = _unit(cfg) if images else None
    if unit is None:
        return None
    kind, patch, merge = unit
    if kind == "siglip":  # Gemma3ImageProcessor resizes every image to vision_config.image_size
        return images, int(cfg.vision_config.image_size)
    size = int(run.get("image_size", 0) or 0)
    if kind == "tiles":  # Llama4ImageProcessor: the side of its canvas of tiles (llama4_tiles)
        if size <= 0:
            raise TraceError(f"image_size must be at least 1 pixel, got {size}", field="image_size")
        return images, size
    side = size // (patch * merge) * patch * merge
    if side <= 0:
        raise TraceError(
            f"image_size must be at least {patch * merge} pixels (one merged patch), got {size}",
            field="image_size",
        )
    return images, side


def _qwen(cfg: Any, batch: int, seq: int, images: int, side: int) -> tuple[list[int], dict[str, Any]]:
    import torch

    vc = cfg.vision_config
    g = side // int(vc.patch_size)
    per = g * g // int(vc.spatial_merge_size) ** 2
    block = [cfg.vision_start_token_id] + [cfg.image_token_id] * per + [cfg.vision_end_token_id]
    row = block * images + [_TEXT_ID] * seq
    width = int(getattr(vc, "in_channels", 3)) * int(vc.temporal_patch_size) * int(vc.patch_size) ** 2
    kw: dict[str, Any] = {
        "pixel_values": torch.randn(batch * images * g * g, width),
        "image_grid_thw": torch.tensor([[1, g, g]] * (batch * images)),
    }
    return row, kw


def _pixtral(cfg: Any, batch: int, seq: int, images: int, side: int) -> tuple[list[int], dict[str, Any]]:
    import torch

    vc = cfg.vision_config
    cols = side // (int(vc.patch_size) * int(cfg.spatial_merge_size))
    block = ([cfg.image_token_index] * cols + [_TEXT_ID]) * cols
    row = block * images + [_TEXT_ID] * seq
    kw = {
        "pixel_values": torch.randn(batch * images, int(getattr(vc, "num_channels", 3)), side, side),
        "image_sizes": torch.tensor([[side, side]] * (batch * images)),
    }
    return row, kw


def _siglip(cfg: Any, batch: int, seq: int, images: int, side: int) -> tuple[list[int], dict[str, Any]]:
    """Gemma3Processor: ``full_image_sequence`` (newlines, <boi>, mm_tokens_per_image image tokens, <eoi>,
    newlines: the two "\\n\\n" as one text token each) per image, ``token_type_ids`` 1 on the image tokens."""
    import torch

    vc = cfg.vision_config
    block = [_TEXT_ID, cfg.boi_token_index] + [cfg.image_token_index] * int(cfg.mm_tokens_per_image)
    block += [cfg.eoi_token_index, _TEXT_ID]
    row = block * images + [_TEXT_ID] * seq
    kw = {
        "pixel_values": torch.randn(batch * images, int(getattr(vc, "num_channels", 3)), side, side),
        "token_type_ids": torch.tensor([[int(t == cfg.image_token_index) for t in row]] * batch),
    }
    return row, kw


# Llama4ImageProcessor.max_patches: at most 16 tiles an image (the class default, and Meta's
# preprocessor_config.json for Llama-4-Scout / Maverick)
_LLAMA4_MAX_TILES = 16


def llama4_tiles(tile: int, size: int) -> tuple[int, int]:
    """(rows, columns) of tiles of the canvas Llama4ImageProcessor picks for a square image of ``size``
    pixels, as its ``find_supported_resolutions`` (every h x w with h * w <= max_patches) and ``get_best_fit``
    (the smallest upscale, else the least downscale; the smallest area among equals) do (transformers 5.24,
    image_processing_llama4.py, which needs torchvision to import)."""
    canvases = [
        (h, w)
        for n in range(1, _LLAMA4_MAX_TILES + 1)
        for h in range(1, n + 1)
        if n % h == 0
        for w in [n // h]
    ]
    scale = {c: min(c[0] * tile / size, c[1] * tile / size) for c in canvases}
    up = [v for v in scale.values() if v >= 1]
    best = min(up) if up else max(scale.values())
    return min((c for c in canvases if scale[c] == best), key=lambda c: c[0] * c[1])


def _tiles(cfg: Any, batch: int, seq: int, images: int, side: int) -> tuple[list[int], dict[str, Any]]:
    """Llama4Processor._prompt_split_image: <|image_start|>, per tile of an h x w canvas (h * w > 1) its
    patch tokens and an x / y separator, <|image|> and the global tile's patch tokens, <|image_end|>;
    ``pixel_values`` in bfloat16 (Llama4ImageProcessor.rescale_and_normalize), one row per tile."""
    import torch

    vc = cfg.vision_config
    tile = int(vc.image_size)
    h, w = llama4_tiles(tile, side)
    per = int((tile // int(vc.patch_size)) ** 2 * float(vc.pixel_shuffle_ratio) ** 2)
    patch = [cfg.image_token_index] * per
    block = [cfg.boi_token_index]
    if h * w > 1:
        for _y in range(h):
            for x in range(w):
                block += patch + ([_TEXT_ID] if x < w - 1 else [])
            block += [_TEXT_ID]
    block += [_TEXT_ID, *patch, cfg.eoi_token_index]
    row = block * images + [_TEXT_ID] * seq
    tiles = h * w + (1 if h * w > 1 else 0)
    ch = int(getattr(vc, "num_channels", 3))
    kw = {"pixel_values": torch.randn(batch * images * tiles, ch, tile, tile, dtype=torch.bfloat16)}
    return row, kw


_BUILDERS = {"qwen": _qwen, "pixtral": _pixtral, "siglip": _siglip, "tiles": _tiles}


def image_inputs(
    model: Any, cfg: Any, batch: int, seq: int, req: tuple[int, int]
) -> tuple[Any, dict[str, Any]]:
    """(input_ids, the processor's other outputs) for ``seq`` text tokens after the images of ``req`` in each
    of ``batch`` sequences; call inside :func:`constant_grids`."""
    import torch

    images, side = req
    kind = _unit(cfg)[0]  # type: ignore[index]
    row, kw = _BUILDERS[kind](cfg, batch, seq, images, side)
    if max(row) >= int(text_config(cfg).vocab_size):
        raise TraceError("the config's image token ids are outside its vocabulary", field="images")
    ids = torch.tensor([row] * batch)
    if kind == "qwen":
        if "mm_token_type_ids" in inspect.signature(model.forward).parameters:
            kw["mm_token_type_ids"] = torch.tensor([[int(t == cfg.image_token_id) for t in row]] * batch)
        # generate() computes the [4, batch, tokens] text + 3-D rotary positions before the forward
        # (Qwen2_5_VLForConditionalGeneration._prepare_position_ids_for_generation: get_rope_index's values)
        kw["position_ids"] = torch.zeros(4, batch, len(row), dtype=torch.long)
    return ids, kw


def _on_constants(fn: Any) -> Any:
    """``fn`` run on the real values of its constant fake-tensor arguments; its tensors come back as constant
    fake tensors of the same mode (``fn`` builds index tensors from the grid alone)."""
    import torch
    from torch._subclasses import fake_tensor as ft
    from torch.utils import _pytree as pytree

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        fakes = [x for x in pytree.tree_leaves((args, kwargs)) if isinstance(x, ft.FakeTensor)]
        if not fakes or any(x.constant is None for x in fakes):
            return fn(*args, **kwargs)
        mode = fakes[0].fake_mode
        real_args, real_kwargs = pytree.tree_map_only(ft.FakeTensor, lambda x: x.constant, (args, kwargs))
        with ft.unset_fake_temporarily():
            out = pytree.tree_map_only(torch.Tensor, lambda x: x.clone(), fn(*real_args, **real_kwargs))
        conv = mode.fake_tensor_converter
        return pytree.tree_map_only(
            torch.Tensor, lambda x: conv.from_real_tensor(mode, x, make_constant=True), out
        )

    run._gpumem = True  # type: ignore[attr-defined]
    return run


@contextlib.contextmanager
def constant_grids() -> Iterator[None]:
    """Constant propagation for the grid and token ids (tensors up to 2^22 elements), and
    ``transformers.vision_utils.get_vision_*`` (wherever a modeling module imported them) on constants."""
    from torch._subclasses import fake_tensor as ft

    try:
        import transformers.vision_utils as vu
    except ImportError:  # a transformers before vision_utils: the towers compute the grid inline
        vu = None
    names = [n for n in dir(vu) if n.startswith("get_vision_")] if vu is not None else []
    orig = {n: getattr(vu, n) for n in names}
    swapped: list[tuple[Any, str, Any]] = []
    for mod in [m for k, m in list(sys.modules.items()) if k.startswith("transformers") and m is not None]:
        for n in names:
            if getattr(mod, n, None) is orig[n]:
                swapped.append((mod, n, orig[n]))
                setattr(mod, n, _on_constants(orig[n]))
    limit = ft.CONSTANT_NUMEL_LIMIT
    ft.CONSTANT_NUMEL_LIMIT = 1 << 22
    # transformers 5.24's Llama4ForConditionalGeneration.forward ends by reading ``outputs.image_outputs`` of
    # its language model's MoeCausalLMOutputWithPast, which has no such field (an AttributeError after the
    # whole forward has run): the field reads as None while the trace runs
    from transformers.modeling_outputs import MoeCausalLMOutputWithPast as moe_out

    had = "image_outputs" in vars(moe_out)
    if not had:
        moe_out.image_outputs = None  # type: ignore[attr-defined]
    try:
        yield
    finally:
        if not had:
            del moe_out.image_outputs
        ft.CONSTANT_NUMEL_LIMIT = limit
        for mod, n, f in swapped:
            setattr(mod, n, f)


def outside_text(name: str) -> bool:
    return not any(part in ("language_model", "lm_head") for part in name.split("."))


def vision_params(cfg: Any, dtype: Any, world: int = 1) -> tuple[int, int, int]:
    """(parameters, their bytes on rank 0, buffer bytes) of what a multimodal model holds besides its
    language model (the vision tower and the projector): the whole model built with weight init off (init
    reads values, e.g. SigLIP's truncated normal), its parameters and buffers outside ``language_model`` and
    ``lm_head`` counted (the buffers by storage: SigLIP's ``position_ids`` is an expanded ``arange``);
    ``world`` > 1: FSDP2's dim-0 shard of each parameter (``ceil(rows / world)`` rows, padded; buffers are
    not sharded)."""
    from transformers import AutoModel

    if getattr(cfg, "vision_config", None) is None:
        return 0, 0, 0
    with same_device_to(), no_init_weights():
        whole = AutoModel.from_config(copy.deepcopy(cfg), dtype=dtype)
    extra = [p for name, p in whole.named_parameters() if outside_text(name)]
    nbytes = 0
    for p in extra:
        rows = p.shape[0] if p.dim() else 1
        held = -(-rows // world) * (p.numel() // rows) if world > 1 and rows else p.numel()
        nbytes += held * p.element_size()
    buffers = sum(b.untyped_storage().nbytes() for name, b in whole.named_buffers() if outside_text(name))
    return sum(p.numel() for p in extra), nbytes, buffers


def add_vision(out: dict[str, Any], cfg: Any, dtype: Any, world: int = 1) -> None:
    """A multimodal model's vision tower and projector, which the text-only trace did not build, added to
    every phase: its parameters (a text step gives them no gradient, so no optimizer state either) and its
    buffers (the rotary tables, SigLIP's position ids)."""
    if not is_multimodal(cfg):
        return
    n, nbytes, buffers = vision_params(cfg, dtype, world)
    out["vision_params"] = n
    if whole_model(cfg):
        return  # built with the model (build): its bytes are in every phase already
    for ph in out["phases"].values():
        ph["Parameter"] = ph.get("Parameter", 0) + nbytes
        ph["Buffer"] = ph.get("Buffer", 0) + buffers
        ph["Total"] = ph.get("Total", 0) + nbytes + buffers
