"""DeepSeek-V4's small modules on symbolic tensors (transformers 5.24 ``models/deepseek_v4/
modeling_deepseek_v4.py``): the unweighted RMSNorm, the fp32-weight RMSNorm, the rotary tables of
``DeepseekV4RotaryEmbedding.forward`` and the interleaved ``apply_rotary_pos_emb`` on the trailing rope slice.

Each follows its statement order so that Python frees every temporary where the real code drops it: in
``x.float().square().mean(...)`` each intermediate dies as soon as the next op has returned.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpumem_gui.core.replay import registry
from gpumem_gui.core.replay.memory import T

if TYPE_CHECKING:
    from gpumem_gui.core.replay.context import CausalLM


def op(m: CausalLM, n: Any, dt: str, inputs: tuple[T | None, ...], saved: tuple[T | None, ...] = ()) -> T:
    """One torch op's output of ``n`` elements (autograd: a node over ``inputs`` saving ``saved``)."""
    out = m.s.new(n, dt)
    m.s.node("copy", inputs, (out,), saved)
    return out


def unweighted_norm(m: CausalLM, x: T, width: int) -> T:
    """DeepseekV4UnweightedRMSNorm: ``x * rsqrt(x.float().square().mean(-1) + eps).to(x.dtype)``."""
    o, s = m.o, m.s
    xf = s.cast(x, "f32")
    sq = o.pow2(xf)
    del xf
    mean = o.mean_last(sq, width)
    del sq
    r = o.rsqrt(o.add(mean, None))
    del mean
    r = s.cast(r, x.dt)
    return o.mul(x, r, x.n)


def weighted_norm(m: CausalLM, x: T, name: str) -> T:
    """DeepseekV4RMSNorm (an fp32 weight): fp32 states normalised, ``weight * states`` in fp32, cast back,
    as GptOssRMSNorm (the ``norm_product_fp32`` norm)."""
    w = m.param(f"{name}.weight")
    return registry.norm("norm_product_fp32")(m, x, w, m.shape[f"{name}.weight"][0])


def tables(m: CausalLM, positions: Any, dt: str) -> tuple[T, T]:
    """DeepseekV4RotaryEmbedding.forward over ``positions`` position ids: ``position_ids[..., None].float()
    * inv_freq``, ``cos() * attention_scaling`` and ``sin() * attention_scaling`` in fp32, each cast to the
    input's dtype (rotary_dim / 2 entries per position, no duplication)."""
    s = m.s
    half = (m.spec.rotary_dim or m.spec.head_dim) // 2
    pos = s.new(positions, "f32")
    freqs = s.new(positions * half, "f32")
    del pos
    out = []
    for _ in ("cos", "sin"):
        f = s.new(positions * half, "f32")
        scaled = s.new(positions * half, "f32")
        del f
        out.append(scaled)
    del freqs
    cos, sin = s.cast(out[0], dt), s.cast(out[1], dt)
    del out
    return cos, sin


def rope(m: CausalLM, x: T, rows: Any, cos: T, sin: T, positions: Any) -> T:
    """apply_rotary_pos_emb on ``rows`` vectors of ``x`` (head_dim wide): cos / sin repeat_interleave'd to
    the rope width, ``(rope.float() * cos + rotate_half(rope).float() * sin).to(x.dtype)`` (rotate_half
    stacks ``-x2`` and ``x1``), the nope slice and the rotated one concatenated."""
    o, s = m.o, m.s
    r = m.spec.rotary_dim or m.spec.head_dim
    n_rope = rows * r
    cos2 = op(m, positions * r, cos.dt, (cos,))
    sin2 = op(m, positions * r, sin.dt, (sin,))
    rope_v = T(x.st, n_rope, x.dt, x.rg, x.fn, x.idx)  # x[..., -r:]: a view (SliceBackward)
    rf = s.cast(rope_v, "f32")
    a = o.mul(rf, cos2, n_rope)
    del rf
    neg = op(m, n_rope // 2, x.dt, (rope_v,))  # -x2
    st = op(m, n_rope, x.dt, (neg, rope_v))  # torch.stack((-x2, x1), dim=-1).flatten(-2)
    del neg
    stf = s.cast(st, "f32")
    del st
    b = o.mul(stf, sin2, n_rope)
    del stf
    total = o.add(a, b)
    del a, b
    rotated = s.cast(total, x.dt)
    del total, cos2, sin2, rope_v
    return op(m, x.n, x.dt, (x, rotated))  # torch.cat([nope, rotated], dim=-1)
