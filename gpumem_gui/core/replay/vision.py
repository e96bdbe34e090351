"""A prefill with images: the vision tower's forward, and what it leaves alive for the text forward.

``Qwen2_5_VLModel.forward`` / ``Qwen3VLModel.forward`` / ``Mistral3Model.forward`` (transformers 5.24) embed
the prompt, run the tower on the processor's ``pixel_values`` (``get_image_features``; Mistral 3's Pixtral
tower and projector: :mod:`.vision_pixtral`), ``torch.cat`` its merged output into
``image_embeds``, build the placeholder masks and ``masked_scatter`` the features into a new
``inputs_embeds``, then run the language model while the tower's outputs (``mm_encoder_outputs``: the last
hidden state and the merged features, Qwen3-VL's deepstack features) and ``image_embeds`` stay alive.

:func:`tower_peak` replays that stretch op by op on a :class:`~.autograd.Sim` of its own (the tower's sizes
are numbers, not tape polynomials: the attention runs one SDPA call per window or image, a count that is not
a polynomial in the batch); :func:`hold` allocates, inside the text forward's tape, what stays alive through
the language model. The prefill's peak is the larger of the two (:mod:`.forward`).

Of the Qwen towers' index tensors, the (h, w) position ids are counted (once the rotary reads them, as the
trace counts them); the window indices and cumulative lengths (a few bytes per patch) are not: the trace
worker computes them from constants, which the trace does not see (``gpumem_trace_worker/vision.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.replay.autograd import Sim
from gpumem_gui.core.replay.config import ReplayConfig
from gpumem_gui.core.replay.memory import DT_BYTES
from gpumem_gui.core.replay.vision_llama4 import Llama4Tower
from gpumem_gui.core.replay.vision_pixtral import PixtralTower
from gpumem_gui.core.replay.vision_siglip import SiglipTower
from gpumem_gui.core.replay.vision_tower import REGION, Tower
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.vision import ImageGrid, VisionTower, image_grid

# the tower class of each kind (the Qwen kinds: Tower itself)
_TOWERS: dict[str, type[Tower]] = {"pixtral": PixtralTower, "siglip": SiglipTower, "llama4": Llama4Tower}
# the Qwen models cast pixel_values to the weights' dtype before the tower
# (Qwen2_5_VLModel.get_image_features) and build an image and a video placeholder mask; the others cast
# inside the tower, one mask
_QWEN = ("qwen2_5_vl", "qwen3_vl")


@dataclass(frozen=True)
class TowerPeak:
    """The highest live bytes (weights excluded) from the prompt's embedding to ``masked_scatter``."""

    peak: int
    where: str
    by_tag: dict[str, int]


def image_tokens(spec: ModelSpec, images: int, image_size: int) -> int:
    """Tokens ``images`` images of ``image_size`` pixels add to each sequence (0 without images)."""
    tower = spec.vision.tower if images and spec.vision is not None else None
    return images * image_grid(tower, image_size).tokens if tower is not None else 0


def tower_buffer_bytes(spec: ModelSpec) -> int:
    """Bytes of the replayed vision tower's non-persistent buffers (its rotary tables, SigLIP's position ids),
    which the model holds with its weights whether a prompt has images or not; 0 without a replayed tower."""
    tower = spec.vision.tower if spec.vision is not None else None
    return _TOWERS.get(tower.kind, Tower).buffer_bytes(tower) if tower is not None else 0


def pixel_bytes(tower: VisionTower, grid: ImageGrid) -> int:
    """Bytes of one image's ``pixel_values`` as its processor returns them: every tile's ``in_channels x
    temporal_patch_size x side^2`` values, in the tower kind's pixel dtype (fp32; Llama 4's bf16)."""
    per_image = grid.tiles * tower.in_channels * tower.temporal_patch_size * grid.side**2
    return round(per_image * DT_BYTES[_TOWERS.get(tower.kind, Tower).pixel_dtype])


def has_tower(spec: ModelSpec) -> bool:
    """Whether the model's vision tower is replayed (its images are counted)."""
    return spec.vision is not None and spec.vision.tower is not None


def _tower(spec: ModelSpec, cfg: ReplayConfig) -> VisionTower:
    tower = spec.vision.tower if spec.vision is not None else None
    if tower is None:
        raise GpumemInputError(
            "images are modelled for the Qwen2.5-VL, Qwen3-VL, Mistral 3 (Pixtral), Gemma 3 (SigLIP) and "
            "Llama 4 vision towers only; set images to 0 for a text-only estimate",
            field="images",
        )
    if cfg.attn == "eager":
        raise GpumemInputError(
            "images: the vision tower's eager attention is not modelled; use sdpa (or flash)", field="attn"
        )
    return tower


class _Inputs:
    """The processor's tensors and generate()'s position ids, held by the caller through the forward."""

    def __init__(self, s: Sim, spec: ModelSpec, cfg: ReplayConfig, b: Any, q: Any) -> None:
        tower = _tower(spec, cfg)
        grid = image_grid(tower, cfg.image_size)
        kind = _TOWERS.get(tower.kind, Tower)
        per_image = pixel_bytes(tower, grid) // round(DT_BYTES[kind.pixel_dtype])
        prev, s.region = s.region, REGION
        self.pixel_values = s.new(b * cfg.images * per_image, kind.pixel_dtype)
        s.region = "inputs"
        if tower.kind == "pixtral":  # PixtralProcessor: image_sizes [images, 2]
            self.grid = s.new(b * cfg.images * 2, "i64")
        elif tower.kind == "siglip":  # Gemma3Processor: token_type_ids (1 on image tokens) [b, q]
            self.token_type_ids = s.new(b * q, "i64")
        else:
            self.mm_token_type_ids = s.new(b * q, "i64")
            self.position_ids = s.new(4 * b * q, "i64")  # [4, b, q]: text + 3-D rotary positions
            self.grid = s.new(b * cfg.images * 3, "i64")  # image_grid_thw
        s.region = prev


def hold(s: Sim, spec: ModelSpec, cfg: ReplayConfig, b: Any, q: Any) -> list[Any]:
    """What lives through the language model's forward (``b`` and ``q`` may be tape sizes): the processor's
    inputs, the tower's outputs, ``image_embeds`` and the image mask."""
    tower = _tower(spec, cfg)
    grid = image_grid(tower, cfg.image_size)
    dt = cfg.param_dt
    inputs = _Inputs(s, spec, cfg, b, q)
    prev, s.region = s.region, REGION
    n = b * cfg.images
    held = [
        inputs,
        s.new(n * _TOWERS.get(tower.kind, Tower).last_elems(tower, grid), dt),  # last_hidden_state
        s.new(n * grid.features * tower.out_hidden_size, dt),  # pooler_output (the merged features)
        s.new(b * q, "bool"),  # image_mask [b, q, 1]
    ]
    if _TOWERS.get(tower.kind, Tower).cat_features:  # image_embeds = torch.cat(...)
        held.append(s.new(n * grid.features * tower.out_hidden_size, dt))
    # Qwen3-VL: the deepstack features and their concatenated copies (deepstack_visual_embeds)
    held += [s.new(n * grid.features * tower.out_hidden_size, dt) for _ in 2 * tower.deepstack_visual_indexes]
    s.region = prev
    return held


def tower_peak(spec: ModelSpec, cfg: ReplayConfig) -> TowerPeak:
    """The prefill from the prompt's embedding to ``masked_scatter``: the caller's inputs, the embedding,
    ``get_image_features`` (the fp32 pixels cast to the weights' dtype, the tower), ``image_embeds``, the
    placeholder masks, the new ``inputs_embeds`` (and Qwen3-VL's concatenated deepstack features)."""
    tower = _tower(spec, cfg)
    grid = image_grid(tower, cfg.image_size)
    s = Sim()
    s.grad_enabled = False
    s.tr.start_phase("forward")
    b, q, dt = cfg.batch, cfg.q, cfg.param_dt
    s.tr.where = "embedding"
    ids = s.new(b * q, "i64", "inputs")
    inputs = _Inputs(s, spec, cfg, b, q)
    embeds = s.new(b * q * spec.hidden_size, dt, "hidden_states")
    s.region = REGION
    qwen = tower.kind in _QWEN
    tw = _TOWERS.get(tower.kind, Tower)(s, tower, grid, b * cfg.images, dt)
    pixels = s.new(inputs.pixel_values.n, dt) if qwen else None  # pixel_values.type(self.visual.dtype)
    last, merged, deep = tw.forward()
    del pixels
    s.tr.where = "vision masked_scatter"
    image_embeds = s.new(merged.n, dt) if tw.cat_features else None  # torch.cat(pooler_output)
    image_mask, video_mask = s.new(b * q, "bool"), s.new(b * q, "bool") if qwen else None
    del video_mask
    s.region = "hidden_states"
    embeds = s.new(embeds.n, dt)  # inputs_embeds.masked_scatter(image_mask, image_embeds)
    s.region = REGION
    deep_cat = [s.new(d.n, dt) for d in deep]  # Qwen3VLModel: torch.cat of each deepstack feature
    peak, _, by_tag, where = s.tr.peaks["forward"]
    del ids, inputs, embeds, last, merged, deep, image_embeds, image_mask, deep_cat
    return TowerPeak(peak=peak, where=where, by_tag=dict(by_tag))


def step_inputs(s: Sim, spec: ModelSpec, cfg: ReplayConfig) -> Any:
    """A training step's image tensors from the collator (pixel_values and the processor's other tensors),
    alive through the whole step as the batch is (kinds ``input``)."""
    prev, s.phase_kind = s.phase_kind, "input"
    inputs = _Inputs(s, spec, cfg, cfg.batch, cfg.q)
    s.phase_kind = prev
    return inputs


def train_prefix(s: Sim, spec: ModelSpec, cfg: ReplayConfig) -> list[Any]:
    """A training forward up to the language model, the vision tower frozen (TRL / LLaMA-Factory's default,
    ``freeze_vision_tower``: no parameter of it requires grad and its inputs do not, so autograd records
    nothing of it): the tower's transient activations, then what the model's forward holds through the
    language model (its outputs, ``image_embeds``, the image mask), freed when the forward returns. Under
    autocast its tensors are taken in the autocast dtype (the fp32 outputs of its LayerNorms under autocast
    are not modelled)."""
    tower = _tower(spec, cfg)
    grid = image_grid(tower, cfg.image_size)
    b, dt = cfg.batch, cfg.autocast or cfg.param_dt  # under autocast its linears compute in that dtype
    grad, s.grad_enabled = s.grad_enabled, False
    prev, s.region = s.region, REGION
    kind = _TOWERS.get(tower.kind, Tower)
    tw = kind(s, tower, grid, b * cfg.images, dt)
    n = b * cfg.images
    pixels = s.new(n * grid.tiles * tower.in_channels * grid.side**2, dt) if tower.kind in _QWEN else None
    last, merged, deep = tw.forward()
    del pixels
    if kind.last_is_layer_norm:  # the LayerNorm's output in its weight's dtype (the CPU trace: fp32 weights
        # on bf16 autocast inputs give fp32; CUDA autocast runs layer_norm in fp32 always, not modelled)
        last = s.new(last.n, cfg.param_dt)
    held = [last, merged, *deep, s.new(b * cfg.q, "bool")]  # the image mask [b, q, 1]
    if kind.cat_features:  # image_embeds = torch.cat(...)
        held.append(s.new(merged.n, dt))
    held += [s.new(d.n, dt) for d in deep]  # Qwen3-VL: the concatenated deepstack features
    s.region, s.grad_enabled = prev, grad
    return held
