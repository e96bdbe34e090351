"""Cohere2's own norm and rotary, op by op as ``models/cohere2/modeling_cohere2.py`` (transformers 5.24) runs
them:

* ``Cohere2LayerNorm.forward`` (:attr:`ArchTraits.layernorm_ops`): ``x.to(float32)``; ``mean``; ``(x -
  mean).pow(2).mean()``; ``(x - mean) * rsqrt(variance + eps)``; ``weight.to(float32) * x``; cast back. Each
  step a new tensor; autograd keeps both centred copies, the rsqrt and the normalised input of the weight
  product.
* ``apply_rotary_pos_emb`` (:attr:`ArchTraits.rope_upcast`): ``q.float()``, ``k.float()`` first, then
  ``(q * cos) + (rotate_half(q) * sin)`` in fp32 with the interleaved ``rotate_half`` (``torch.stack([-x2,
  x1], -1).flatten(-2)`` of ``x[..., ::2]`` / ``x[..., 1::2]``) and cos/sin in the activation dtype, cast back
  to q's and k's dtype at the end.

The functions take the :class:`~gpumem_gui.core.replay.model.CausalLM` they run in as ``m``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumem_gui.core.replay.memory import T
from gpumem_gui.core.replay.registry import NORMS, register

if TYPE_CHECKING:
    from gpumem_gui.core.replay.context import CausalLM


@register(NORMS, "layernorm_ops")
def layer_norm(m: CausalLM, x: T, name: str) -> T:
    """Cohere2LayerNorm.forward (no bias): see the module docstring."""
    o, s = m.o, m.s
    w = m.param(f"{name}.weight")
    width = m.shape[f"{name}.weight"][0]
    input_dtype = x.dt
    hs = s.cast(x, "f32")
    mean = o.mean_last(hs, width)
    variance = o.mean_last(o.pow2(o.add(hs, mean, hs.n)), width)
    normed = o.mul(o.add(hs, mean, hs.n), o.rsqrt(o.add(variance, None)), hs.n)
    del variance, mean, hs
    out = o.mul(s.cast(w, "f32"), normed, normed.n)
    del normed
    return s.cast(out, input_dtype)


def _rotate_half(m: CausalLM, x: T) -> T:
    """``torch.stack([-x[..., 1::2], x[..., ::2]], dim=-1).flatten(-2)``: the negated half, then the stack."""
    o, s = m.o, m.s
    x1 = o.slice_half(x)
    x2 = o.slice_half(x)
    out = s.new(x.n, x.dt)
    s.node("pass", (o.neg(x2), x1), (out,))
    return out


def rope(m: CausalLM, q: T, k: T, cos: T, sin: T) -> tuple[T, T]:
    """Cohere2's apply_rotary_pos_emb: see the module docstring."""
    o, s = m.o, m.s
    dtype = q.dt
    q32 = s.cast(q, "f32")
    k32 = s.cast(k, "f32")
    q_embed = o.add(o.mul(q32, cos, q32.n), o.mul(_rotate_half(m, q32), sin, q32.n))
    k_embed = o.add(o.mul(k32, cos, k32.n), o.mul(_rotate_half(m, k32), sin, k32.n))
    return s.cast(q_embed, dtype), s.cast(k_embed, dtype)
