"""Llama 4's vision side on a :class:`~.autograd.Sim`: Llama4VisionModel and Llama4MultiModalProjector
(transformers 5.24, ``models/llama4/modeling_llama4.py``).

An image is ``tiles`` rows of the batch (its canvas's tiles and a global one), each ``g^2`` patches and a
class token: the processor's pixels (bfloat16, Llama4ImageProcessor.rescale_and_normalize) are unfolded into
patches (Llama4UnfoldConvolution: ``nn.Unfold``, a permuted view the linear copies), the class embedding
concatenated, the position table added, ``layernorm_pre``. Per layer LayerNorm, q/k/v (with biases), the
rotary on fp32 copies as complex products (``vision_apply_rotary_emb``) cast back, SDPA over the tile, o_proj,
a GELU MLP. ``layernorm_post``, the class token sliced off, the pixel shuffle (two permuted copies) and the
adapter (fc1, GELU, fc2, GELU); Llama4ForConditionalGeneration projects the adapter's output to the text
width (``multi_modal_projector``).
"""

from __future__ import annotations

from gpumem_gui.core.replay.memory import T
from gpumem_gui.core.replay.vision_tower import Tower
from gpumem_gui.core.spec.vision import ImageGrid, VisionTower


class Llama4Tower(Tower):
    """The Llama 4 tower and projector (``images``: the batch's images; ``n``: rows over all their tiles)."""

    cat_features = False  # the projector's output is scattered as it is
    pixel_dtype = "bf16"  # Llama4ImageProcessor.rescale_and_normalize returns bfloat16 pixels
    mlp_gated = False  # Llama4VisionMLP: fc2(GELU(fc1(x)))

    @staticmethod
    def last_elems(tower: VisionTower, grid: ImageGrid) -> int:
        """The vision model's last_hidden_state of one image: the adapter's output."""
        return grid.features * tower.adapter_size

    @staticmethod
    def buffer_bytes(tower: VisionTower) -> int:
        """Llama4VisionRotaryEmbedding's ``freqs_ci`` (non-persistent): complex64 (8 B), one row per patch of
        a tile and the class token, ``2 * (freq_dim // 2)`` frequencies a row with
        ``freq_dim = head_dim // 2`` (``_compute_freqs_ci``: ``freq_dim // 2`` frequencies repeated twice for
        x and for y, then every second taken; transformers 5.24 ``models/llama4/modeling_llama4.py``)."""
        rows = (tower.tile_side // tower.patch_size) ** 2 + 1
        return rows * 2 * (tower.head_dim // 2 // 2) * 8

    def norm(self, x: T) -> T:
        return self.layer_norm(x)

    def attention(self, x: T, chunks: tuple[int, int]) -> T:
        """Llama4VisionAttention: q/k/v, the rotary on q and k (:meth:`rotate_qk`), SDPA over the tile,
        o_proj; the rotated q and k and v die when it returns."""
        return self.qkv_attention(self.rotate_qk)

    def rotate_qk(self) -> tuple[T, T]:
        """vision_apply_rotary_emb: fp32 copies of q and k, their complex products with freqs_ci, the results
        cast back (type_as)."""
        nd = self.nd
        qf, kf = self.new(nd, "f32"), self.new(nd, "f32")  # query.float(), key.float()
        qc, kc = self.new(nd, "f32"), self.new(nd, "f32")  # query_ * freqs_ci, key_ * freqs_ci (complex64)
        q_out, k_out = self.new(nd), self.new(nd)  # type_as
        del qf, kf, qc, kc
        return q_out, k_out

    def forward(self) -> tuple[T, T, list[T]]:
        s, v, g = self.s, self.v, self.g
        tiles = self.images * g.tiles
        per_tile = g.grid * g.grid  # patches of a tile, without the class token
        s.tr.where = "vision patch embedding"
        unfolded = self.new(tiles * v.in_channels * v.patch_size**2 * per_tile)  # nn.Unfold
        flat = self.new(unfolded.n)  # the linear's contiguous copy of the permuted patches
        patches = self.new(tiles * per_tile * v.hidden_size)
        del flat, unfolded
        cat = self.new(self.nd)  # torch.cat with the class embedding
        del patches
        pos = self.new(self.nd)  # + positional_embedding_vlm
        del cat
        embeds = self.layer_norm(pos)  # layernorm_pre, alive in the caller through the encoder
        del pos
        hidden = embeds
        for i in range(v.depth):
            s.tr.where = f"vision block {i}"
            hidden = self.block(hidden, (self.n, tiles))
        del embeds
        s.tr.where = "vision adapter"
        post = self.layer_norm(hidden)  # layernorm_post; the encoder's output lives until the forward returns
        rows = tiles * per_tile
        shuffled = self.new(rows * v.hidden_size)  # pixel_shuffle: permute(...).contiguous()
        shuffled2 = self.new(rows * v.hidden_size)  # the second permute(...).contiguous()
        del shuffled
        feats = self.images * g.features
        fc1 = self.new(feats * v.adapter_size)
        act = self.new(feats * v.adapter_size)
        del fc1
        fc2 = self.new(feats * v.adapter_size)
        out = self.new(feats * v.adapter_size)  # the adapter's last GELU: last_hidden_state
        del fc2, act, shuffled2, post, hidden
        s.tr.where = "vision projector"
        projected = self.new(feats * v.out_hidden_size)  # multi_modal_projector.linear_1
        return out, projected, []
