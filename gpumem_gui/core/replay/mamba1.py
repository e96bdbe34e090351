"""Jamba's Mamba-1 mixer on symbolic tensors, as transformers 5.24 runs it without the ``mamba_ssm`` and
``causal_conv1d`` kernels (``models/jamba/modeling_jamba.py`` ``JambaMambaMixer.forward`` with the PyTorch
fallbacks ``causal_conv1d_fn`` / ``causal_conv1d_update`` / ``mamba_selective_scan`` /
``mamba_selective_state_update``).

Prefill: ``in_proj`` to x and the gate, the depthwise causal conv and its SiLU, ``x_proj`` to (dt, B, C) and
an RMSNorm on each, ``dt_proj``; then the selective scan: the fp32 ``discrete_A``, ``discrete_B`` and
``deltaB_u`` of ``[b, inner, q, state]`` each (they dominate), and a Python loop over the tokens whose fp32
``ssm_state`` is updated and whose outputs (one ``[b, inner]`` each) pile up in a list until they are stacked;
the D skip and the SiLU gate in fp32; ``out_proj``. One cached token runs ``mamba_selective_state_update``.
The loop runs two replayed steps (the first and the last); in training autograd keeps every step's fp32
state and its bf16 copy, which the middle steps add as one node (traced: training within 0.5 %).

A GPU with the kernels (``selective_scan_fn``, ``mamba_inner_fn``) keeps none of the ``[b, inner, q, state]``
intermediates in PyTorch's allocator: its Mamba layers peak far lower than modelled here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumem_gui.core.replay.delta_rule import new_op
from gpumem_gui.core.replay.mamba2 import conv as causal_conv
from gpumem_gui.core.replay.memory import T, promote
from gpumem_gui.core.replay.registry import MIXERS, register

if TYPE_CHECKING:
    from gpumem_gui.core.replay.context import CausalLM
    from gpumem_gui.core.spec.mamba import Mamba1Spec


def _view(x: T, n: object) -> T:
    return T(x.st, n, x.dt, x.rg, x.fn, x.idx)


def _step(m: CausalLM, mb: Mamba1Spec, disc_a: T, dbu: T, held: list[T], dc: tuple[str, T]) -> tuple[T, T]:
    """One token of the loop: ``discrete_A[:, :, i] * ssm_state + deltaB_u[:, :, i]`` (fp32), its copy in
    the input dtype times C (bmm), whose [b, inner] output joins the list: (new state, that output). The
    old state comes in ``held`` (emptied: it dies at the rebinding, as in the loop)."""
    b, d, n = m.cfg.batch, mb.inner, mb.state_size
    dt, c = dc
    old = held.pop()
    part = new_op(m, b * d * n, "f32", disc_a, old, saved=(old,))
    state = new_op(m, b * d * n, "f32", part, dbu)
    del part, old
    low = m.s.cast(state, dt)
    step = new_op(m, b * d, dt, low, c, saved=(low, c))
    del low
    return state, step


def _scan(m: CausalLM, mb: Mamba1Spec, pre: str, ins: tuple[T, T, T, T, T], a: T) -> tuple[T, T]:
    """mamba_selective_scan's recurrent loop: the fp32 output [b, inner, q] (D skip and gate applied) and
    the last fp32 ssm_state."""
    x, dt, bm, _c, gate = ins
    b, q, t = m.cfg.batch, m.cfg.q, m.cfg.tokens
    d, n = mb.inner, mb.state_size
    s = m.s
    bias32 = s.cast(m.param(f"{pre}.dt_proj.bias"), "f32")  # dt_proj.bias.float()
    d32 = s.cast(m.param(f"{pre}.D"), "f32")  # self.D.float()
    bias = s.cast(bias32, dt.dt)  # delta_bias.to(dt.dtype)
    dt = new_op(m, t * d, dt.dt, dt, bias)
    del bias
    dt = new_op(m, t * d, dt.dt, dt, saved=(dt,))  # softplus
    prod = new_op(m, t * d * n, "f32", a, dt, saved=(a, dt))
    disc_a = new_op(m, t * d * n, "f32", prod, keep_out=True)  # exp
    del prod
    b32 = s.cast(bm, "f32")
    disc_b = new_op(m, t * d * n, "f32", dt, b32, saved=(dt, b32))
    del b32
    x32 = s.cast(x, "f32")
    dbu = new_op(m, t * d * n, "f32", disc_b, x32, saved=(disc_b, x32))
    del x32
    held = [new_op(m, b * d * n, x.dt)]  # ssm_state: zeros(b, inner, state) in the input dtype
    state, first = _step(m, mb, disc_a, dbu, held, (x.dt, _c))
    outs = [first]  # the scan_outputs list: one [b, inner] output per token, kept to the stack
    if q > 1:  # tokens 2 .. q-1 leave theirs in the list; the last step peaks as every later one
        outs.append(s.new((q - 2) * b * d, x.dt))
        if s.grad_enabled:  # autograd keeps each middle step's fp32 state (mul) and bf16 copy (bmm)
            kept = (s.new((q - 2) * b * d * n, "f32"), s.new((q - 2) * b * d * n, x.dt))
            nxt = s.new(b * d * n, "f32")  # the state before the last step, through the middle ones
            s.node("copy", (state, disc_a, dbu), (nxt,), kept)
            del kept
            state = nxt
            del nxt
        held.append(state)
        del state
        state, last = _step(m, mb, disc_a, dbu, held, (x.dt, _c))
        outs.append(last)
    del first
    stacked = new_op(m, b * d * q, x.dt, *outs)
    skip = new_op(m, b * d * q, promote(x.dt, "f32"), x, d32, saved=(x,))
    out = new_op(m, b * d * q, "f32", stacked, skip)
    del skip, stacked
    sig = new_op(m, gate.n, gate.dt, gate, saved=(gate,))  # F.silu(z)
    out = new_op(m, out.n, "f32", out, sig, saved=(out, sig))
    del sig, outs, disc_a, disc_b, dbu, dt, bias32, d32
    return out, state


def _select(m: CausalLM, pre: str, x: T, dt: T, bc: tuple[T, T], rest: tuple[T, T, T]) -> T:
    """mamba_selective_state_update for one cached token (the state updated in place): [b, inner] in the
    input dtype."""
    state, a, gate = rest
    mb, s = m.spec.mamba, m.s
    assert mb is not None and mb.kind == "mamba1"
    b, d, n = m.cfg.batch, mb.inner, mb.state_size
    bias32 = s.cast(m.param(f"{pre}.dt_proj.bias"), "f32")
    bias = s.cast(bias32, dt.dt)
    dt = new_op(m, b * d, dt.dt, dt, bias)
    del bias
    dt = new_op(m, b * d, dt.dt, dt)  # softplus
    da = new_op(m, b * d * n, "f32", new_op(m, b * d * n, "f32", s.cast(dt, "f32"), a))  # exp(dt * A)
    db = new_op(m, b * d * n, "f32", s.cast(dt, "f32"), s.cast(bc[0], "f32"))
    dbx = new_op(m, b * d * n, "f32", db, s.cast(x, "f32"))
    del db
    ssm = new_op(m, b * d * n, "f32", new_op(m, b * d * n, "f32", state, da), dbx)  # copied into the state
    del da, dbx
    out = new_op(m, b * d, x.dt, s.cast(ssm, bc[1].dt), bc[1])  # matmul with C
    del ssm
    out = new_op(m, b * d, x.dt, out, new_op(m, b * d, x.dt, x, m.param(f"{pre}.D")))  # + x * D
    sig = new_op(m, b * d, gate.dt, gate)
    out = new_op(m, b * d, x.dt, out, sig)
    del sig, bias32
    return out


@register(MIXERS, "mamba1")
def mamba1(m: CausalLM, i: int, x: T, *_: object) -> tuple[T, None]:
    """JambaMambaMixer.forward from the normed input; returns (output, None)."""
    s, mb = m.s, m.spec.mamba
    assert mb is not None and mb.kind == "mamba1"
    prev, s.region = s.region, "attention"
    pre = f"layers.{i}.mamba"
    t, q, d, n = m.cfg.tokens, m.cfg.q, mb.inner, mb.state_size
    proj = m.linear(x, f"{pre}.in_proj")  # .transpose(1, 2): a view
    a_log = s.cast(m.param(f"{pre}.A_log"), "f32")
    a = new_op(m, d * n, "f32", new_op(m, d * n, "f32", a_log, keep_out=True))  # -exp(A_log.float())
    del a_log
    xs, gate = _view(proj, t * d), _view(proj, t * d)  # chunk(2, dim=1)
    xs = causal_conv(m, i, f"{pre}.conv1d", xs, (d, mb.conv_kernel))
    xp = m.linear(xs, f"{pre}.x_proj")
    step, bm, cm = _view(xp, t * mb.dt_rank), _view(xp, t * n), _view(xp, t * n)
    step = m.norm(step, f"{pre}.dt_layernorm")
    bm, cm = m.norm(bm, f"{pre}.b_layernorm"), m.norm(cm, f"{pre}.c_layernorm")
    del xp
    w = m.param(f"{pre}.dt_proj.weight")
    wa, sa = s.ac_cast(w), s.ac_cast(step)
    assert wa is not None and sa is not None
    dt = new_op(m, t * d, promote(wa.dt, sa.dt), wa, sa, saved=(wa, sa))  # dt_proj.weight @ time_step^T
    del wa, sa
    if q > 1:  # the matmul's [b, s, inner] result made contiguous as [b, inner, s]
        dt = new_op(m, t * d, dt.dt, dt)
    st = m.cache.state if m.cache is not None else None
    init = st.recurrent_state(i) if st is not None else None
    if init is not None and q == 1:
        y = _select(m, pre, xs, dt, (bm, cm), (init, a, gate))
    else:
        y, final = _scan(m, mb, pre, (xs, dt, bm, cm, gate), a)
        if st is not None and init is None:
            st.init_recurrent(i)  # update_recurrent_state copies the final state into it
        del final
    low = s.cast(y, x.dt)  # scan_output.transpose(1, 2).to(dtype)
    del y
    out = m.linear(low, f"{pre}.out_proj")
    del low, xs, gate, proj, dt, step, bm, cm, a
    s.region = prev
    return out, None
