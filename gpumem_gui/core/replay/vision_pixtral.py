"""Mistral 3's vision side on a :class:`~.autograd.Sim`: PixtralVisionModel and Mistral3MultiModalProjector
(transformers 5.24, ``models/pixtral/modeling_pixtral.py``, ``models/mistral3/modeling_mistral3.py``).

Every image of the batch is one sequence of ``N`` patches: the Conv2d runs on the fp32 pixels cast to the
weights' dtype, the patches are flattened and concatenated, ``ln_pre``; the axial rotary tables (fp32, then
cast), a block-diagonal ``[N, N]`` additive mask in the weights' dtype (``generate_block_attention_mask``);
per layer RMSNorm, q/k/v, the rotary in the weights' dtype, SDPA under the mask, o_proj, a gated MLP. The
projector normalises, unfolds each image's 2 x 2 patches (``F.unfold``), merges them, and runs linear_1, the
activation and linear_2. ``get_image_features`` keeps the selected (last) layer's output only
(``select_hidden_states``).
"""

from __future__ import annotations

from gpumem_gui.core.replay.memory import T
from gpumem_gui.core.replay.vision_tower import Tower
from gpumem_gui.core.spec.vision import VisionTower


class PixtralTower(Tower):
    """The Pixtral tower and Mistral 3's projector (``out_hidden_size``: the text model's width)."""

    mlp_gated = True  # PixtralMLP: down_proj(act(gate_proj(x)) * up_proj(x))

    @staticmethod
    def buffer_bytes(tower: VisionTower) -> int:
        """PixtralVisionRotaryEmbedding's ``inv_freq`` and ``original_inv_freq``: fp32, ``ceil(head_dim / 2)``
        each (``compute_axial_rope_parameters``: ``arange(0, head_dim, 2)``, its even and odd halves
        concatenated; transformers 5.24 ``models/pixtral/modeling_pixtral.py``)."""
        return 2 * -(-tower.head_dim // 2) * 4

    def rotary(self) -> tuple[T, T]:
        """PixtralVisionRotaryEmbedding: fp32 angles of the (h, w) positions, recomposed, cast to the weights'
        dtype."""
        n, hd = self.n, self.v.head_dim
        pos = self.new(n * 2, "f32")
        freqs = self.new(n * hd, "f32")
        del pos
        tables = []
        for _ in range(2):  # cos, sin (times attention_scaling)
            raw = self.new(n * hd, "f32")
            tables.append(self.new(n * hd, "f32"))
            del raw
        out = []
        for _table in tables:  # recomposition_frequencies
            hw = self.new(n * hd // 2, "f32")
            out.append(self.new(n * hd, "f32"))
            del hw
        del tables, freqs
        return self.new(n * hd), self.new(n * hd)

    def rotate(self) -> T:
        """apply_rotary_pos_emb on q or k in the weights' dtype: ``(x * cos) + (rotate_half(x) * sin)``."""
        a = self.new(self.nd)
        neg = self.new(self.nd // 2)
        cat = self.new(self.nd)
        del neg
        b = self.new(self.nd)
        del cat
        out = self.new(self.nd)
        del a, b
        return out

    def attention(self, x: T, chunks: tuple[int, int]) -> T:
        """PixtralAttention: q/k/v, the rotary on q then k, SDPA over all N patches under the mask; the
        rotated q and k and v die before o_proj."""
        return self.qkv_attention(lambda: (self.rotate(), self.rotate()), early_free=True)

    def forward(self) -> tuple[T, T, list[T]]:
        s, v, g = self.s, self.v, self.g
        s.tr.where = "vision patch embedding"
        pixels = self.new(self.images * v.in_channels * g.side * g.side)  # pixel_values.to(dtype)
        conv = self.new(self.nd)  # Conv2d output, kept by patch_embeds_list until the forward returns
        del pixels
        flat = self.new(self.nd)  # torch.cat of the flattened patches
        embeds = self.norm(flat)  # ln_pre
        del flat
        s.tr.where = "vision rotary"
        position_ids = self.new(2 * self.n, "i64")
        cos_sin = self.rotary()
        mask = self.new(self.n * self.n)  # torch.full((N, N), finfo.min)
        hidden = embeds
        for i in range(v.depth):
            s.tr.where = f"vision block {i}"
            hidden = self.block(hidden, (self.n, 1))
        del conv, position_ids, cos_sin, mask, embeds
        s.tr.where = "vision projector"
        normed = self.norm(hidden)
        rows = self.images * g.features
        parts = self.new(self.nd)  # F.unfold of each image (kept in a list until the merger returns)
        cat = self.new(self.nd)
        merged = self.new(rows * v.hidden_size)  # merging_layer
        del parts, cat, normed
        h1 = self.new(rows * v.out_hidden_size)
        act = self.new(rows * v.out_hidden_size)
        del h1
        out = self.new(rows * v.out_hidden_size)
        del act, merged
        return hidden, out, []
