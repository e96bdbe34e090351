"""Rotary position embedding over part of each head, and over interleaved pairs, as transformers 5.24 runs it.

* ``models/glm4_moe/modeling_glm4_moe.py`` ``apply_rotary_pos_emb`` (partial, halves): ``q_rot, q_pass =
  q[..., :rotary_dim], q[..., rotary_dim:]``, ``(q_rot * cos) + (rotate_half(q_rot) * sin)`` over the rotary
  channels only, then ``torch.cat([q_embed, q_pass], dim=-1)`` (a new full-width tensor).
* ``models/glm/modeling_glm.py`` / ``models/glm4/modeling_glm4.py`` ``apply_rotary_pos_emb`` (interleaved):
  the same, but first ``cos = cos[..., : cos.shape[-1] // 2].repeat_interleave(2, dim=-1)`` (and sin): a new
  [1, 1, q, rotary_dim] tensor per call, which every layer makes again (and its multiplications save for
  backward); ``rotate_half`` is ``torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)``.
* ``models/ernie4_5/modeling_ernie4_5.py`` ``apply_rotary_pos_emb``: interleaved over the whole head, with
  fp32 cos/sin (Ernie4_5RotaryEmbedding keeps them fp32), on fp32 copies of q and k, cast back at the end.

The cos/sin tables themselves (``Glm4RotaryEmbedding.forward``) are [1, q, rotary_dim]: :func:`rotary_width`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumem_gui.core.replay.memory import T

if TYPE_CHECKING:
    from gpumem_gui.core.replay.context import CausalLM
    from gpumem_gui.core.spec.model import ModelSpec


def rotary_width(spec: ModelSpec) -> int:
    """Channels of one head the rotary tables cover: MLA's rope head, a partial rotary width, or head_dim."""
    if spec.mla is not None:
        return spec.mla.qk_rope_head_dim
    return spec.rotary_dim or spec.head_dim


def applies(spec: ModelSpec) -> bool:
    """Whether the attention's rotary is this module's (partial, interleaved, fp32) rather than Llama's."""
    t = spec.traits
    return spec.mla is None and (spec.rotary_dim is not None or t.rope_interleaved or t.rope_fp32)


def _rotate_half(m: CausalLM, x: T) -> T:
    """rotate_half: halves ``cat(-x2, x1)`` (Llama), or interleaved ``stack((-x[1::2], x[0::2]), -1)``."""
    o, s = m.o, m.s
    x1 = o.slice_half(x)
    x2 = o.slice_half(x)
    if not m.spec.traits.rope_interleaved:
        return o.cat(o.neg(x2), x1)
    out = s.new(x.n, x.dt)  # torch.stack: a new tensor; flatten(-2) of it is a view
    s.node("pass", (o.neg(x2), x1), (out,))
    return out


def _embed(m: CausalLM, x: T, cos: T, sin: T, heads: int, rd: int, d: int) -> tuple[T, T]:
    """(rotated channels, pass-through view) of q or k with ``heads`` heads."""
    s = m.s
    rows = m.cfg.tokens * heads
    x_rot = T(x.st, rows * rd, x.dt)
    s.node("copy", (x,), (x_rot,))  # slice_backward: a zero-filled full-size gradient
    x_pass = T(x.st, rows * (d - rd), x.dt)
    s.node("copy", (x,), (x_pass,))
    o = m.o
    embed = o.add(o.mul(x_rot, cos, x_rot.n), o.mul(_rotate_half(m, x_rot), sin, x_rot.n))
    return embed, x_pass


def _fp32_embed(m: CausalLM, x: T, cos: T, sin: T) -> T:
    """``(x.float() * cos) + (rotate_half(x).float() * sin)`` (Ernie4_5 apply_rotary_pos_emb): fp32 copies,
    fp32 products and sum; the rotation itself in the input's dtype."""
    o, s = m.o, m.s
    return o.add(o.mul(s.cast(x, "f32"), cos, x.n), o.mul(s.cast(_rotate_half(m, x), "f32"), sin, x.n))


def partial_rope(m: CausalLM, q: T, k: T, cos: T, sin: T) -> tuple[T, T]:
    """apply_rotary_pos_emb of GLM / GLM-4 / GLM-4-MoE / ERNIE-4.5 (see the module docstring)."""
    o, s, spec = m.o, m.s, m.spec
    if spec.traits.rope_fp32:  # Ernie4_5: full width, interleaved, fp32, ``.to(original_dtype)`` at the end
        c2, s2 = s.new(cos.n, cos.dt), s.new(sin.n, sin.dt)
        s.node("copy", (cos,), (c2,))
        s.node("copy", (sin,), (s2,))
        q_embed = _fp32_embed(m, q, c2, s2)
        k_embed = _fp32_embed(m, k, c2, s2)
        return s.cast(q_embed, q.dt), s.cast(k_embed, k.dt)
    d = spec.head_dim
    rd = rotary_width(spec)
    if spec.traits.rope_interleaved:  # cos[..., :half].repeat_interleave(2, dim=-1): new tensors
        c2, s2 = s.new(cos.n, cos.dt), s.new(sin.n, sin.dt)
        s.node("copy", (cos,), (c2,))
        s.node("copy", (sin,), (s2,))
        cos, sin = c2, s2
        del c2, s2
    q_embed, q_pass = _embed(m, q, cos, sin, spec.num_attention_heads, rd, d)
    k_embed, k_pass = _embed(m, k, cos, sin, spec.num_kv_heads, rd, d)
    q_embed = o.cat(q_embed, q_pass)
    del q_pass
    k_embed = o.cat(k_embed, k_pass)
    return q_embed, k_embed


def position_scale(m: CausalLM, q: T) -> T:
    """``query_states * get_llama_4_attn_scale(position_ids, beta, original_max).to(query_states.dtype)``
    (Ministral3Attention): ``1 + beta * log(1 + floor(positions / original_max))`` in fp32 over the q
    positions (each step a new [1, q] tensor replacing the previous), cast, then a new query tensor."""
    s = m.s
    scale = s.cast(s.new(m.cfg.q, "f32"), q.dt)
    return m.o.mul(q, scale, q.n)
