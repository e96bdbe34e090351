"""The causal depthwise convolution before the gated DeltaNet and Kimi Delta Attention
(``Qwen3NextGatedDeltaNet`` ``causal_conv1d_fn`` / ``causal_conv1d_update``, ``KimiDeltaAttention``'s short
convs): over the new tokens, with the cache's conv state (``update_conv_state``) when one is kept. It sits
below both mixers (replay/linear_attention.py, replay/kda.py), which share it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumem_gui.core.replay.delta_rule import new_op
from gpumem_gui.core.replay.memory import promote

if TYPE_CHECKING:
    from gpumem_gui.core.replay.context import CausalLM
    from gpumem_gui.core.replay.memory import T


def conv(m: CausalLM, i: int, mixed: T, pre: str | None = None) -> T:
    """The causal conv over [b, conv_dim, s], with the cache's conv state (update_conv_state /
    causal_conv1d_update); returns the SiLU'd conv output of the new tokens. ``pre``: the module holding
    ``conv1d`` (``layers.{i}.linear_attn``; KimiLinearDeltaAttention's ``layers.{i}.self_attn``)."""
    la, cfg = m.spec.linear_attention, m.cfg
    assert la is not None
    b, q, c, k = cfg.batch, cfg.q, la.conv_dim, la.conv_kernel
    st = m.cache.state if m.cache is not None else None
    w = m.param(f"{pre or f'layers.{i}.linear_attn'}.conv1d.weight")
    if st is not None and st.conv_state(i) is not None and q == 1:
        full = new_op(m, b * c * (k + 1), mixed.dt, st.conv_state(i), mixed)  # cat([conv_state, x])
        conv = new_op(m, b * c * 2, mixed.dt, full, w)
        del full
        return new_op(m, b * c, mixed.dt, conv)  # silu(out[:, :, -1:])
    length = q
    if st is not None:
        if st.conv_state(i) is None:
            st.init_conv(i)
            if q < k:  # F.pad to the kernel
                mixed, length = new_op(m, b * c * k, mixed.dt, mixed), k
        else:
            mixed, length = new_op(m, b * c * (k + q), mixed.dt, mixed), k + q
    dt = mixed.dt
    mixed = m.s.cast(mixed, w.dt)  # hidden_states.to(weight.dtype): fp32 master weights under autocast
    xa, wa = m.s.ac_cast(mixed), m.s.ac_cast(w)  # conv1d runs in autocast's lower precision
    assert xa is not None and wa is not None
    conv = new_op(m, b * c * (length + k - 1), promote(xa.dt, wa.dt), xa, wa, saved=(xa, wa))
    del xa, wa
    out = new_op(m, b * c * length, conv.dt, conv, saved=(conv,))  # silu of the [:, :, :length] view
    del conv
    return m.s.cast(out, dt)  # [:, :, -q:] of it: a view; the conv's input dies with this call's argument
