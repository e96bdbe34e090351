"""A trainable vision tower in a full fine-tune: the run's ``train_vision_tower`` (LLaMA-Factory
``freeze_vision_tower: false``, 2U1/Qwen-VL-Series-Finetune ``--freeze_vision_tower False``).

The tower's parameters are the model's own (one :class:`~.autograd.Param` each, so each gets its gradient and
its optimizer state), and its forward runs under autograd where ``Gemma3Model.forward`` (transformers 5.24,
``models/gemma3/modeling_gemma3.py``) and ``Qwen2_5_VLModel.forward`` run it: after the prompt's embedding,
before ``masked_scatter``, so the backward reaches the tower after the language model and before the
embedding (autograd runs the later node first). Gemma 3's SigLIP tower (``models/siglip/modeling_siglip.py``)
and projector, op by op:

* ``SiglipVisionEmbeddings``: the patch Conv2d on ``pixel_values.to(weight dtype)`` (under autocast a
  lower-precision copy of the pixels, saved for the weight's gradient), ``flatten(2).transpose(1, 2)`` (a
  view), plus ``position_embedding(position_ids)`` (the buffer's ids, a ``[1, patches, hidden]`` lookup);
* per ``SiglipEncoderLayer`` (a GradientCheckpointingLayer, checkpointed with the text layers):
  ``layer_norm1``, q/k/v (``view(...).transpose(1, 2)``), SDPA without mask, ``reshape`` (a view of the
  kernel's output), ``out_proj``, the residual, ``layer_norm2``, ``fc1``, ``gelu_pytorch_tanh``, ``fc2``, the
  residual;
* ``post_layernorm``; ``Gemma3MultiModalProjector``: ``transpose(1, 2).reshape(b, hidden, g, g)`` (a copy),
  ``AvgPool2d`` (saving its input), ``flatten(2).transpose(1, 2)``, ``Gemma3RMSNorm`` (``x * rsqrt(mean(x^2)
  + eps) * (1 + w)`` in fp32), ``matmul`` with ``mm_input_projection_weight``, ``type_as`` the tower's output;
* ``inputs_embeds.masked_scatter(special_image_mask, image_features)``: a new ``[b, q, hidden]``; its backward
  saves the mask only. The vision outputs (``mm_encoder_outputs``: the last hidden state and the features)
  are locals of the model's forward until it returns.

Qwen2.5-VL's tower: :mod:`.vision_train_qwen`; Qwen3-VL's (and its deepstack features in the text model):
:mod:`.vision_train_qwen3`; Mistral 3's Pixtral tower and projector: :mod:`.vision_train_pixtral`; Llama 4's
tower, pixel-shuffle adapter and projector: :mod:`.vision_train_llama4`. Any other tower:
:func:`check_trainable` refuses in one line.

LoRA: the targets reach the tower as the run's ``lora_vision_tower`` says (:func:`tower_linears`): PEFT 0.21
resolves them over the whole model (``_maybe_include_all_linear_layers`` excludes only the output embedding,
so ``all-linear`` adapts every ``nn.Linear`` of the tower and projector; the patch Conv2d / Conv3d and the
position tables are no ``nn.Linear``; Llama 4's patch embedding is one, ``Llama4UnfoldConvolution.linear``),
LLaMA-Factory leaves the projector, and while ``freeze_vision_tower`` holds the tower, out. An adapted
tower runs here under autograd with its base weights frozen (adapters: :mod:`.vision_train_lora`), and so
does a frozen one that ``enable_input_require_grads`` hooks (LoRA with checkpointing); otherwise it runs
without autograd (:func:`.vision.train_prefix`). A text-only step leaves the adapted tower unused: its
adapters are trainable parameters that get no gradient (:func:`.vision_train_lora.unused_adapters`).
"""

from __future__ import annotations

from functools import lru_cache, partial
from typing import Any

from gpumem_gui.core.errors import GpumemInputError
from gpumem_gui.core.replay import adapters
from gpumem_gui.core.replay.memory import DT_BYTES, T
from gpumem_gui.core.replay.vision_tower import REGION
from gpumem_gui.core.replay.vision_train_llama4 import embed_llama4, llama4_tensors
from gpumem_gui.core.replay.vision_train_lora import (
    INPUT_EMBEDDINGS,
    adapted,
    input_hook,
    layer_norm,
    unused_adapters,
)
from gpumem_gui.core.replay.vision_train_pixtral import embed_pixtral, pixtral_tensors
from gpumem_gui.core.replay.vision_train_qwen import QwenTrainTower, qwen_tensors
from gpumem_gui.core.replay.vision_train_qwen3 import Qwen3TrainTower, embed_deepstack, qwen3_tensors
from gpumem_gui.core.spec.model import ModelSpec
from gpumem_gui.core.spec.params import Tensor
from gpumem_gui.core.spec.vision import VisionTower, image_grid

_P = "vision_tower."


def check_trainable(spec: ModelSpec, method: str) -> None:
    """One-line error where a trainable tower is not modelled: adapters, or a tower of another kind."""
    tower = spec.vision.tower if spec.vision is not None else None
    if method != "full":
        raise GpumemInputError(
            "train_vision_tower unfreezes the tower in a full fine-tune; with LoRA the adapters reach the "
            "tower as lora_vision_tower says (targets, tower or excluded): turn train_vision_tower off",
            field="train_vision_tower",
        )
    if tower is None or tower.kind not in TRAINABLE:
        raise GpumemInputError(
            "a trainable vision tower is modelled for Gemma 3's SigLIP, Qwen2.5-VL's, Qwen3-VL's, Mistral "
            "3's Pixtral and Llama 4's towers only; turn train_vision_tower off (the tower frozen)",
            field="train_vision_tower",
        )


def tower_tensors(spec: ModelSpec) -> list[tuple[str, tuple[int, ...]]]:
    """The trainable tower's and projector's parameters (names and shapes)."""
    return _TENSORS[_tower(spec).kind](spec)


def _siglip_tensors(spec: ModelSpec) -> list[tuple[str, tuple[int, ...]]]:
    """SiglipVisionModel's and Gemma3MultiModalProjector's parameters (names and shapes)."""
    v = _tower(spec)
    h, i, p = v.hidden_size, v.intermediate_size, v.patch_size
    out = [
        ("embeddings.patch_embedding.weight", (h, v.in_channels, p, p)),
        ("embeddings.patch_embedding.bias", (h,)),
        ("embeddings.position_embedding.weight", ((v.fixed_side // p) ** 2, h)),
    ]
    for layer in range(v.depth):
        pre = f"encoder.layers.{layer}."
        out += [(f"{pre}layer_norm1.weight", (h,)), (f"{pre}layer_norm1.bias", (h,))]
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            out += [(f"{pre}self_attn.{proj}.weight", (h, h)), (f"{pre}self_attn.{proj}.bias", (h,))]
        out += [(f"{pre}layer_norm2.weight", (h,)), (f"{pre}layer_norm2.bias", (h,))]
        out += [(f"{pre}mlp.fc1.weight", (i, h)), (f"{pre}mlp.fc1.bias", (i,))]
        out += [(f"{pre}mlp.fc2.weight", (h, i)), (f"{pre}mlp.fc2.bias", (h,))]
    out += [("post_layernorm.weight", (h,)), ("post_layernorm.bias", (h,))]
    out += [("mm_soft_emb_norm.weight", (h,)), ("mm_input_projection_weight", (h, v.out_hidden_size))]
    return [(_P + name, shape) for name, shape in out]


# the vision towers whose trainable forward is replayed (VisionTower.kind) and their parameters
_TENSORS = {
    "siglip": _siglip_tensors,
    "qwen2_5_vl": qwen_tensors,
    "qwen3_vl": qwen3_tensors,
    "pixtral": pixtral_tensors,
    "llama4": llama4_tensors,
}
TRAINABLE = tuple(_TENSORS)


# lora_vision_tower: how far the LoRA targets reach (run_adapters.py LoraVisionTower)
TOWER_TARGETS = ("targets", "tower", "excluded")
# the projector's modules per tower kind, as LLaMA-Factory names them (model/model_utils/visual.py
# _register_composite_model projector_key: "multi_modal_projector" for gemma3, mistral3 and llama4 (whose
# vision_model_keys ["vision_model"] keep the pixel-shuffle vision_adapter in the tower), "visual.merger"
# for qwen2_5_vl and qwen3_vl, whose deepstack mergers are vision_model_keys), here by our tensor names
_PROJECTOR = {
    "siglip": "vision_tower.mm_",
    "pixtral": "multi_modal_projector.",
    "qwen2_5_vl": "visual.merger.",
    "qwen3_vl": "visual.merger.",
    "llama4": "multi_modal_projector.",
}
# 2-D tower weights that are nn.Embedding tables, not nn.Linear (SiglipVisionEmbeddings.position_embedding,
# Qwen3VLVisionModel.pos_embed): all-linear leaves them out
_EMBEDDINGS = ("position_embedding", "pos_embed")


def adapts_tower(spec: ModelSpec) -> bool:
    """Whether the model's tower is replayed with adapters (a LoRA run's lora_vision_tower applies): every
    trainable tower (traced: tests/reference/vision/lora_tower_points.json)."""
    tower = spec.vision.tower if spec.vision is not None else None
    return tower is not None and tower.kind in TRAINABLE


@lru_cache(maxsize=64)
def tower_linears(spec: ModelSpec, reach: str) -> tuple[Tensor, ...]:
    """The tower's and projector's ``nn.Linear`` weights the LoRA targets are resolved over (``reach``: the
    run's lora_vision_tower), by their module paths under ``model.`` as transformers 5.24 names them
    (``model.visual.blocks.0.attn.qkv``, ``model.vision_tower.encoder.layers.0.self_attn.q_proj``)."""
    if reach == "excluded" or not adapts_tower(spec):
        return ()
    kind = _tower(spec).kind
    projector = _PROJECTOR[kind]
    return tuple(
        Tensor(name, shape, "vision")
        for name, shape in tower_tensors(spec)
        if name.endswith(".weight")
        and len(shape) == 2
        and name.rsplit(".", 2)[-2] not in _EMBEDDINGS
        and not (reach == "tower" and name.startswith(projector))
    )


def under_autograd(m: Any) -> bool:
    """Whether the tower runs under autograd on this step's images: trained (full fine-tuning), adapted
    (LoRA targets among its linears), or hooked by ``enable_input_require_grads`` (LoRA with checkpointing,
    :data:`.vision_train_lora.INPUT_EMBEDDINGS`)."""
    cfg, spec = m.cfg, m.spec
    if not cfg.images or not cfg.embedding or spec.vision is None or spec.vision.tower is None:
        return False
    if cfg.train_tower:  # check_trainable: a tower of TRAINABLE
        return True
    if cfg.method == "full" or not adapts_tower(spec):
        return False
    hooked = cfg.grad_ckpt and _tower(spec).kind in INPUT_EMBEDDINGS
    return hooked or any(t.name in m.lora_names for t in tower_linears(spec, cfg.tower_targets))


def _tower(spec: ModelSpec) -> VisionTower:
    tower = spec.vision.tower if spec.vision is not None else None
    assert tower is not None
    return tower


def add_params(m: Any) -> None:
    """The vision tower and projector's parameters on the first stage: one per tensor when the tower trains
    on this step's images, else one block that the text forward never uses (a text step: no gradient, so
    torch's optimizers keep no state for it; or the frozen tower)."""
    cfg, spec, s = m.cfg, m.spec, m.s
    if spec.vision is None or not cfg.embedding:
        return
    if not under_autograd(m):
        n = spec.vision.params
        full = round(n * DT_BYTES[cfg.param_dt])
        # with images the tower is frozen (requires_grad off, LLaMA-Factory's freeze_vision_tower): not even
        # flat-buffer frameworks (DeepSpeed, FSDP1) give it gradient or state room; text only, it trains but
        # gets no gradient
        trains = m._trainable(None) and not cfg.images
        m.p["vision"] = s.param("vision", n, cfg.param_dt, trains, full, None)
        m.unused.add("vision")
        unused_adapters(m, tower_linears(spec, cfg.tower_targets))  # a text step's adapters (LoRA)
        return
    for name, shape in tower_tensors(spec):  # frozen with adapters (LoRA): PEFT's base layers
        n = 1
        for d in shape:
            n *= d
        m.shape[name] = shape
        m.p[name] = s.param(name, n, cfg.param_dt, cfg.train_tower, round(n * DT_BYTES[cfg.param_dt]), None)
        if name in m.lora_names:
            adapters.add_lora(m, Tensor(name, shape, "vision"))


class _Siglip:
    """The trainable SigLIP tower's ops (``n``: the rows of all images' patches)."""

    def __init__(self, m: Any, images: int) -> None:
        self.m, self.o, self.s = m, m.o, m.s
        self.v = v = _tower(m.spec)
        self.g = image_grid(v, v.fixed_side)
        self.images = images
        self.n = images * self.g.patches
        self.nd = self.n * v.hidden_size

    def w(self, name: str) -> T:
        return self.m.p[_P + name].tensor

    def linear(self, x: T, name: str, n_out: int, n_in: int) -> T:
        out = self.o.linear(x, self.w(f"{name}.weight"), self.w(f"{name}.bias"), n_out, n_in)
        return adapted(self.m, x, out, _P + name, n_out, n_in)

    def layer_norm(self, x: T, name: str) -> T:
        """native_layer_norm over the tower's hidden size (:func:`.vision_train_lora.layer_norm`)."""
        return layer_norm(self.s, x, self.w(f"{name}.weight"), self.w(f"{name}.bias"), self.v.hidden_size)

    def layer(self, i: int, hidden: T) -> T:
        """SiglipEncoderLayer.forward (a method so checkpointing can recompute it)."""
        o, s, v = self.o, self.s, self.v
        h, pre = v.hidden_size, f"encoder.layers.{i}."
        s.tr.where = f"vision block {i}"
        # the norm's output is the layer's local (hidden_states) until the attention returns: alive there
        # even where no linear saves it (a frozen tower's base layers)
        normed = self.layer_norm(hidden, f"{pre}layer_norm1")
        q, k, vv = (
            o.view(self.linear(normed, f"{pre}self_attn.{p}", h, h), copy_grad=True)
            for p in ("q_proj", "k_proj", "v_proj")
        )
        # SDPA's CPU flash kernel (no mask): its output, laid out so reshape is a view, and fp32 log-sum-exp
        out = s.new(self.nd, q.dt)
        lse = s.new(self.n * v.num_heads, "f32")
        s.node("multi", (q, k, vv), (out, lse), (q, k, vv, out, lse))
        del lse, q, k, vv
        attn = self.linear(out, f"{pre}self_attn.out_proj", h, h)
        del out, normed
        hidden = o.add(hidden, attn)
        del attn
        normed = self.layer_norm(hidden, f"{pre}layer_norm2")
        act = o.gelu_tanh(self.linear(normed, f"{pre}mlp.fc1", v.intermediate_size, h))
        # the norm's output is the layer's local until the MLP returns, but freed here before fc2: with a
        # frozen tower under checkpointing the trace's backward (the step's peak) has it dead in the
        # recomputation, its forward alive (-2.8 % on gemma3-vision-tiny, tests/test_vision_lora.py)
        del normed
        mlp = self.linear(act, f"{pre}mlp.fc2", h, v.intermediate_size)
        del act
        return o.add(hidden, mlp)

    def embeddings(self, pixels: T) -> T:
        o, s, v = self.o, self.s, self.v
        s.tr.where = "vision patch embedding"
        patch = v.in_channels * v.patch_size**2
        pixels = s.cast(pixels, self.w("embeddings.patch_embedding.weight").dt)  # pixel_values.to(dtype)
        conv = self.linear(pixels, "embeddings.patch_embedding", v.hidden_size, patch)  # Conv2d as a matmul
        conv = input_hook(self.m, "siglip" in INPUT_EMBEDDINGS, conv)
        w = self.w("embeddings.position_embedding.weight")
        pos = s.new(self.g.patches * v.hidden_size, w.dt)  # position_embedding(position_ids)
        s.node("copy", (w,), (pos,))
        return o.add(conv, pos, self.nd)

    def projector(self, last: T) -> T:
        """Gemma3MultiModalProjector, ``type_as`` the tower's output."""
        o, s, v = self.o, self.s, self.v
        s.tr.where = "vision projector"
        square = o.clone(last)  # transpose(1, 2).reshape(b, hidden, g, g): a copy
        rows = self.images * self.g.features
        pooled = s.new(rows * v.hidden_size, square.dt)  # AvgPool2d saves its input
        s.node("copy", (square,), (pooled,), (square,))
        del square
        xf = s.cast(pooled, "f32")  # Gemma3RMSNorm: x.float(), x * rsqrt(mean(x^2) + eps), * (1 + w.float())
        normed = o.mul(xf, o.rsqrt(o.add(o.mean_last(o.pow2(xf), v.hidden_size), None)))
        del xf, pooled
        w1 = o.add(s.cast(self.w("mm_soft_emb_norm.weight"), "f32"), None)
        normed = o.mul(normed, w1, normed.n)
        del w1
        w = self.w("mm_input_projection_weight")
        projected = o.linear(normed, w, None, v.out_hidden_size, v.hidden_size)  # torch.matmul
        del normed
        return s.cast(projected, last.dt)


def inner_locals(m: Any, features: T, hidden: T, local: list[T], video: bool) -> T:
    """``image_embeds = torch.cat(pooler_output, dim=0).to(inputs_embeds.dtype)`` (Qwen3VLModel.forward;
    Mistral3Model.forward's ``image_features``) and Qwen's unused video mask (``_``): locals of the inner
    model's forward, gone when it returns, before the LM head (``local``; held by ``m.after_layer``, which
    :meth:`.model.CausalLM.forward_loss` drops then)."""
    cat = m.o.clone(features)
    image_embeds = m.s.cast(cat, hidden.dt)
    del cat
    local += [image_embeds, *([m.s.new(m.cfg.batch * m.cfg.q, "bool")] if video else [])]
    return image_embeds


def _holding(local: list[T], i: int, hidden: T) -> T:
    """An after-layer hook that changes nothing and holds the inner model's locals (``local``)."""
    return hidden


def _siglip_forward(m: Any, images: int, pixels: T) -> tuple[T, T]:
    """Gemma 3: the SigLIP tower (checkpointed with the text layers), post_layernorm and the projector."""
    s = m.s
    tw = _Siglip(m, images)
    x = tw.embeddings(pixels)
    for i in range(tw.v.depth):
        x = s.checkpoint(tw.layer, i, x) if m.cfg.grad_ckpt else tw.layer(i, x)
    s.tr.where = "vision post_layernorm"
    last = tw.layer_norm(x, "post_layernorm")
    del x
    return last, tw.projector(last)


def embed_images(m: Any, hidden: T, keep: list[T], pixels: T, held: list[Any]) -> tuple[T, list[T]]:
    """The model's forward between the prompt's embedding and the language model: the tower and projector on
    ``pixels`` under autograd (Gemma 3's SigLIP: ``_Siglip``; Qwen2.5-VL: :mod:`.vision_train_qwen`;
    Qwen3-VL: :mod:`.vision_train_qwen3`; Mistral 3: :mod:`.vision_train_pixtral`), the placeholder masks and
    ``masked_scatter``; ``held`` receives what the model's forward keeps until it returns (the vision
    outputs; Qwen2.5-VL's ``image_embeds`` and unused video mask)."""
    cfg, s = m.cfg, m.s
    prev, s.region = s.region, REGION
    images = cfg.batch * cfg.images
    kind, deep, local = _tower(m.spec).kind, [], []
    if kind == "qwen2_5_vl":
        last, features = QwenTrainTower(m, images, cfg.image_size).forward(pixels, cfg.grad_ckpt)
        held += [last, features]
        s.tr.where = "vision masked_scatter"
        # image_embeds = torch.cat(pooler_output, dim=0), in the tower's dtype as the frozen tower's replay
        # holds it (vision.train_prefix; its .to(inputs_embeds.dtype) copy is not counted there either)
        features = m.o.clone(features)
        held += [features, s.new(cfg.batch * cfg.q, "bool")]  # image_embeds; the video mask (``_``)
    elif kind == "llama4":  # Llama4ForConditionalGeneration: the projected features .to(inputs_embeds.dtype)
        last, projected = embed_llama4(m, images, pixels)
        held.append(last)  # mm_encoder_outputs
        features = s.cast(projected, hidden.dt)
        del projected
        local.append(features)
    elif kind in ("qwen3_vl", "pixtral"):
        if kind == "qwen3_vl":
            tower = Qwen3TrainTower(m, images, cfg.image_size)
            last, features, deep = tower.forward_deep(pixels, cfg.grad_ckpt)
        else:
            last, features = embed_pixtral(m, images, pixels)
        held += [last, features, *deep]  # mm_encoder_outputs (split views of the features)
        s.tr.where = "vision masked_scatter"
        features = inner_locals(m, features, hidden, local, video=kind == "qwen3_vl")
    else:
        last, features = _siglip_forward(m, images, pixels)
        held += [last, features]
    s.tr.where = "vision masked_scatter"
    # PEFT with checkpointing: the text embedding's output is a leaf too (enable_input_require_grads), which
    # the graph holds through masked_scatter (not the checkpoint: it keeps the scattered embeddings)
    hidden = input_hook(m, True, hidden)
    mask = s.new(cfg.batch * cfg.q, "bool")  # input_ids == image_token_id, expanded as a view
    s.region = "hidden_states"
    scattered = s.new(hidden.n, hidden.dt)  # inputs_embeds.masked_scatter(mask, image_features)
    s.node("copy", (hidden, features), (scattered,), (mask,))
    s.region = REGION
    if deep:  # Qwen3-VL: the deepstack features, added after the first text layers
        embed_deepstack(m, deep, mask, local)
    elif local:
        m.after_layer = partial(_holding, local)
    s.region = prev
    return scattered, [scattered if k is hidden else k for k in keep]
