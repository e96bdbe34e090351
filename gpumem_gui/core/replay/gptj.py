"""GPT-J's own attention code (``models/gptj/modeling_gptj.py``, transformers 5.24), selected by
:attr:`ArchTraits.attention_code` ``"gptj"``:

* ``GPTJRotaryEmbedding.forward``: ``embed_positions[position_ids].to(x.dtype)`` (an fp32 gather of the
  [max_positions, rotary_dim] table, then one 16-bit copy) split into ``sin`` and ``cos`` views.
* ``GPTJAttention.forward``: the q and k projections sliced into the rotary channels and the rest
  (``q_rot``, ``q_pass``, ...); ``apply_rotary_pos_emb`` on k's then q's rotary channels (``sin`` and ``cos``
  ``repeat_interleave``'d on every call, ``rotate_every_two`` = ``stack((-x[..., 1::2], x[..., ::2]), -1)``);
  ``torch.cat`` of each rotated part and its pass-through view. The rotated parts and the pass-through views
  (so the whole projection outputs) stay locals of the forward: they are alive until it returns, through the
  kernel and ``out_proj``.
* ``eager_attention_forward``: ``matmul(query.to(float32), key.to(float32).transpose(2, 3)) * scaling``
  (fp32 copies of q and k, fp32 scores; under autocast the matmul takes 16-bit copies instead), ``+ mask``,
  ``softmax`` in the scores' dtype, ``.to(value.dtype)`` while the scores are still named, dropout,
  ``matmul`` with V, ``transpose(1, 2).contiguous()``. K and V are not repeated (GPT-J has no GQA).

The functions take the :class:`~gpumem_gui.core.replay.model.CausalLM` they run in as ``m``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumem_gui.core.replay import attention_kernels as kernels
from gpumem_gui.core.replay.memory import T

if TYPE_CHECKING:
    from gpumem_gui.core.replay.context import CausalLM
    from gpumem_gui.core.spec.model import ModelSpec


def rotary(m: CausalLM, x: T) -> tuple[T, T]:
    """GPTJRotaryEmbedding.forward: (cos, sin), two views of one [1, q, rotary_dim] table in x's dtype."""
    s, spec = m.s, m.spec
    rd = spec.rotary_dim or spec.head_dim
    sincos = s.cast(s.new(m.cfg.q * rd, "f32"), x.dt)
    half = sincos.n // 2
    return T(sincos.st, half, sincos.dt), T(sincos.st, half, sincos.dt)


def table_bytes(spec: ModelSpec) -> int:
    """GPTJRotaryEmbedding.embed_positions: the [max_positions, rotary_dim] fp32 sin/cos table, the rotary's
    only buffer."""
    return spec.max_position_embeddings * (spec.rotary_dim or spec.head_dim) * 4


def _apply(m: CausalLM, x: T, cos: T, sin: T) -> T:
    """apply_rotary_pos_emb(tensor, sin, cos): fresh repeat_interleave'd sin and cos, then
    ``(x * cos) + (rotate_every_two(x) * sin)``."""
    o, s = m.o, m.s
    sin2 = s.new(2 * sin.n, sin.dt)
    s.node("copy", (sin,), (sin2,))
    cos2 = s.new(2 * cos.n, cos.dt)
    s.node("copy", (cos,), (cos2,))
    x1 = o.slice_half(x)
    x2 = o.slice_half(x)
    rot = s.new(x.n, x.dt)  # torch.stack((-x2, x1), dim=-1); flatten(-2) is a view
    s.node("pass", (o.neg(x2), x1), (rot,))
    del x1, x2
    return o.add(o.mul(x, cos2, x.n), o.mul(rot, sin2, x.n))


def _slice(m: CausalLM, x: T, n: int) -> T:
    """``x[..., a:b]``: a view; slice_backward makes a zero-filled full-size gradient."""
    out = T(x.st, n, x.dt)
    m.s.node("copy", (x,), (out,))
    return out


def attention(m: CausalLM, i: int, x: T, cos: T | None, sin: T | None, mask: T | None) -> tuple[T, T | None]:
    """GPTJAttention.forward (see the module docstring)."""

    o, spec, cfg = m.o, m.spec, m.cfg
    pre = f"layers.{i}.self_attn"
    t, a, d = cfg.tokens, spec.num_attention_heads, spec.head_dim
    rd = spec.rotary_dim or d
    query = o.view(m.linear(x, f"{pre}.q_proj"))
    key = o.view(m.linear(x, f"{pre}.k_proj"))
    value = o.view(m.linear(x, f"{pre}.v_proj"), copy_grad=True)
    assert cos is not None and sin is not None
    k_rot, k_pass = _slice(m, key, t * a * rd), _slice(m, key, t * a * (d - rd))
    q_rot, q_pass = _slice(m, query, t * a * rd), _slice(m, query, t * a * (d - rd))
    k_rot = _apply(m, k_rot, cos, sin)
    q_rot = _apply(m, q_rot, cos, sin)
    key = o.view(o.cat(k_rot, k_pass), copy_grad=True)  # cat, then .transpose(1, 2)
    query = o.view(o.cat(q_rot, q_pass), copy_grad=True)
    if m.cache is not None:
        key, value = m.cache.update(i, key, value, cfg.q)
    out, weights = kernels.kernel(m, query, key, value, mask, a, a, d, d, layer=i)
    del query, key, value
    out = m.linear(out, f"{pre}.o_proj")  # out_proj
    del k_rot, k_pass, q_rot, q_pass  # the forward's locals go when it returns
    return out, weights


def eager(m: CausalLM, q: T, k: T, v: T, mask: T | None, a: int, vd: int) -> tuple[T, T]:
    """GPT-J's eager_attention_forward (see the module docstring); returns (output [b, q, a * vd], the
    probabilities the layer holds)."""
    o, s, cfg = m.o, m.s, m.cfg
    b, sq, kv = cfg.batch, cfg.q, cfg.kv_len
    n = b * a * sq * kv
    attn_weights = o.mul(o.bmm(s.cast(q, "f32"), s.cast(k, "f32"), n), None)
    if mask is not None:
        attn_weights = o.add(attn_weights, mask, n)
    sm = s.new(n, attn_weights.dt)  # softmax without a dtype: the scores' own; it saves its output
    s.node("copy", (attn_weights,), (sm,), (sm,))
    attn_weights = s.cast(sm, v.dt)  # softmax(...).to(...): the scores go when the name is rebound
    del sm
    attn_weights = o.dropout(attn_weights, cfg.attn_dropout)
    attn_output = o.bmm(attn_weights, v, b * sq * a * vd)
    return o.clone(attn_output), attn_weights


def _eager_kernel(
    m: CausalLM, layer: int, q: T, k: T, v: T, mask: T | None, a: int, kvh: int, vd: int
) -> tuple[T, T]:
    """:func:`eager` in the kernels' calling convention (attention_kernels.EAGER)."""
    return eager(m, q, k, v, mask, a, vd)


kernels.EAGER["gptj"] = _eager_kernel
