"""The Qwen2.5-VL / Qwen3-VL vision tower's forward on a :class:`~.autograd.Sim` (patch embedding, rotary,
windowed and full attention blocks, the patch merger), the base Mistral 3's Pixtral tower builds on
(:mod:`.vision_pixtral`); :mod:`.vision` runs it inside a prefill with images.
"""

from __future__ import annotations

from collections.abc import Callable

from gpumem_gui.core.replay.autograd import Sim
from gpumem_gui.core.replay.memory import T
from gpumem_gui.core.spec.vision import ImageGrid, VisionTower, window_chunks

REGION = "vision"


class Tower:
    """The tower's ops on a :class:`Sim` with gradients off (sizes in elements, ``dt`` the weights' dtype);
    every intermediate is a local that dies where the modeling code drops it."""

    cat_features = True  # the model torch.cat's the tower's merged features into image_embeds
    pixel_dtype = "f32"  # the processor's pixel_values
    last_is_layer_norm = False  # the vision model's last_hidden_state is an nn.LayerNorm's output
    # the MLP is gated (``down(act(gate(x)) * up(x))``); None: by the Qwen kind (Qwen2_5_VLMLP is,
    # Qwen3VLVisionMLP is not)
    mlp_gated: bool | None = None

    @staticmethod
    def last_elems(tower: VisionTower, grid: ImageGrid) -> int:
        """Elements of the vision model's last_hidden_state for one image (alive through the text forward)."""
        return grid.patches * tower.hidden_size

    @staticmethod
    def buffer_bytes(tower: VisionTower) -> int:
        """The tower's non-persistent buffers, built with the model and held as long as it is: the rotary's
        ``inv_freq`` and ``original_inv_freq``, fp32, ``ceil(head_dim // 2 / 2)`` each
        (Qwen2_5_VLVisionRotaryEmbedding / Qwen3VLVisionRotaryEmbedding ``__init__`` and
        ``compute_axial_rope_parameters``: ``arange(0, head_dim // 2, 2)``, transformers 5.24)."""
        return 2 * -(-(tower.head_dim // 2) // 2) * 4

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
        if self.v.kind == "qwen3_vl":
            return self.layer_norm(x)
        rows = x.n // self.v.hidden_size
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

    def layer_norm(self, x: T) -> T:
        """nn.LayerNorm (native_layer_norm): its output, the fp32 mean and rstd freed at once."""
        rows = x.n // self.v.hidden_size
        out, stats = self.new(x.n), (self.new(rows, "f32"), self.new(rows, "f32"))
        del stats
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
        """The tower's MLP: gated ``down(act(gate(x)) * up(x))`` (Qwen2_5_VLMLP, PixtralMLP) or
        ``fc2(act(fc1(x)))`` (Qwen3VLVisionMLP, SiglipMLP, Llama4VisionMLP), as :attr:`mlp_gated` says."""
        ni = self.n * self.v.intermediate_size
        gate = self.new(ni)
        act = self.new(ni)
        del gate
        gated = self.mlp_gated if self.mlp_gated is not None else self.v.kind != "qwen3_vl"
        if gated:
            up = self.new(ni)
            prod = self.new(ni)
            del act, up
            act = prod
        out = self.new(self.nd)
        del act
        return out

    def qkv_attention(self, rope: Callable[[], tuple[T, T]] | None = None, early_free: bool = False) -> T:
        """The attention of the towers with separate q/k/v projections (SiglipAttention, PixtralAttention,
        Llama4VisionAttention): q, k, v; ``rope`` (when given) makes the rotated q and k, which replace the
        projections; SDPA's output and its fp32 log-sum-exp (the CPU flash kernel's, freed at once; the output
        is laid out so the transpose back is a view); the output projection. The rotated q, k and v die
        before the output projection with ``early_free`` (PixtralAttention), else when the function
        returns."""
        nd = self.nd
        q, k, v = self.new(nd), self.new(nd), self.new(nd)
        if rope is not None:
            rotated = rope()
            del q, k
            q, k = rotated
            del rotated
        out, lse = self.new(nd), self.new(self.n * self.v.num_heads, "f32")
        del lse
        if early_free:
            del q, k, v
        proj = self.new(nd)
        del out
        if not early_free:
            del q, k, v
        return proj

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
