"""Gemma 3's vision side on a :class:`~.autograd.Sim`: SiglipVisionModel and Gemma3MultiModalProjector
(transformers 5.24, ``models/siglip/modeling_siglip.py``, ``models/gemma3/modeling_gemma3.py``).

Every image is resized to the tower's ``image_size`` (896 px: 64 x 64 patches of 14 px) and is one sequence of
the batch: the Conv2d runs on the fp32 pixels cast to the weights' dtype, the learned position table is added;
per layer LayerNorm, q/k/v (with biases), SDPA without mask over the image's patches, out_proj, a GELU MLP
(fc1, gelu_pytorch_tanh, fc2); ``post_layernorm``. The projector transposes and reshapes the patches into a
``[images, hidden, g, g]`` copy, average-pools them by ``g / sqrt(mm_tokens_per_image)`` a side, normalises
(Gemma3RMSNorm in fp32) and multiplies by ``mm_input_projection_weight`` into the text model's width.
"""

from __future__ import annotations

from gpumem_gui.core.replay.memory import T
from gpumem_gui.core.replay.vision_tower import Tower
from gpumem_gui.core.spec.vision import VisionTower


class SiglipTower(Tower):
    """The SigLIP tower and Gemma 3's projector (``spatial_merge_size``: the pooling kernel,
    ``out_hidden_size``: the text model's width)."""

    cat_features = False  # Gemma3Model scatters pooler_output itself
    last_is_layer_norm = True  # post_layernorm
    mlp_gated = False  # SiglipMLP: fc2(act(fc1(x)))

    @staticmethod
    def buffer_bytes(tower: VisionTower) -> int:
        """SiglipVisionEmbeddings' ``position_ids``: ``arange(num_patches).expand((1, -1))``, int64, one per
        patch of the fixed image side (non-persistent; ``models/siglip/modeling_siglip.py``, transformers
        5.24). The tower has no rotary."""
        return (tower.fixed_side // tower.patch_size) ** 2 * 8

    def norm(self, x: T) -> T:
        return self.layer_norm(x)

    def attention(self, x: T, chunks: tuple[int, int]) -> T:
        """SiglipAttention: q/k/v (locals until it returns), SDPA over the image's patches, out_proj."""
        return self.qkv_attention()

    def soft_emb_norm(self, x: T) -> T:
        """Gemma3RMSNorm: ``x.float()``, ``x * rsqrt(x.pow(2).mean(-1) + eps)``, times ``1 + weight.float()``,
        ``type_as(x)``."""
        rows, h = x.n // self.v.hidden_size, self.v.hidden_size
        xf = self.new(x.n, "f32")
        sq = self.new(x.n, "f32")
        mean = self.new(rows, "f32")
        del sq
        eps = self.new(rows, "f32")
        del mean
        r = self.new(rows, "f32")
        del eps
        normed = self.new(x.n, "f32")
        del xf, r
        w, w1 = self.new(h, "f32"), self.new(h, "f32")  # weight.float(), 1.0 + ...
        del w
        out = self.new(x.n, "f32")
        del normed, w1
        low = self.new(x.n)
        del out
        return low

    def forward(self) -> tuple[T, T, list[T]]:
        s, v, g = self.s, self.v, self.g
        s.tr.where = "vision patch embedding"
        pixels = self.new(self.images * v.in_channels * g.side * g.side)  # pixel_values.to(dtype)
        conv = self.new(self.nd)  # Conv2d, flattened and transposed as a view
        del pixels
        pos = self.new(g.patches * v.hidden_size)  # position_embedding(position_ids): [1, patches, hidden]
        embeds = self.new(self.nd)
        del conv, pos
        hidden = embeds  # SiglipEncoder.forward's inputs_embeds: alive until the encoder returns
        for i in range(v.depth):
            s.tr.where = f"vision block {i}"
            hidden = self.block(hidden, (self.n, 1))
        s.tr.where = "vision post_layernorm"
        last = self.layer_norm(hidden)
        del hidden, embeds
        s.tr.where = "vision projector"
        rows = self.images * g.features
        square = self.new(self.nd)  # transpose(1, 2).reshape(b, hidden, g, g): a copy
        pooled = self.new(rows * v.hidden_size)  # AvgPool2d, flattened and transposed as a view
        del square
        normed = self.soft_emb_norm(pooled)
        out = self.new(rows * v.out_hidden_size)  # matmul with mm_input_projection_weight
        del normed, pooled
        return last, out, []
