"""Qwen3-VL's vision tower trained on the step's images (:mod:`.vision_train`): the ops of
``Qwen3VLVisionModel`` (transformers 5.24, ``models/qwen3_vl/modeling_qwen3_vl.py``) under autograd, and the
deepstack features the text model adds to its first layers' image positions.

* ``Qwen3VLVisionPatchEmbed``: the Conv3d with bias over the flattened patches (under autocast a
  lower-precision copy of the pixels, saved for the weight's gradient);
* the learned positions: ``(pos_embed(interp_indices) * interp_weights[:, :, None]).sum(1)`` (the embedding's
  ``[n, 4, hidden]`` lookup, the product in fp32 saving the fp32 weights, the sum), cast to the hidden
  states' dtype and added; ``pos_embeds`` and the weights stay locals of the forward;
* the (h, w) position ids and the fp32 rotary tables (no gradient: :meth:`.vision_tower.Tower.rotary`);
* per ``Qwen3VLVisionBlock`` (a GradientCheckpointingLayer): ``norm1`` (nn.LayerNorm: saves its input and the
  fp32 mean and rstd), the attention as Qwen2.5-VL's (:class:`.vision_train_qwen.QwenTrainTower`, one SDPA
  call per image), the residual, ``norm2``, ``Qwen3VLVisionMLP`` (``linear_fc1``, gelu_pytorch_tanh,
  ``linear_fc2``), the residual; after each block of ``deepstack_visual_indexes`` its
  ``Qwen3VLVisionPatchMerger(use_postshuffle_norm=True)`` (the LayerNorm over ``hidden * merge^2`` rows);
* the final ``merger`` (LayerNorm over ``hidden``, then ``linear_fc1``, nn.GELU, ``linear_fc2``);
* ``Qwen3VLModel.forward``: ``image_embeds`` as Qwen2.5-VL's, then ``torch.cat`` of each deepstack feature
  (``deepstack_visual_embeds``, alive through the language model), and per text layer ``i < len(deepstack)``
  ``Qwen3VLTextModel._deepstack_process``: the features cast to the hidden states' dtype, ``clone``, the
  image rows gathered (``hidden[mask, :]``, whose backward scatters into a zero-filled full-size gradient),
  the sum, and ``index_put_`` into the clone (its backward: a full-size gradient for the clone and the image
  rows for the features).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from gpumem_gui.core.replay.memory import T
from gpumem_gui.core.replay.vision_train_lora import layer_norm
from gpumem_gui.core.replay.vision_train_qwen import PREFIX, QwenTrainTower
from gpumem_gui.core.spec.model import ModelSpec


def qwen3_tensors(spec: ModelSpec) -> list[tuple[str, tuple[int, ...]]]:
    """Qwen3VLVisionModel's parameters (names and shapes): the patch Conv3d with bias, the learned position
    table, per block two LayerNorms, qkv and proj with biases, linear_fc1/linear_fc2 with biases; the merger
    and one deepstack merger per ``deepstack_visual_indexes`` entry."""
    vs = spec.vision
    v = vs.tower if vs is not None else None
    assert vs is not None and v is not None
    h, i, p, m2 = v.hidden_size, v.intermediate_size, v.patch_size, v.spatial_merge_size**2
    out: list[tuple[str, tuple[int, ...]]] = [
        ("patch_embed.proj.weight", (h, v.in_channels, v.temporal_patch_size, p, p)),
        ("patch_embed.proj.bias", (h,)),
        ("pos_embed.weight", (vs.position_embedding_params // h, h)),  # num_position_embeddings x hidden
    ]
    for b in range(v.depth):
        pre = f"blocks.{b}."
        for norm in ("norm1", "norm2"):
            out += [(f"{pre}{norm}.weight", (h,)), (f"{pre}{norm}.bias", (h,))]
        out += [(f"{pre}attn.qkv.weight", (3 * h, h)), (f"{pre}attn.qkv.bias", (3 * h,))]
        out += [(f"{pre}attn.proj.weight", (h, h)), (f"{pre}attn.proj.bias", (h,))]
        out += [(f"{pre}mlp.linear_fc1.weight", (i, h)), (f"{pre}mlp.linear_fc1.bias", (i,))]
        out += [(f"{pre}mlp.linear_fc2.weight", (h, i)), (f"{pre}mlp.linear_fc2.bias", (h,))]
    mergers = ["merger."] + [f"deepstack_merger_list.{j}." for j in range(len(v.deepstack_visual_indexes))]
    for j, pre in enumerate(mergers):
        norm = h if j == 0 else h * m2  # use_postshuffle_norm for the deepstack mergers
        out += [(f"{pre}norm.weight", (norm,)), (f"{pre}norm.bias", (norm,))]
        out += [(f"{pre}linear_fc1.weight", (h * m2, h * m2)), (f"{pre}linear_fc1.bias", (h * m2,))]
        out += [(f"{pre}linear_fc2.weight", (v.out_hidden_size, h * m2))]
        out += [(f"{pre}linear_fc2.bias", (v.out_hidden_size,))]
    return [(PREFIX + name, shape) for name, shape in out]


class Qwen3TrainTower(QwenTrainTower):
    """The trainable Qwen3-VL tower on ``images`` images (``n``: rows of all their patches)."""

    def layer_norm(self, x: T, name: str, width: int) -> T:
        """nn.LayerNorm over rows of ``width`` (:func:`.vision_train_lora.layer_norm`)."""
        return layer_norm(self.s, x, self.w(f"{name}.weight"), self.w(f"{name}.bias"), width)

    def block(self, i: int, hidden: T, cos: T, sin: T) -> T:
        """Qwen3VLVisionBlock.forward (a method so checkpointing can recompute it)."""
        o, v = self.o, self.v
        h, n_i = v.hidden_size, v.intermediate_size
        self._pre = pre = f"blocks.{i}."
        self.s.tr.where = f"vision block {i}"
        hidden = o.add(hidden, self.attention(self.layer_norm(hidden, f"{pre}norm1", h), cos, sin))
        x = self.layer_norm(hidden, f"{pre}norm2", h)
        act = o.gelu_tanh(self.linear(x, f"{pre}mlp.linear_fc1", n_i, h))
        down = self.linear(act, f"{pre}mlp.linear_fc2", h, n_i)
        del act, x  # the MLP's argument until it returns
        return o.add(hidden, down)

    def merger(self, hidden: T, pre: str, postshuffle: bool) -> T:
        """Qwen3VLVisionPatchMerger: the LayerNorm (over ``hidden * merge^2`` after the shuffle's view when
        ``postshuffle``), ``linear_fc1``, nn.GELU, ``linear_fc2``."""
        o, v = self.o, self.v
        wide = v.hidden_size * v.spatial_merge_size**2
        x = self.layer_norm(hidden, f"{pre}norm", wide if postshuffle else v.hidden_size)
        act = o.gelu_tanh(self.linear(x, f"{pre}linear_fc1", wide, wide))  # nn.GELU saves its input too
        del x
        out = self.linear(act, f"{pre}linear_fc2", v.out_hidden_size, wide)
        del act
        return out

    def positions(self, conv: T) -> tuple[T, T, T]:
        """The interpolated learned positions added to the patch embedding: (hidden, pos_embeds, weights)."""
        o, s = self.o, self.s
        w = self.w("pos_embed.weight")
        emb = s.new(4 * self.nd, w.dt)  # pos_embed(interp_indices): [n, 4, hidden]
        s.node("copy", (w,), (emb,))  # embedding_dense_backward: a table-sized gradient
        weights = s.new(4 * self.n, "f32")  # interp_weights (counted once read, as the frozen tower's)
        weighted = o.mul(emb, weights, 4 * self.nd)  # fp32; saves the weights
        del emb
        pos_embeds = s.new(self.nd, weighted.dt)  # .sum(1): its backward expands the gradient (a view)
        s.node("pass", (weighted,), (pos_embeds,))
        del weighted
        low = s.cast(pos_embeds, conv.dt)  # pos_embeds.to(hidden_states.dtype)
        hidden = o.add(conv, low)
        del low
        return hidden, pos_embeds, weights

    def forward_deep(self, pixels: T, grad_ckpt: bool) -> tuple[T, T, list[T]]:
        """(last hidden state, merged features, deepstack features)."""
        s, v = self.s, self.v
        s.tr.where = "vision patch embedding"
        w = self.w("patch_embed.proj.weight")
        pixels = s.cast(pixels, w.dt)  # pixel_values.type(self.visual.dtype), .to(dtype=target_dtype)
        width = v.in_channels * v.temporal_patch_size * v.patch_size**2
        conv = self.linear(pixels, "patch_embed.proj", v.hidden_size, width)  # Conv3d as a matmul
        del pixels
        hidden, pos_embeds, weights = self.positions(conv)
        del conv
        s.tr.where = "vision rotary"
        position_ids = s.new(2 * self.n, "i64")
        cos, sin = self.frozen.rotary()
        deep = []
        for i in range(v.depth):
            if grad_ckpt:  # GradientCheckpointingLayer
                hidden = s.checkpoint(self.block, i, hidden, cos, sin)
            else:
                hidden = self.block(i, hidden, cos, sin)
            if i in v.deepstack_visual_indexes:
                s.tr.where = f"vision deepstack merger {len(deep)}"
                deep.append(self.merger(hidden, f"deepstack_merger_list.{len(deep)}.", True))
        s.tr.where = "vision merger"
        merged = self.merger(hidden, "merger.", False)
        del position_ids, cos, sin, pos_embeds, weights  # locals until Qwen3VLVisionModel.forward returns
        return hidden, merged, deep


def embed_deepstack(m: Any, deep: list[T], mask: T, local: list[T]) -> None:
    """Qwen3VLModel.forward after ``masked_scatter``: ``torch.cat`` of each deepstack feature
    (``deepstack_visual_embeds``) and the text model's hook adding them after its first layers. The hook holds
    the inner model's locals (``local``); :meth:`.model.CausalLM.forward_loss` drops it when the inner model
    returns (the lm_head and the loss run in Qwen3VLForConditionalGeneration.forward without them)."""
    cats = [m.o.clone(d) for d in deep]  # deepstack_visual_embeds = [torch.cat(feat, dim=0) ...]
    local += cats
    m.after_layer = partial(_deepstack_process, m, cats, mask, local)


def _deepstack_process(m: Any, cats: list[T], mask: T, local: list[T], i: int, hidden: T) -> T:
    """Qwen3VLTextModel._deepstack_process after text layer ``i`` (only the first ``len(cats)``; ``local``:
    held, not read)."""
    if i >= len(cats):
        return hidden
    o, s = m.o, m.s
    s.tr.where = f"deepstack {i}"
    feat = s.cast(cats[i], hidden.dt)  # visual_embeds.to(hidden_states.dtype)
    out = o.clone(hidden)  # hidden_states.clone()
    rows = feat.n
    picked = s.new(rows, out.dt)  # hidden_states[visual_pos_masks, :] (saves the mask, already alive)
    s.node("copy", (out,), (picked,))
    total = o.add(picked, feat)
    del picked, feat
    put = T(out.st, out.n, out.dt)  # hidden_states[visual_pos_masks, :] = local_this (index_put_ in place)
    s.node("copy", (out, total), (put,), (mask,))
    return put
