"""ModernBERT's encoder forward on symbolic tensors (transformers 5.24
``models/modernbert/modeling_modernbert.py``), for :class:`~gpumem_gui.core.replay.encoder.EncoderModel`:

* ``ModernBertModel.forward``: ``position_ids = arange(seq)[None]``; ``ModernBertEmbeddings`` (lookup,
  LayerNorm, dropout), whose output ``mask_kwargs`` holds to the end; one mask per layer type
  (``create_bidirectional_mask``: none without padding; ``create_bidirectional_sliding_window_mask``: none
  while the sequence is shorter than the half-window, else a boolean [1, 1, q, kv] expanded over the batch,
  which eager turns into a [b, 1, q, kv] float mask); one rotary table per layer type
  (``ModernBertRotaryEmbedding``: fp32 freqs, cat, cos, sin, cast to the activations' dtype), all held
  through the layers; the final norm.
* ``ModernBertEncoderLayer``: ``attn_norm`` (an Identity in layer 0), ``Wqkv`` unbound into q, k, v views,
  ``apply_rotary_pos_emb`` on fp32 copies (``q.float() * cos + rotate_half(q.float()) * sin``, cast back),
  the shared attention kernel, ``Wo`` (``out_drop``), the residual add, ``mlp_norm``, ``Wi`` chunked into
  input and gate, ``Wo(drop(act(input) * gate))``, the residual add.
* The heads: ``ModernBertPredictionHead`` (dense, act, LayerNorm) after cls or mean pooling, dropout,
  ``classifier``; or after every token, the decoder (masked LM, whose loss upcasts the logits:
  ``ForMaskedLMLoss``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from gpumem_gui.core.replay import attention, mlp
from gpumem_gui.core.replay.memory import T

if TYPE_CHECKING:
    from gpumem_gui.core.replay.context import EncoderLike as EncoderModel


def _rotary(m: EncoderModel, dt: str) -> tuple[T, T]:
    """ModernBertRotaryEmbedding.forward for one layer type: [1, q, d] tables in the activations' dtype."""
    s, q, d = m.s, m.cfg.q, m.spec.head_dim
    pos = s.new(q, "f32")  # position_ids[..., None].float()
    freqs = s.new(q * d // 2, "f32")
    del pos
    emb = s.new(q * d, "f32")  # cat((freqs, freqs), -1)
    raw = s.new(q * d, "f32")
    cos = s.new(q * d, "f32")  # emb.cos() * attention_scaling
    del raw
    raw = s.new(q * d, "f32")
    sin = s.new(q * d, "f32")
    del raw
    out = s.cast(cos, dt), s.cast(sin, dt)
    del freqs, emb, cos, sin
    return out


def _masks(m: EncoderModel, dt: str) -> dict[str, T]:
    """The sliding layers' mask once the keys reach the half-window (see the module docstring); full layers
    get none."""
    s, cfg, spec = m.s, m.cfg, m.spec
    window = spec.sliding_window
    if "sliding_attention" not in spec.resolved_layer_types or window is None or cfg.q < window:
        return {}
    if cfg.attn == "flash":  # flash_attention_mask: no mask, the window goes to the kernel
        return {}
    if cfg.attn == "eager":  # torch.where(mask, 0, min_dtype) over the expanded mask
        return {"sliding_attention": s.new(cfg.batch * cfg.q * cfg.q, dt)}
    diff = s.new(cfg.q * cfg.q, "i64")  # q_idx - kv_idx
    dist = s.new(cfg.q * cfg.q, "i64")  # abs()
    del diff
    near = s.new(cfg.q * cfg.q, "bool")  # <= sliding_window
    del dist
    both = s.new(cfg.q * cfg.q, "bool")  # and_masks: True & overlay
    del near
    mask = s.new(cfg.q * cfg.q, "bool")  # & bidirectional (q_idx >= 0)
    del both
    return {"sliding_attention": T(mask.st, cfg.batch * cfg.q * cfg.q, "bool")}  # .expand(batch, ...)


def _fp32_rope(m: EncoderModel, x: T, cos: T, sin: T) -> T:
    """``(x.float() * cos) + (rotate_half(x.float()) * sin)``: fp32 copies and products, an fp32 result."""
    o, s = m.o, m.s
    a = o.mul(s.cast(x, "f32"), cos, x.n)
    xf = s.cast(x, "f32")
    rot = o.cat(o.neg(o.slice_half(xf)), o.slice_half(xf))
    del xf
    b = o.mul(rot, sin, x.n)
    del rot
    return o.add(a, b)


def layer(m: EncoderModel, i: int, hidden: T, cos: T, sin: T, mask: T | None) -> T:
    """ModernBertEncoderLayer.forward (see the module docstring)."""
    o, s, spec, cfg = m.o, m.s, m.spec, m.cfg
    t, h, a, d = cfg.tokens, spec.hidden_size, spec.num_attention_heads, spec.head_dim
    s.tr.where = f"layer {i} attention"
    normed = m.region_norm(hidden, f"layers.{i}.norm0") if i else hidden
    s.region = "attention"
    qkv = m.linear(normed, f"layers.{i}.self_attn.qkv_proj")
    q, k, v = T(qkv.st, t * h, qkv.dt), T(qkv.st, t * h, qkv.dt), T(qkv.st, t * h, qkv.dt)
    s.node("split", (qkv,), (q, k, v))  # view(..., 3, heads, d).unbind(-3), transposes
    q32 = _fp32_rope(m, q, cos, sin)
    k32 = _fp32_rope(m, k, cos, sin)
    q, k = s.cast(q32, q.dt), s.cast(k32, k.dt)
    del q32, k32
    if cfg.attn == "eager" and s.grad_enabled:
        # torch.matmul(attn_weights, value) reshapes the strided value view of Wqkv's output into a copy,
        # which it saves: Wqkv's output is not kept for backward (q and k are copied the same way, same sizes;
        # with gradients off the copy comes after the softmax, below the peak)
        v = o.clone(v)
    out, _weights = attention.kernel(m, q, k, v, mask, a, a, d, d)
    del q, k, v, qkv, _weights
    attn = o.dropout(m.linear(out, f"layers.{i}.self_attn.o_proj"), cfg.attn_dropout)
    del out, normed
    s.region = "hidden_states"
    hidden = o.add(hidden, attn)
    del attn
    s.tr.where = f"layer {i} MLP"
    x = m.region_norm(hidden, f"layers.{i}.norm1")
    s.region = "mlp"
    gu = m.linear(x, f"layers.{i}.mlp.gate_up_proj")
    n = gu.n // 2
    inp, gate = T(gu.st, n, gu.dt), T(gu.st, n, gu.dt)
    s.node("split", (gu,), (inp, gate))  # chunk(2, dim=-1)
    prod = o.dropout(o.mul(mlp.act(m, inp), gate), cfg.dropout)
    y = m.linear(prod, f"layers.{i}.mlp.down_proj")
    del prod, inp, gate, gu, x
    s.region = "hidden_states"
    return o.add(hidden, y)


def encode(m: EncoderModel, ids: T, layers: Sequence[int]) -> T:
    """ModernBertModel.forward up to the final norm."""
    o, s, spec, cfg = m.o, m.s, m.spec, m.cfg
    s.tr.where = "embedding"
    s.region = "inputs"
    position_ids = s.new(cfg.q, "i64")  # arange(seq).unsqueeze(0)
    s.region = "hidden_states"
    w = m.param("embed_tokens.weight")
    emb = s.new(cfg.tokens * spec.hidden_size, w.dt)
    s.node("copy", (w,), (emb,), (ids,))
    hidden = o.dropout(m.norm(emb, "embedding_norm"), cfg.dropout)
    del emb
    mask_inputs = hidden  # mask_kwargs["inputs_embeds"]: the embedding output, held until the forward returns
    s.region = "mask"
    masks = _masks(m, hidden.dt)
    s.region = "rope"
    rotary = {kind: _rotary(m, hidden.dt) for kind in sorted(set(spec.resolved_layer_types))}
    s.region = "hidden_states"
    for i in layers:
        kind = spec.resolved_layer_types[i]
        cos, sin = rotary[kind]
        s.hooks.enter_unit(s, i, (-1,))
        if cfg.grad_ckpt and (i + 1) % cfg.ckpt_every == 0:  # GradientCheckpointingLayer
            hidden = s.checkpoint(layer, m, i, hidden, cos, sin, masks.get(kind))
        else:
            hidden = layer(m, i, hidden, cos, sin, masks.get(kind))
    s.hooks.enter_unit(s, -1)
    s.unit = None
    s.tr.where = "final norm"
    s.region = "norm"
    out = m.norm(hidden, "norm")
    del hidden, rotary, masks, position_ids, mask_inputs
    return out


def _pool(m: EncoderModel, last: T) -> T:
    """``last_hidden_state[:, 0]`` (a view), or the mean over an all-ones mask (mul, sum, div)."""
    o, s, cfg, spec = m.o, m.s, m.cfg, m.spec
    enc = spec.encoder
    assert enc is not None
    if enc.pooling == "cls":
        return m._first_token(last)
    ones = s.new(cfg.tokens, "bool")  # torch.ones(shape[:2], dtype=bool)
    masked = o.mul(last, ones, last.n)  # * attention_mask.unsqueeze(-1)
    summed = s.new(cfg.batch * spec.hidden_size, masked.dt)  # .sum(dim=1)
    s.node("pass", (masked,), (summed,))
    del masked
    count = s.new(cfg.batch, "i64")  # attention_mask.sum(dim=1, keepdim=True)
    pooled = o.mul(summed, count, summed.n)  # / count
    del summed, count, ones
    return pooled


def head(m: EncoderModel, last: T) -> T:
    """ModernBertFor*: pooling (sequence classification), ModernBertPredictionHead, dropout and the
    classifier, or the decoder over the vocabulary (masked LM)."""
    o, spec = m.o, m.spec
    enc = spec.encoder
    assert enc is not None
    x = _pool(m, last) if enc.head == "sequence_classification" else last
    x = m.norm(mlp.act(m, m.linear(x, "head.dense")), "head.norm")
    if enc.head != "masked_lm":
        return m.linear(o.dropout(x, m._classifier_dropout()), "classifier")
    if m.has("lm_head.weight"):
        return m.linear(x, "lm_head")
    bias = m.param("lm_head.bias") if m.has("lm_head.bias") else None
    return o.linear(x, m.param("embed_tokens.weight"), bias, spec.vocab_size, spec.hidden_size)
