"""Mistral 3's Pixtral tower and projector trained on the step's images (:mod:`.vision_train`): the ops of
``PixtralVisionModel`` (transformers 5.24, ``models/pixtral/modeling_pixtral.py``) and
``Mistral3MultiModalProjector`` (``models/mistral3/modeling_mistral3.py``) under autograd.

* ``patch_conv`` (Conv2d without bias) on ``pixel_values.to(weight dtype)`` (under autocast a
  lower-precision copy of the pixels, saved for the weight's gradient); its output is held by
  ``patch_embeds_list`` until the forward returns; ``torch.cat`` of the flattened, transposed patches (whose
  backward makes one gradient of the convolution's size), ``ln_pre`` (PixtralRMSNorm: ``x.float()``,
  ``pow``, ``mean``, ``rsqrt``, the product, cast back, times the weight);
* ``PixtralVisionRotaryEmbedding``: the fp32 tables cast to the embeddings' dtype (no gradient,
  :meth:`.vision_pixtral.PixtralTower.rotary`); ``generate_block_attention_mask``: a ``[N, N]`` additive mask
  in the embeddings' dtype, held until the forward returns;
* per ``PixtralAttentionLayer`` (a GradientCheckpointingLayer): ``attention_norm``, q/k/v (each
  ``view(...).transpose(1, 2)``, whose backward copies the gradient), ``apply_rotary_pos_emb`` in q's dtype
  promoted by the tables', SDPA under the mask (under autocast q, k and the mask cast to the autocast dtype;
  the CPU flash kernel saves its inputs, the mask, its output and the fp32 log-sum-exp), ``o_proj``, the
  residual, ``ffn_norm``, the gated PixtralMLP, the residual;
* the projector: ``Mistral3RMSNorm``; ``Mistral3PatchMerger``: ``F.unfold`` of each image's grid (its
  backward, col2im, a gradient of the grid's size), ``torch.cat``, ``merging_layer``; ``linear_1``, the
  activation, ``linear_2``.
"""

from __future__ import annotations

from typing import Any

from gpumem_gui.core.replay.memory import T
from gpumem_gui.core.replay.vision_pixtral import PixtralTower
from gpumem_gui.core.replay.vision_train_lora import INPUT_EMBEDDINGS, input_hook
from gpumem_gui.core.replay.vision_train_qwen import QwenTrainTower
from gpumem_gui.core.spec.model import ModelSpec

_V, _P = "vision_tower.", "multi_modal_projector."


def _projector_bias(spec: ModelSpec) -> bool:
    """Mistral3Config.multimodal_projector_bias, as the reader counted it: linear_1 and linear_2 biased when
    the projector holds their ``2 x text hidden`` bias elements (readers/hf_new_dense_b_2.py
    ``_mistral3``)."""
    vs = spec.vision
    assert vs is not None and vs.tower is not None
    h, m2, out = vs.tower.hidden_size, vs.tower.spatial_merge_size**2, vs.tower.out_hidden_size
    return vs.projector_params == h + h * m2 * h + h * out + out * out + 2 * out


def pixtral_tensors(spec: ModelSpec) -> list[tuple[str, tuple[int, ...]]]:
    """PixtralVisionModel's and Mistral3MultiModalProjector's parameters (names and shapes): the patch Conv2d,
    ln_pre, per layer two RMSNorm weights, q/k/v/o and the gated MLP without biases; the projector's norm,
    merging_layer, linear_1 and linear_2 (biased by multimodal_projector_bias)."""
    v = spec.vision.tower if spec.vision is not None else None
    assert v is not None
    h, i, p, m2, out = (
        v.hidden_size,
        v.intermediate_size,
        v.patch_size,
        v.spatial_merge_size**2,
        v.out_hidden_size,
    )
    tower: list[tuple[str, tuple[int, ...]]] = [("patch_conv.weight", (h, v.in_channels, p, p))]
    tower += [("ln_pre.weight", (h,))]
    for layer in range(v.depth):
        pre = f"transformer.layers.{layer}."
        tower += [(f"{pre}attention_norm.weight", (h,)), (f"{pre}ffn_norm.weight", (h,))]
        tower += [(f"{pre}attention.{x}_proj.weight", (h, h)) for x in "qkvo"]
        tower += [(f"{pre}feed_forward.{x}_proj.weight", (i, h)) for x in ("gate", "up")]
        tower += [(f"{pre}feed_forward.down_proj.weight", (h, i))]
    proj: list[tuple[str, tuple[int, ...]]] = [("norm.weight", (h,))]
    proj += [("patch_merger.merging_layer.weight", (h, h * m2))]
    proj += [("linear_1.weight", (out, h)), ("linear_2.weight", (out, out))]
    if _projector_bias(spec):
        proj += [("linear_1.bias", (out,)), ("linear_2.bias", (out,))]
    return [(_V + n, s) for n, s in tower] + [(_P + n, s) for n, s in proj]


class PixtralTrainTower(QwenTrainTower):
    """The trainable Pixtral tower and Mistral 3 projector on ``images`` images (``n``: rows of all their
    patches, one sequence). PixtralRMSNorm and Mistral3RMSNorm are Qwen2_5_VLRMSNorm's ops
    (:meth:`.vision_train_qwen.QwenTrainTower.rms_norm`)."""

    def full(self, name: str) -> str:
        return name  # the Pixtral tower's names carry their prefix (vision_tower., multi_modal_projector.)

    def rope(self, x: T, cos: T, sin: T) -> T:
        """apply_rotary_pos_emb: ``(x * cos) + (rotate_half(x) * sin)`` without casts (the tables' dtype
        promotes)."""
        o = self.o
        a = o.mul(x, cos, x.n)
        rot = o.cat(o.neg(o.slice_half(x)), o.slice_half(x))
        b = o.mul(rot, sin, rot.n)
        del rot
        return o.add(a, b)

    def attention(self, x: T, cos: T, sin: T, block_mask: T | None = None) -> T:
        o, s, v = self.o, self.s, self.v
        h, pre = v.hidden_size, self._pre + "attention."
        q, k, vv = (o.view(self.linear(x, f"{pre}{p}_proj", h, h), copy_grad=True) for p in "qkv")
        q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
        # SDPA under autocast: every floating input cast (the mask too); the CPU flash kernel saves them
        qc, kc, vc = s.ac_cast(q), s.ac_cast(k), s.ac_cast(vv)
        mask = s.ac_cast(block_mask)
        assert qc is not None and kc is not None and vc is not None and mask is not None
        out = s.new(self.nd, qc.dt)
        lse = s.new(self.n * v.num_heads, "f32")
        s.node("multi", (qc, kc, vc), (out, lse), (qc, kc, vc, out, lse, mask))
        del lse, qc, kc, vc, mask
        proj = self.linear(out, f"{pre}o_proj", h, h)
        del out, q, k, vv  # the rotated q and k are locals until the attention returns
        return proj

    def block(self, i: int, hidden: T, cos: T, sin: T, block_mask: T | None = None) -> T:
        """PixtralAttentionLayer.forward (a method so checkpointing can recompute it; the checkpoint keeps
        its arguments, the mask too)."""
        o, v = self.o, self.v
        self._pre = pre = f"{_V}transformer.layers.{i}."
        self.s.tr.where = f"vision block {i}"
        normed = self.rms_norm(hidden, f"{pre}attention_norm")
        hidden = o.add(hidden, self.attention(normed, cos, sin, block_mask))
        del normed
        x = self.rms_norm(hidden, f"{pre}ffn_norm")
        h, n_i, ff = v.hidden_size, v.intermediate_size, f"{pre}feed_forward."
        gate = o.silu(self.linear(x, f"{ff}gate_proj", n_i, h))
        prod = o.mul(gate, self.linear(x, f"{ff}up_proj", n_i, h))
        del gate
        down = self.linear(prod, f"{ff}down_proj", h, n_i)
        del prod, x  # the layer's local (hidden_states) until the feed-forward returns
        return o.add(hidden, down)

    def projector(self, last: T) -> T:
        """Mistral3MultiModalProjector on the last layer's output."""
        o, s, v = self.o, self.s, self.v
        s.tr.where = "vision projector"
        h, m2, out = v.hidden_size, v.spatial_merge_size**2, v.out_hidden_size
        normed = self.rms_norm(last, f"{_P}norm")
        grids = s.new(self.nd, normed.dt)  # F.unfold of each image (a list until the merger returns)
        s.node("copy", (normed,), (grids,))
        del normed
        cat = o.clone(grids)  # torch.cat(permuted_tensor)
        rows = self.n // m2
        merged = self.linear(cat, f"{_P}patch_merger.merging_layer", h, h * m2)
        del cat, grids
        act = o.gelu_tanh(self.linear(merged, f"{_P}linear_1", out, h))  # the activation saves its input
        del merged
        hidden = self.linear(act, f"{_P}linear_2", out, out)
        assert hidden.n == rows * out
        return hidden

    def forward_pixtral(self, pixels: T, grad_ckpt: bool) -> tuple[T, T]:
        """(the last layer's output, the projected features)."""
        o, s, v = self.o, self.s, self.v
        s.tr.where = "vision patch embedding"
        w = self.w(f"{_V}patch_conv.weight")
        pixels = s.cast(pixels, w.dt)  # pixel_values.to(dtype=target_dtype)
        conv = o.linear(pixels, w, None, v.hidden_size, v.in_channels * v.patch_size**2)  # Conv2d as a matmul
        conv = input_hook(self.m, "pixtral" in INPUT_EMBEDDINGS, conv)
        del pixels
        flat = s.new(self.nd, conv.dt)  # torch.cat([p.flatten(1).T ...])
        s.node("copy", (conv,), (flat,))
        embeds = self.rms_norm(flat, f"{_V}ln_pre")
        del flat
        s.tr.where = "vision rotary"
        position_ids = s.new(2 * self.n, "i64")
        cos, sin = PixtralTower(s, v, self.g, self.n // self.g.patches, embeds.dt).rotary()
        mask = s.new(self.n * self.n, embeds.dt)  # generate_block_attention_mask
        hidden = embeds
        for i in range(v.depth):
            if grad_ckpt:  # GradientCheckpointingLayer
                hidden = s.checkpoint(self.block, i, hidden, cos, sin, mask)
            else:
                hidden = self.block(i, hidden, cos, sin, mask)
        del conv, position_ids, cos, sin, embeds, mask  # locals until PixtralVisionModel.forward returns
        return hidden, self.projector(hidden)


def embed_pixtral(m: Any, images: int, pixels: T) -> tuple[T, T]:
    """The tower and projector: (the vision model's last hidden state, the projected features)."""
    return PixtralTrainTower(m, images, m.cfg.image_size).forward_pixtral(pixels, m.cfg.grad_ckpt)
