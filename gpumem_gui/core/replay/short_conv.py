"""LFM2's gated short convolution on symbolic tensors (``models/lfm2/modeling_lfm2.py``
``Lfm2ShortConv.forward``, transformers 5.24).

``in_proj`` gives ``BCx`` [b, s, 3h], viewed as [b, 3h, s] and chunked into B, C and x (views); ``B * x`` is a
new [b, h, s] tensor, whose cache update pads it to the kernel (a short prompt) or prepends the conv state (a
continued one); the depthwise conv (``causal_conv1d_fn``: padding ``kernel - 1``, no activation, so the result
is a slice of the conv's output; ``causal_conv1d_update`` for one cached token); ``C *`` it; its
``transpose(-1, -2).contiguous()`` is a view, as the product already lies out channels last (the layout of C);
``out_proj``. The cache keeps only a conv state (b, h, kernel) in the activation dtype.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumem_gui.core.replay.delta_rule import new_op
from gpumem_gui.core.replay.memory import T, promote
from gpumem_gui.core.replay.registry import MIXERS, register

if TYPE_CHECKING:
    from gpumem_gui.core.replay.context import CausalLM


def _conv(m: CausalLM, i: int, bx: T) -> T:
    """The cache update and the causal conv of ``B * x``: the conv's output (the caller reads a slice)."""
    sc, cfg = m.spec.short_conv, m.cfg
    assert sc is not None
    b, q, h, k = cfg.batch, cfg.q, m.spec.hidden_size, sc.kernel
    pre = f"layers.{i}.conv.conv"
    w, bias = m.param(f"{pre}.weight"), m.w(f"{pre}.bias")
    st = m.cache.state if m.cache is not None else None
    if st is not None and st.conv_state(i) is not None and q == 1:  # causal_conv1d_update
        full = new_op(m, b * h * (k + 1), bx.dt, st.conv_state(i), bx)  # cat([conv_state, x])
        return new_op(m, b * h * 2, bx.dt, full, w, bias)
    length = q
    if st is not None:
        if st.conv_state(i) is None:
            st.init_conv(i)
            if q < k:  # F.pad to the kernel
                bx, length = new_op(m, b * h * k, bx.dt, bx), k
        else:
            bx, length = new_op(m, b * h * (k + q), bx.dt, bx), k + q
    bx = m.s.cast(bx, w.dt)  # hidden_states.to(weight.dtype)
    xa, wa = m.s.ac_cast(bx), m.s.ac_cast(w)  # conv1d runs in autocast's lower precision
    assert xa is not None and wa is not None
    return new_op(m, b * h * (length + k - 1), promote(xa.dt, wa.dt), xa, wa, bias, saved=(xa, wa))


@register(MIXERS, "short_conv")
def short_conv(m: CausalLM, i: int, x: T, *_: object) -> tuple[T, None]:
    """Lfm2ShortConv.forward from the normed input; returns (output, None)."""
    s, o = m.s, m.o
    prev, s.region = s.region, "attention"
    pre = f"layers.{i}.conv"
    t, h = m.cfg.tokens, m.spec.hidden_size
    bcx = m.linear(x, f"{pre}.in_proj")
    parts = [T(bcx.st, t * h, bcx.dt, bcx.rg, bcx.fn, bcx.idx) for _ in range(3)]  # chunk: views
    for p in parts:
        s.node("copy", (bcx,), (p,))
    b_, c_, x_ = parts
    del parts
    held = [o.mul(b_, x_)]  # B * x, held only by the conv call's argument
    conv = _conv(m, i, held.pop())
    out = o.mul(c_, T(conv.st, t * h, conv.dt, conv.rg, conv.fn, conv.idx))  # C * conv[..., :s]
    # transpose(-1, -2).contiguous() is already contiguous; BCx and the conv's output stay (locals) to the end
    out = m.linear(out, f"{pre}.out_proj")
    del conv, b_, x_, c_, bcx
    s.region = prev
    return out, None
