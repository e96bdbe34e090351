"""Llama 4's vision tower trained on the step's images (:mod:`.vision_train`): the ops of
``Llama4VisionModel`` and ``Llama4MultiModalProjector`` (transformers 5.24,
``models/llama4/modeling_llama4.py``) under autograd, trained (full fine-tuning) or frozen with PEFT's
adapters on its linears (LoRA: :func:`.vision_train_lora.adapted`, the patch embedding's ``linear``
included; with checkpointing ``enable_input_require_grads`` hooks the patch embedding's output,
:func:`.vision_train_lora.input_hook`); the frozen tower's ops without autograd: :mod:`.vision_llama4`.

* ``Llama4UnfoldConvolution``: ``nn.Unfold`` of the bf16 pixels (a new tensor), ``permute`` (a view) and the
  linear, whose matmul copies the permuted patches contiguous and saves that copy for the weight's gradient;
* ``torch.cat`` with the class embedding (expanded, a view), ``positional_embedding_vlm.to(dtype)`` (a copy
  under autocast), the sum, ``layernorm_pre``;
* per ``Llama4VisionEncoderLayer`` (a GradientCheckpointingLayer): LayerNorm, q/k/v with biases (views),
  ``vision_apply_rotary_emb`` (fp32 copies of q and k, complex products with ``freqs_ci``, cast back), SDPA
  over each tile, ``o_proj``, the residual; LayerNorm, ``fc1``, GELU, ``fc2``, the residual;
* ``layernorm_post``, the class token sliced off (a view), ``pixel_shuffle`` (two permuted contiguous copies),
  ``Llama4VisionMLP2`` (``fc1``, GELU, ``fc2``, GELU; ``projector_dropout`` 0: no op) and
  ``multi_modal_projector.linear_1`` on the flattened features.
"""

from __future__ import annotations

from typing import Any

from gpumem_gui.core.replay.memory import T, promote
from gpumem_gui.core.replay.vision_train_lora import INPUT_EMBEDDINGS, adapted, input_hook, layer_norm
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.vision import image_grid

_V, _P = "vision_model.", "multi_modal_projector."


def llama4_tensors(spec: ModelSpec) -> list[tuple[str, tuple[int, ...]]]:
    """Llama4VisionModel's and the projector's parameters (names and shapes)."""
    vs = spec.vision
    assert vs is not None and vs.tower is not None
    v = vs.tower
    h, i, p, a = v.hidden_size, v.intermediate_size, v.patch_size, v.adapter_size
    rows = (v.tile_side // p) ** 2 + 1  # the tile's patches and the class token
    tower: list[tuple[str, tuple[int, ...]]] = [
        ("patch_embedding.linear.weight", (h, v.in_channels * p * p)),
        ("class_embedding", (h,)),
        ("positional_embedding_vlm", (rows, h)),
        ("layernorm_pre.weight", (h,)),
        ("layernorm_pre.bias", (h,)),
    ]
    for layer in range(v.depth):
        pre = f"model.layers.{layer}."
        for norm in ("input_layernorm", "post_attention_layernorm"):
            tower += [(f"{pre}{norm}.weight", (h,)), (f"{pre}{norm}.bias", (h,))]
        for x in "qkvo":
            tower += [(f"{pre}self_attn.{x}_proj.weight", (h, h)), (f"{pre}self_attn.{x}_proj.bias", (h,))]
        tower += [(f"{pre}mlp.fc1.weight", (i, h)), (f"{pre}mlp.fc1.bias", (i,))]
        tower += [(f"{pre}mlp.fc2.weight", (h, i)), (f"{pre}mlp.fc2.bias", (h,))]
    tower += [("layernorm_post.weight", (h,)), ("layernorm_post.bias", (h,))]
    tower += [("vision_adapter.mlp.fc1.weight", (a, i)), ("vision_adapter.mlp.fc2.weight", (a, a))]
    proj = [("linear_1.weight", (v.out_hidden_size, a))]
    return [(_V + n, s) for n, s in tower] + [(_P + n, s) for n, s in proj]


class Llama4TrainTower:
    """The trainable Llama 4 tower on ``images`` images (``n``: rows of all their tiles, class tokens
    included)."""

    def __init__(self, m: Any, images: int, image_size: int) -> None:
        self.m, self.o, self.s = m, m.o, m.s
        self.v = v = m.spec.vision.tower
        self.g = g = image_grid(v, image_size)
        self.tiles = images * g.tiles
        self.n = self.tiles * (g.grid * g.grid + 1)
        self.nd = self.n * v.hidden_size

    def w(self, name: str) -> T:
        return self.m.p[name].tensor

    def linear(self, x: T, name: str, n_out: int, n_in: int) -> T:
        """nn.Linear ``name`` (its bias when it has one), or PEFT's LoRA Linear around it."""
        bias = self.m.p.get(f"{name}.bias")
        out = self.o.linear(x, self.w(f"{name}.weight"), bias.tensor if bias else None, n_out, n_in)
        return adapted(self.m, x, out, name, n_out, n_in)

    def layer_norm(self, x: T, name: str) -> T:
        """native_layer_norm over the tower's hidden size (:func:`.vision_train_lora.layer_norm`)."""
        return layer_norm(self.s, x, self.w(f"{name}.weight"), self.w(f"{name}.bias"), self.v.hidden_size)

    def rotate(self, x: T, freqs: T) -> T:
        """One of q/k in vision_apply_rotary_emb: ``x.float()``, the complex product with ``freqs_ci`` (which
        it saves, a buffer), ``type_as`` back."""
        o, s = self.o, self.s
        xf = s.cast(x, "f32")
        prod = o.mul(xf, freqs, xf.n)
        del xf
        return s.cast(prod, x.dt)

    def layer(self, i: int, hidden: T, freqs: T) -> T:
        """Llama4VisionEncoderLayer.forward (a method so checkpointing can recompute it)."""
        o, s, v = self.o, self.s, self.v
        h, pre = v.hidden_size, f"{_V}model.layers.{i}."
        s.tr.where = f"vision block {i}"
        normed = self.layer_norm(hidden, f"{pre}input_layernorm")
        q, k, vv = (self.linear(normed, f"{pre}self_attn.{p}_proj", h, h) for p in "qkv")
        q, k = self.rotate(q, freqs), self.rotate(k, freqs)
        out = s.new(self.nd, q.dt)  # SDPA's CPU flash kernel over each tile, laid out so reshape is a view
        lse = s.new(self.n * v.num_heads, "f32")
        s.node("multi", (q, k, vv), (out, lse), (q, k, vv, out, lse))
        del lse, q, k, vv
        attn = self.linear(out, f"{pre}self_attn.o_proj", h, h)
        del out, normed
        hidden = o.add(hidden, attn)
        del attn
        normed = self.layer_norm(hidden, f"{pre}post_attention_layernorm")
        act = o.gelu_tanh(self.linear(normed, f"{pre}mlp.fc1", v.intermediate_size, h))  # nn.GELU saves x
        del normed
        mlp = self.linear(act, f"{pre}mlp.fc2", h, v.intermediate_size)
        del act
        return o.add(hidden, mlp)

    def embeddings(self, pixels: T) -> T:
        o, s, v = self.o, self.s, self.v
        s.tr.where = "vision patch embedding"
        width = v.in_channels * v.patch_size**2
        unfolded = o.clone(pixels)  # nn.Unfold: [tiles, C p p, patches]
        flat = o.clone(unfolded)  # the matmul's contiguous copy of the permuted patches
        del unfolded
        patches = self.linear(flat, f"{_V}patch_embedding.linear", v.hidden_size, width)
        del flat
        # get_input_embeddings is the patch embedding: enable_input_require_grads hooks its output
        patches = input_hook(self.m, "llama4" in INPUT_EMBEDDINGS, patches)
        cls = self.w(f"{_V}class_embedding")
        # torch.cat([patches, class_embedding.expand(...)], dim=1): promoted to the class embedding's dtype
        # (fp32 master weights under autocast: the residual stream is fp32 from here)
        cat = s.new(self.nd, promote(patches.dt, cls.dt))
        s.node("pass", (patches, cls), (cat,))
        del patches
        pos = s.cast(self.w(f"{_V}positional_embedding_vlm"), cat.dt)  # .to(dtype=hidden_state.dtype)
        summed = o.add(cat, pos, self.nd)
        del cat, pos
        return self.layer_norm(summed, f"{_V}layernorm_pre")

    def adapter(self, hidden: T) -> T:
        """layernorm_post, the class token sliced off, pixel_shuffle and Llama4VisionMLP2."""
        o, s, v = self.o, self.s, self.v
        s.tr.where = "vision adapter"
        post = self.layer_norm(hidden, f"{_V}layernorm_post")
        rows = self.tiles * self.g.grid * self.g.grid
        first = s.new(rows * v.hidden_size, post.dt)  # permute(0, 2, 1, 3).contiguous() of the slice
        s.node("copy", (post,), (first,))
        shuffled = o.clone(first)  # the second permute(...).contiguous()
        del first
        feats = self.tiles * self.g.grid * self.g.grid // v.spatial_merge_size**2
        # Llama4VisionMLP2.fc1 takes intermediate_size inputs: the shuffled rows' hidden / ratio^2
        wide = v.intermediate_size
        act = o.gelu_tanh(self.linear(shuffled, f"{_V}vision_adapter.mlp.fc1", v.adapter_size, wide))
        del shuffled
        out = o.gelu_tanh(self.linear(act, f"{_V}vision_adapter.mlp.fc2", v.adapter_size, v.adapter_size))
        del act
        assert out.n == feats * v.adapter_size
        return out

    def forward(self, pixels: T, grad_ckpt: bool) -> tuple[T, T]:
        """(the vision model's last_hidden_state, the projected features)."""
        s, v = self.s, self.v
        hidden = embeds = self.embeddings(pixels)
        freqs = s.new(0, "f32")  # freqs_ci, a buffer counted with the model
        for i in range(v.depth):
            # GradientCheckpointingLayer
            hidden = s.checkpoint(self.layer, i, hidden, freqs) if grad_ckpt else self.layer(i, hidden, freqs)
        del embeds
        last = self.adapter(hidden)
        del hidden
        s.tr.where = "vision projector"
        projected = self.linear(last, f"{_P}linear_1", v.out_hidden_size, v.adapter_size)
        return last, projected


def embed_llama4(m: Any, images: int, pixels: T) -> tuple[T, T]:
    """The tower, adapter and projector: (the vision model's last hidden state, the projected features)."""
    return Llama4TrainTower(m, images, m.cfg.image_size).forward(pixels, m.cfg.grad_ckpt)
