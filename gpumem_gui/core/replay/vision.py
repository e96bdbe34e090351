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
from gpumem_gui.core.replay.memory import T
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.vision import ImageGrid, VisionTower, image_grid, window_chunks

REGION = "vision"


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


def has_tower(spec: ModelSpec) -> bool:
    """Whether the model's vision tower is replayed (its images are counted)."""
    return spec.vision is not None and spec.vision.tower is not None


def _tower(spec: ModelSpec, cfg: ReplayConfig) -> VisionTower:
    tower = spec.vision.tower if spec.vision is not None else None
    if tower is None:
        raise GpumemInputError(
            "images are modelled for the Qwen2.5-VL, Qwen3-VL and Mistral 3 (Pixtral) vision towers only; "
            "set images to 0 for a text-only estimate",
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
        per_patch = tower.in_channels * tower.temporal_patch_size * tower.patch_size**2
        prev, s.region = s.region, REGION
        self.pixel_values = s.new(b * cfg.images * grid.patches * per_patch, "f32")
        s.region = "inputs"
        if tower.kind == "pixtral":  # PixtralProcessor: image_sizes [images, 2]
            self.grid = s.new(b * cfg.images * 2, "i64")
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
        s.new(n * grid.patches * tower.hidden_size, dt),  # last_hidden_state
        s.new(n * grid.features * tower.out_hidden_size, dt),  # pooler_output (the merged features)
        s.new(n * grid.features * tower.out_hidden_size, dt),  # image_embeds = torch.cat(...)
        s.new(b * q, "bool"),  # image_mask [b, q, 1]
    ]
    # Qwen3-VL: the deepstack features and their concatenated copies (deepstack_visual_embeds)
    held += [s.new(n * grid.features * tower.out_hidden_size, dt) for _ in 2 * tower.deepstack_visual_indexes]
    s.region = prev
    return held


class _Tower:
    """The tower's ops on a :class:`Sim` with gradients off (sizes in elements, ``dt`` the weights' dtype);
    every intermediate is a local that dies where the modeling code drops it."""

    def __init__(self, s: Sim, tower: VisionTower, grid: ImageGrid, images: int, dt: str) -> None:
        self.s, self.v, self.g, self.dt = s, tower, grid, dt
        self.images = images
        self.n = images * grid.patches  # rows of the packed sequence
        self.nd = self.n * tower.hidden_size

    def new(self, n: int, dt: str | None = None) -> T:
        return self.s.new(n, dt or self.dt)

    def norm(self, x: T) -> T:
        """Qwen2_5_VLRMSNorm (``h = x.float()``; ``h * rsqrt(h.pow(2).mean(-1) + eps)``; ``w * h.to(dtype)``)
        or nn.LayerNorm (its fp32 mean and rstd die at once)."""
        rows = x.n // self.v.hidden_size
        if self.v.kind == "qwen3_vl":
            out, stats = self.new(x.n), (self.new(rows, "f32"), self.new(rows, "f32"))
            del stats
            return out
        h = self.new(x.n, "f32")
        sq = self.new(x.n, "f32")
        var = self.new(rows, "f32")
        del sq
        eps = self.new(rows, "f32")
        r = self.new(rows, "f32")
        del eps
        h2 = self.new(x.n, "f32")
        del r, h
        low = self.new(x.n)
        out = self.new(x.n)
        del low, var, h2
        return out

    def rotary(self) -> tuple[T, T]:
        """Qwen2_5_VLVisionRotaryEmbedding: fp32 angles of the (h, w) positions, cos and sin recomposed to
        ``[n, head_dim]``; Qwen2.5-VL then permutes both into window order (an index copy each)."""
        n, hd = self.n, self.v.head_dim
        pos = self.new(n * 2, "f32")
        freqs = self.new(n * hd // 2, "f32")
        del pos
        tables = []
        for _ in range(2):  # cos, sin
            raw = self.new(n * hd // 2, "f32")
            scaled = self.new(n * hd // 2, "f32")
            del raw
            tables.append(scaled)
        out = []
        for _table in tables:  # recomposition_frequencies
            hw = self.new(n * hd // 2, "f32")
            out.append(self.new(n * hd, "f32"))
            del hw
        del tables, freqs
        if self.v.window_size:
            out = [self.new(n * hd, "f32") for _ in out]
        return out[0], out[1]

    def rotate(self) -> T:
        """One of q/k in apply_rotary_pos_emb_vision, after its fp32 copy: ``(x * cos) + (rotate_half(x) *
        sin)``."""
        a = self.new(self.nd, "f32")
        neg = self.new(self.nd // 2, "f32")
        cat = self.new(self.nd, "f32")
        del neg
        b = self.new(self.nd, "f32")
        del cat
        out = self.new(self.nd, "f32")
        del a, b
        return out

    def attention(self, x: T, chunks: tuple[int, int]) -> T:
        """Qwen2_5_VLVisionAttention (Qwen3VLVisionAttention): qkv, the rotary in fp32, one SDPA call per
        window (or image) whose outputs live until the torch.cat, proj. ``chunks``: (rows of the last call,
        calls)."""
        qkv = self.new(3 * self.nd)
        qf, kf = self.new(self.nd, "f32"), self.new(self.nd, "f32")
        q_embed = self.rotate()
        k_embed = self.rotate()
        q, k = self.new(self.nd), self.new(self.nd)
        del qf, kf, q_embed, k_embed
        last, _ = chunks
        # SDPA's CPU flash kernel: each call's output [1, heads, rows, head_dim] and its fp32 log-sum-exp
        # (freed at once); all calls' outputs are kept in a list until the function returns
        before = self.new(self.nd - last * self.v.hidden_size)
        out_last, lse = self.new(last * self.v.hidden_size), self.new(last * self.v.num_heads, "f32")
        del lse
        cat = self.new(self.nd)
        proj = self.new(self.nd)
        del before, out_last, cat, q, k, qkv
        return proj

    def mlp(self, x: T) -> T:
        """Qwen2_5_VLMLP ``down(act(gate(x)) * up(x))`` or Qwen3VLVisionMLP ``fc2(act(fc1(x)))``."""
        ni = self.n * self.v.intermediate_size
        gate = self.new(ni)
        act = self.new(ni)
        del gate
        if self.v.kind != "qwen3_vl":  # gated: Qwen2_5_VLMLP, PixtralMLP
            up = self.new(ni)
            prod = self.new(ni)
            del act, up
            act = prod
        out = self.new(self.nd)
        del act
        return out

    def block(self, hidden: T, chunks: tuple[int, int]) -> T:
        normed = self.norm(hidden)
        attn = self.attention(normed, chunks)
        hidden = self.new(self.nd)
        del normed, attn
        normed = self.norm(hidden)
        mlp = self.mlp(normed)
        del normed
        out = self.new(self.nd)
        del mlp, hidden
        return out

    def merger(self, hidden: T) -> T:
        """Qwen2_5_VLPatchMerger / Qwen3VLVisionPatchMerger: norm, fc1 over the 2x2-merged rows, GELU, fc2."""
        normed = self.norm(hidden)
        fc1 = self.new(self.nd)
        act = self.new(self.nd)
        del fc1
        out = self.new(self.images * self.g.features * self.v.out_hidden_size)
        del act, normed
        return out

    def chunks(self, layer: int) -> tuple[int, int]:
        windowed = self.v.window_size and layer not in self.v.fullatt_block_indexes
        if windowed:
            last, per = window_chunks(self.v, self.g.grid)
            return last, per * self.images
        return self.g.patches, self.images

    def forward(self) -> tuple[T, T, list[T]]:
        """The tower from ``pixel_values`` (already cast) to (last hidden state, merged features, deepstack
        features)."""
        s = self.s
        s.tr.where = "vision patch embedding"
        hidden = self.new(self.nd)  # Conv3d
        if self.v.window_size:  # permute_input_for_window_attn: an index copy
            hidden = self.new(self.nd)
        else:  # Qwen3VLVisionModel: the learned positions, bilinearly interpolated (4 taps a patch); the
            # fp32 interpolation weights (counted once read) and pos_embeds stay locals of the forward
            emb = self.new(4 * self.nd)
            weights = self.new(4 * self.n, "f32")
            weighted = self.new(4 * self.nd, "f32")
            del emb
            pos_embeds = self.new(self.nd, "f32")
            del weighted
            low = self.new(self.nd)
            hidden = self.new(self.nd)
            del low
        s.tr.where = "vision rotary"
        position_ids = self.new(2 * self.n, "i64")  # the (h, w) positions, counted once the rotary reads them
        cos_sin = self.rotary()
        deep = []
        for i in range(self.v.depth):
            s.tr.where = f"vision block {i}"
            hidden = self.block(hidden, self.chunks(i))
            if i in self.v.deepstack_visual_indexes:
                deep.append(self.merger(hidden))
        del cos_sin, position_ids
        if not self.v.window_size:
            del weights, pos_embeds
        s.tr.where = "vision merger"
        merged = self.merger(hidden)
        if self.v.window_size:  # merged[argsort(window_index)]
            merged = self.new(merged.n)
        return hidden, merged, deep


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
    qwen = tower.kind != "pixtral"
    if qwen:
        tw = _Tower(s, tower, grid, b * cfg.images, dt)
    else:  # Mistral 3 (replay/vision_pixtral.py, which builds on _Tower)
        from gpumem_gui.core.replay.vision_pixtral import PixtralTower

        tw = PixtralTower(s, tower, grid, b * cfg.images, dt)
    pixels = s.new(inputs.pixel_values.n, dt) if qwen else None  # pixel_values.type(self.visual.dtype)
    last, merged, deep = tw.forward()
    del pixels
    s.tr.where = "vision masked_scatter"
    image_embeds = s.new(merged.n, dt)  # torch.cat(pooler_output)
    image_mask, video_mask = s.new(b * q, "bool"), s.new(b * q, "bool") if qwen else None
    del video_mask
    s.region = "hidden_states"
    embeds = s.new(embeds.n, dt)  # inputs_embeds.masked_scatter(image_mask, image_embeds)
    s.region = REGION
    deep_cat = [s.new(d.n, dt) for d in deep]  # Qwen3VLModel: torch.cat of each deepstack feature
    peak, _, by_tag, where = s.tr.peaks["forward"]
    del ids, inputs, embeds, last, merged, deep, image_embeds, image_mask, deep_cat
    return TowerPeak(peak=peak, where=where, by_tag=dict(by_tag))
