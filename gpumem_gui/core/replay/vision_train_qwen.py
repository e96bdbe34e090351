"""Qwen2.5-VL's vision tower trained on the step's images (:mod:`.vision_train`): the ops of
``Qwen2_5_VisionTransformerPretrainedModel`` (transformers 5.24, ``models/qwen2_5_vl/modeling_qwen2_5_vl.py``)
under autograd.

* ``Qwen2_5_VisionPatchEmbed``: the Conv3d over the flattened patches (under autocast a lower-precision copy
  of the pixels, saved for the weight's gradient), then ``permute_input_for_window_attn`` (an index copy,
  whose backward saves only the indices); the (h, w) position ids and the rotary tables in fp32, permuted
  the same way (no gradient: the frozen tower's ops, :meth:`.vision_tower.Tower.rotary`);
* per ``Qwen2_5_VLVisionBlock`` (a GradientCheckpointingLayer): ``Qwen2_5_VLRMSNorm`` (fp32 copy, ``pow``,
  ``mean``, ``rsqrt``, the product, cast back, times the fp32 weight: an fp32 output), ``qkv`` (its output's
  views are q, k and v), ``apply_rotary_pos_emb_vision`` on fp32 copies of q and k (``q * cos +
  rotate_half(q) * sin``, cast back), one SDPA call per window or image whose outputs and log-sum-exp are
  saved, ``torch.cat`` of the outputs, ``proj``, the residual; the norm, the gated MLP with biases, the
  residual;
* ``Qwen2_5_VLPatchMerger`` (``ln_q``, ``mlp.0``, GELU, ``mlp.2``) and ``merged[reverse_indices]``.

The SDPA calls of one layer are one node here: all of their outputs live until ``torch.cat`` and are saved for
backward, so the forward holds the same bytes; their backward allocates every call's input gradients at once
(one call's at a time in torch).
"""

from __future__ import annotations

from typing import Any

from gpumem_gui.core.replay.memory import T
from gpumem_gui.core.replay.vision_tower import Tower
from gpumem_gui.core.replay.vision_train_lora import INPUT_EMBEDDINGS, adapted, input_hook
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.vision import image_grid

PREFIX = "visual."


def qwen_tensors(spec: ModelSpec) -> list[tuple[str, tuple[int, ...]]]:
    """Qwen2_5_VisionTransformerPretrainedModel's parameters (names and shapes): the patch Conv3d without
    bias, per block two RMSNorm weights, qkv and proj with biases, the gated MLP with biases; the merger."""
    v = spec.vision.tower if spec.vision is not None else None
    assert v is not None
    h, i, p, m2 = v.hidden_size, v.intermediate_size, v.patch_size, v.spatial_merge_size**2
    out: list[tuple[str, tuple[int, ...]]] = [
        ("patch_embed.proj.weight", (h, v.in_channels, v.temporal_patch_size, p, p))
    ]
    for b in range(v.depth):
        pre = f"blocks.{b}."
        out += [(f"{pre}norm1.weight", (h,)), (f"{pre}norm2.weight", (h,))]
        out += [(f"{pre}attn.qkv.weight", (3 * h, h)), (f"{pre}attn.qkv.bias", (3 * h,))]
        out += [(f"{pre}attn.proj.weight", (h, h)), (f"{pre}attn.proj.bias", (h,))]
        for name in ("gate_proj", "up_proj"):
            out += [(f"{pre}mlp.{name}.weight", (i, h)), (f"{pre}mlp.{name}.bias", (i,))]
        out += [(f"{pre}mlp.down_proj.weight", (h, i)), (f"{pre}mlp.down_proj.bias", (h,))]
    out += [("merger.ln_q.weight", (h,))]
    out += [("merger.mlp.0.weight", (h * m2, h * m2)), ("merger.mlp.0.bias", (h * m2,))]
    out += [("merger.mlp.2.weight", (v.out_hidden_size, h * m2)), ("merger.mlp.2.bias", (v.out_hidden_size,))]
    return [(PREFIX + name, shape) for name, shape in out]


class QwenTrainTower:
    """The trainable Qwen2.5-VL tower on ``images`` images (``n``: rows of all their patches)."""

    cat_features = True  # Qwen2_5_VLModel.forward: torch.cat(pooler_output) into image_embeds
    masks = 2  # get_placeholder_mask: the image and the video mask

    def __init__(self, m: Any, images: int, image_size: int) -> None:
        self.m, self.o, self.s = m, m.o, m.s
        self.v = v = m.spec.vision.tower
        self.g = image_grid(v, image_size)
        self.n = images * self.g.patches
        self.nd = self.n * v.hidden_size
        self.frozen = Tower(m.s, v, self.g, images, "f32")  # the gradient-free parts (rotary, window sizes)
        self._pre = ""  # the block being run

    def full(self, name: str) -> str:
        """The parameter (or module) name of the model for the tower's own ``name``."""
        return PREFIX + name

    def w(self, name: str) -> T:
        return self.m.p[self.full(name)].tensor

    def b(self, name: str) -> T | None:
        p = self.m.p.get(self.full(name))
        return p.tensor if p is not None else None

    def linear(self, x: T, name: str, n_out: int, n_in: int) -> T:
        """nn.Linear ``name``, or PEFT's LoRA Linear around it (:mod:`.vision_train_lora`)."""
        out = self.o.linear(x, self.w(f"{name}.weight"), self.b(f"{name}.bias"), n_out, n_in)
        return adapted(self.m, x, out, self.full(name), n_out, n_in)

    def rms_norm(self, x: T, name: str) -> T:
        """Qwen2_5_VLRMSNorm: ``weight * (x.float() * rsqrt(mean(x^2) + eps)).to(x.dtype)``."""
        o, s = self.o, self.s
        hs = s.cast(x, "f32")
        variance = o.mean_last(o.pow2(hs), self.v.hidden_size)
        hs = o.mul(hs, o.rsqrt(o.add(variance, None)))
        del variance
        return o.mul(self.w(f"{name}.weight"), s.cast(hs, x.dt), hs.n)

    def rotate(self, x: T, cos: T, sin: T) -> T:
        """One of q/k: ``x.float()``, ``x * cos + rotate_half(x) * sin``, cast back to ``x``'s dtype."""
        o, s = self.o, self.s
        xf = s.cast(x, "f32")
        a = o.mul(xf, cos, xf.n)
        half = o.slice_half(xf)  # x2 = x[..., d/2:] (a view); x1 the other half
        rot = o.cat(o.neg(half), o.slice_half(xf))
        del half
        b = o.mul(rot, sin, rot.n)
        del rot
        out = o.add(a, b)
        del a, b, xf
        return s.cast(out, x.dt)

    def attention(self, x: T, cos: T, sin: T) -> T:
        o, s, v = self.o, self.s, self.v
        h = v.hidden_size
        qkv = self.linear(x, self._pre + "attn.qkv", 3 * h, h)
        q, k, vv = (T(qkv.st, self.nd, qkv.dt) for _ in range(3))
        s.node("split", (qkv,), (q, k, vv))
        del qkv
        q, k = self.rotate(q, cos, sin), self.rotate(k, cos, sin)
        out = s.new(self.nd, q.dt)  # every call's output [1, heads, rows, head_dim] until torch.cat
        lse = s.new(self.n * v.num_heads, "f32")
        s.node("multi", (q, k, vv), (out, lse), (q, k, vv, out, lse))
        del lse, q, k, vv
        cat = o.clone(out)  # torch.cat(attn_outputs, dim=1)
        del out
        return self.linear(cat, self._pre + "attn.proj", h, h)

    def block(self, i: int, hidden: T, cos: T, sin: T) -> T:
        """Qwen2_5_VLVisionBlock.forward (a method so checkpointing can recompute it)."""
        o, v = self.o, self.v
        self._pre = pre = f"blocks.{i}."
        self.s.tr.where = f"vision block {i}"
        hidden = o.add(hidden, self.attention(self.rms_norm(hidden, f"{pre}norm1"), cos, sin))
        x = self.rms_norm(hidden, f"{pre}norm2")
        h, n_i = v.hidden_size, v.intermediate_size
        gate = o.silu(self.linear(x, f"{pre}mlp.gate_proj", n_i, h))
        prod = o.mul(gate, self.linear(x, f"{pre}mlp.up_proj", n_i, h))
        del gate
        down = self.linear(prod, f"{pre}mlp.down_proj", h, n_i)
        del prod, x  # the MLP's argument until it returns
        return o.add(hidden, down)

    def forward(self, pixels: T, grad_ckpt: bool) -> tuple[T, T]:
        """(last hidden state, merged features in image order)."""
        o, s, v = self.o, self.s, self.v
        s.tr.where = "vision patch embedding"
        w = self.w("patch_embed.proj.weight")
        pixels = s.cast(pixels, w.dt)  # pixel_values.type(self.visual.dtype), .to(dtype=target_dtype)
        width = v.in_channels * v.temporal_patch_size * v.patch_size**2
        conv = o.linear(pixels, w, None, v.hidden_size, width)  # Conv3d as a matmul over the patches
        conv = input_hook(self.m, "qwen2_5_vl" in INPUT_EMBEDDINGS, conv)
        del pixels
        hidden = s.new(self.nd, conv.dt)  # permute_input_for_window_attn: an index copy
        s.node("copy", (conv,), (hidden,))
        del conv
        s.tr.where = "vision rotary"
        position_ids = s.new(2 * self.n, "i64")
        cos, sin = self.frozen.rotary()
        for i in range(v.depth):
            if grad_ckpt:  # GradientCheckpointingLayer
                hidden = s.checkpoint(self.block, i, hidden, cos, sin)
            else:
                hidden = self.block(i, hidden, cos, sin)
        del position_ids, cos, sin
        s.tr.where = "vision merger"
        m2 = v.spatial_merge_size**2
        x = self.rms_norm(hidden, "merger.ln_q")
        rows = self.n // m2
        act = o.gelu_tanh(self.linear(x, "merger.mlp.0", v.hidden_size * m2, v.hidden_size * m2))
        del x
        merged = self.linear(act, "merger.mlp.2", v.out_hidden_size, v.hidden_size * m2)
        del act
        ordered = s.new(rows * v.out_hidden_size, merged.dt)  # merged[reverse_indices, :]
        s.node("copy", (merged,), (ordered,))
        return hidden, ordered
