"""The Mamba-2 mixer of Nemotron-H on symbolic tensors, as transformers 5.24 runs it without the ``mamba_ssm``
and ``causal_conv1d`` kernels (``models/nemotron_h/modeling_nemotron_h.py`` ``NemotronHMamba2Mixer.forward``
with the PyTorch fallbacks ``causal_conv1d_fn`` / ``causal_conv1d_update`` / ``mamba2_chunk_scan`` /
``mamba2_selective_state_update``), and the layer of one sub-layer around it (``NemotronHBlock.forward``).

Prefill: ``in_proj`` to (gate, x B C, dt), the depthwise causal conv and its SiLU, then the chunked scan in
fp32: dt biased, softplus'd and clamped; fp32 copies of x, of B and C repeated to every head; the D residual
of the padded x; everything padded to a multiple of ``chunk_size``; the ``[b, heads, chunks, chunk, chunk]``
segment sums, their exp ``L``, ``G = C B^T`` and ``M = G L`` (three such fp32 tensors live at once, plus the
einsums' contiguous operand copies), the per-chunk states, the inter-chunk recurrence and the output; the
grouped gated RMSNorm in fp32 and ``out_proj``. One cached token runs ``mamba2_selective_state_update``.
With the cache, the conv state and the fp32 final state are copied into its ``LinearAttentionLayer``.

A GPU with the kernels (``mamba_chunk_scan_combined``, and in training without a cache
``mamba_split_conv1d_scan_combined``, which fuses conv, scan, norm and ``out_proj``) keeps none of these fp32
intermediates in PyTorch's allocator: its Mamba layers peak far lower than modelled here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumem_gui.core.replay import attention, mlp
from gpumem_gui.core.replay.delta_rule import new_op
from gpumem_gui.core.replay.memory import T, promote
from gpumem_gui.core.replay.registry import BLOCKS, MIXERS, register
from gpumem_gui.core.replay.sym import chunks

if TYPE_CHECKING:
    from gpumem_gui.core.replay.context import CausalLM
    from gpumem_gui.core.spec.mamba import Mamba2Spec


def _view(x: T, n: object) -> T:
    return T(x.st, n, x.dt, x.rg, x.fn, x.idx)


def conv(m: CausalLM, i: int, pre: str, xbc: T, ck: tuple[int, int]) -> T:
    """update_conv_state and causal_conv1d_fn (or causal_conv1d_update for one cached token) of the conv
    ``pre`` over ``c`` channels with ``k`` taps: the SiLU'd output of the new tokens, [b, c, q] in the
    activation dtype (shared by Jamba's Mamba-1 mixer, replay/mamba1.py)."""
    b, q = m.cfg.batch, m.cfg.q
    c, k = ck
    w, bias = m.param(f"{pre}.weight"), m.w(f"{pre}.bias")
    st = m.cache.state if m.cache is not None else None
    if st is not None and st.conv_state(i) is not None and q == 1:
        full = new_op(m, b * c * (k + 1), w.dt, st.conv_state(i), xbc)  # cat([conv_state, x]).to(weight)
        y = new_op(m, b * c * 2, w.dt, full, w, bias)
        del full
        return new_op(m, b * c, w.dt, y)  # silu(out[:, :, -1:])
    length = q
    if st is not None:
        if st.conv_state(i) is None:
            st.init_conv(i)
            if q < k:  # F.pad to the kernel
                xbc, length = new_op(m, b * c * k, xbc.dt, xbc), k
        else:
            xbc, length = new_op(m, b * c * (k + q), xbc.dt, xbc), k + q
    dt = xbc.dt
    xbc = m.s.cast(xbc, w.dt)  # hidden_states.to(weight.dtype)
    xa, wa, ba = m.s.ac_cast(xbc), m.s.ac_cast(w), m.s.ac_cast(bias)
    assert xa is not None and wa is not None
    y = new_op(m, b * c * (length + k - 1), promote(xa.dt, wa.dt), xa, wa, ba, saved=(xa, wa))
    del xa, wa, ba
    out = new_op(m, b * c * length, y.dt, y, saved=(y,))  # silu of the [:, :, :length] view
    del y
    return m.s.cast(out, dt)


def _for_grad(p: T, x: T) -> tuple[T, ...]:
    """What a product with ``p`` (a parameter, or A = -exp(A_log)) saves for ``p``'s gradient: the other
    operand ``x`` when ``p`` needs one, nothing when it is frozen (LoRA): MulBackward saves ``other`` only
    for ``self``'s gradient."""
    return (x,) if p.fn is not None else ()


def _bmm(m: CausalLM, n: object, *operands: tuple[T, object | None]) -> T:
    """One einsum of the scan: each operand's contiguous copy when its permuted layout cannot be viewed
    (``(tensor, elements)``; None: viewed), autocast's cast of it (bmm runs in the lower precision), the
    bmm's output of ``n`` elements, which saves the operands it multiplied."""
    copies = [new_op(m, k, x.dt, x) if k is not None else x for x, k in operands]
    cast = [m.s.ac_cast(x) for x in copies]
    assert all(c is not None for c in cast)
    out = new_op(m, n, cast[0].dt, *cast, saved=tuple(cast))  # type: ignore[union-attr]
    del copies, cast
    return out


def _segsum(m: CausalLM, a: T, n: object) -> T:
    """exp(segment_sum(a)): masked_fill, cumsum and masked_fill of the expanded input (all three alive at
    the last), then exp; ``n`` elements each."""
    filled = new_op(m, n, "f32", a)
    ssum = new_op(m, n, "f32", filled)
    seg = new_op(m, n, "f32", ssum)
    del ssum, filled
    return new_op(m, n, "f32", seg, keep_out=True)


def _prepare(
    m: CausalLM, mb: Mamba2Spec, pa: tuple[str, T], x: T, dt: T, bc: tuple[T, T], sp: object
) -> tuple[T, ...]:
    """mamba2_chunk_scan up to the chunked layout: dt biased / softplus / clamped; fp32 x, B and C repeated
    to every head; the D residual; x and A discretised; x, A, B, C padded to ``sp`` tokens (b x padded)."""
    t, h, hn = m.cfg.tokens, mb.heads, mb.heads * mb.state_size
    s, (pre, a) = m.s, pa
    bias = s.cast(m.param(f"{pre}.dt_bias"), dt.dt)  # dt_bias.to(dt.dtype)
    dt = new_op(m, t * h, dt.dt, dt, bias)
    del bias
    dt = new_op(m, t * h, dt.dt, dt, saved=(dt,))  # softplus
    dt = new_op(m, t * h, dt.dt, dt, saved=(dt,))  # clamp
    xf = s.cast(x, "f32")
    reps = []
    for y in bc:
        yf = s.cast(y, "f32")
        reps.append(new_op(m, t * hn, "f32", yf))  # repeat_interleave over the heads of a group
        del yf
    d_pad = new_op(m, sp * mb.inner, "f32", xf)  # pad_tensor_by_size(hidden_states)
    d = m.param(f"{pre}.D")
    d_res = new_op(m, sp * mb.inner, "f32", d, d_pad, saved=_for_grad(d, d_pad))
    del d_pad
    dtf = new_op(m, t * h, "f32", dt)  # dt[..., None].float()
    xd = new_op(m, t * mb.inner, "f32", xf, dtf, saved=(xf, dtf))
    del xf, dtf
    dtf = new_op(m, t * h, "f32", dt)
    ad = new_op(m, t * h, "f32", a, dtf, saved=_for_grad(a, dtf))
    del dtf
    padded = tuple(
        new_op(m, sp * n, "f32", src) for src, n in ((xd, mb.inner), (ad, h), (reps[0], hn), (reps[1], hn))
    )
    del xd, ad, reps
    return (*padded, d_res, dt)


def _scan(
    m: CausalLM, mb: Mamba2Spec, pa: tuple[str, T], x: T, dt: T, bc: tuple[T, T], init: T | None
) -> tuple[T, T]:
    """mamba2_chunk_scan (the torch fallback): the output [b, q, heads, head_dim] in fp32 and the inter-chunk
    states whose last is the final state (returned with a cache, else freed with the scan's locals)."""
    b, q, cs, h = m.cfg.batch, m.cfg.q, mb.chunk_size, mb.heads
    nc = chunks(q, cs)
    sp, hp, hn, pn = b * nc * cs, mb.inner, h * mb.state_size, mb.inner * mb.state_size
    xs, a, bb, cc, d_res, dt = _prepare(m, mb, pa, x, dt, bc, sp)
    a_cum = new_op(m, sp * h, "f32", a)
    ell = _segsum(m, a, sp * h * cs)
    g = _bmm(m, sp * h * cs, (cc, sp * hn), (bb, sp * hn))  # C B^T
    mm = new_op(m, sp * h * cs, promote(g.dt, ell.dt), g, ell, saved=(g, ell))
    y_diag = _bmm(m, sp * hp, (xs, sp * hp), (mm, None))
    sub = new_op(m, sp * h, "f32", a_cum)
    decay = new_op(m, sp * h, "f32", sub, keep_out=True)
    del sub
    b_decay = new_op(m, sp * hn, "f32", bb, decay, saved=(bb, decay))
    states = _bmm(m, b * nc * pn, (xs, sp * hp), (b_decay, sp * hn))
    prev = new_op(m, b * pn, states.dt, init) if init is not None else new_op(m, b * pn, states.dt)
    cat = new_op(m, b * (nc + 1) * pn, states.dt, prev, states)
    del states
    last = new_op(m, b * h * (nc + 1), "f32", a_cum)  # F.pad(A_cumsum[:, :, :, -1], (1, 0))
    small = _segsum(m, last, b * h * (nc + 1) * (nc + 1))
    del last
    new_states = _bmm(m, b * (nc + 1) * pn, (small, None), (cat, None))
    del cat
    out_decay = new_op(m, sp * h, "f32", a_cum, keep_out=True)
    c_states = _bmm(m, sp * hp, (cc, sp * hn), (new_states, b * nc * pn))
    y_off = new_op(m, sp * hp, promote(c_states.dt, "f32"), c_states, out_decay, saved=(c_states, out_decay))
    total = new_op(m, sp * hp, promote(y_diag.dt, y_off.dt), y_diag, y_off)
    out = new_op(m, sp * hp, "f32", total)  # .contiguous() of the permuted sum
    del total
    out = new_op(m, sp * hp, "f32", out, d_res)  # + D_residual; [:, :q] is a view
    del (
        xs,
        a,
        bb,
        cc,
        d_res,
        a_cum,
        ell,
        g,
        mm,
        y_diag,
        decay,
        b_decay,
        prev,
        small,
        out_decay,
        c_states,
        y_off,
    )
    del dt
    return out, new_states


def _step(m: CausalLM, mb: Mamba2Spec, a: T, x: T, dt: T, bc: tuple[T, T], state: T) -> T:
    """mamba2_selective_state_update for one token: returns [b, heads, head_dim] in the activation dtype."""
    b, hp, hn, pn = m.cfg.batch, mb.inner, mb.heads * mb.state_size, mb.inner * mb.state_size
    dt = new_op(m, b * hp, dt.dt, dt)  # + dt_bias over the expanded head_dim
    dt = new_op(m, b * hp, dt.dt, dt)  # softplus
    dtf = new_op(m, b * hp, "f32", dt)
    da = new_op(m, b * pn, "f32", new_op(m, b * pn, "f32", dtf, a))  # exp(dt * A)
    del dtf
    bx = new_op(m, b * hn, bc[0].dt, bc[0])  # B expanded .contiguous()
    db = new_op(m, b * pn, promote(dt.dt, bx.dt), dt, bx)
    del bx
    dbx = new_op(m, b * pn, db.dt, db, x)
    del db
    sa = new_op(m, b * pn, "f32", state, da)
    del da
    ssm = new_op(m, b * pn, "f32", sa, dbx)  # copied into the state
    del sa, dbx
    cx = new_op(m, b * hn, bc[1].dt, bc[1])
    ssm_c = new_op(m, b * pn, cx.dt, ssm)
    del ssm
    out = new_op(m, b * hp, cx.dt, ssm_c, cx)  # bmm
    del ssm_c, cx
    xd = new_op(m, b * hp, x.dt, x)  # hidden_states * D
    return new_op(m, b * hp, out.dt, out, xd)


def _gated_norm(m: CausalLM, mb: Mamba2Spec, pre: str, y: T, gate: T) -> T:
    """NemotronHRMSNormGated: fp32 states times silu(fp32 gate), normalised per group, the weight times it
    (in the input's dtype: fp32 here)."""
    s, t = m.s, m.cfg.tokens
    rows = t * mb.groups
    g32 = s.cast(gate, "f32")
    sig = new_op(m, g32.n, "f32", g32, saved=(g32,))
    del g32
    hs = new_op(m, y.n, "f32", y, sig, saved=(y, sig))
    del sig
    sq = new_op(m, hs.n, "f32", hs, saved=(hs,))
    mean = new_op(m, rows, "f32", sq)
    del sq
    inv = new_op(m, rows, "f32", new_op(m, rows, "f32", mean), keep_out=True)
    del mean
    normed = new_op(m, hs.n, "f32", hs, inv, saved=(hs, inv))
    del hs, inv
    w = m.param(f"{pre}.norm.weight")
    return new_op(m, normed.n, promote(w.dt, normed.dt), w, normed, saved=(w, *_for_grad(w, normed)))


def mamba2(m: CausalLM, i: int, x: T) -> T:
    """NemotronHMamba2Mixer.forward from the normed input. The conv's output (the views x, B, C) and
    ``in_proj``'s (gate, dt) stay to the end, as does the final state of a prefill with a cache."""
    s, mb = m.s, m.spec.mamba
    assert mb is not None and mb.kind == "mamba2"
    prev, s.region = s.region, "attention"
    pre = f"layers.{i}.mixer"
    t, q = m.cfg.tokens, m.cfg.q
    if mb.mup:  # FalconH1Mixer: hidden_states * ssm_in_multiplier, a new tensor (the mixer's input dtype)
        x = m.o.mul(x, None)
    proj = m.linear(x, f"{pre}.in_proj")
    if mb.mup:  # projected_states * mup_vector: a buffer in the weights' dtype, which MulBackward saves
        proj = new_op(m, proj.n, promote(proj.dt, m.cfg.param_dt), proj)
    a_log = s.cast(m.param(f"{pre}.A_log"), "f32")
    a = new_op(m, mb.heads, "f32", new_op(m, mb.heads, "f32", a_log, keep_out=True))  # -exp(A_log)
    del a_log
    gate, xbc, dt = _view(proj, t * mb.inner), _view(proj, t * mb.conv_dim), _view(proj, t * mb.heads)
    conv_out = conv(m, i, f"{pre}.conv1d", xbc, (mb.conv_dim, mb.conv_kernel))
    del xbc
    dtype = x.dt
    del x  # split() rebinds hidden_states: FalconH1Mixer's scaled input dies here (the caller keeps its own)
    n_bc = t * mb.groups * mb.state_size
    xs, bc = _view(conv_out, t * mb.inner), (_view(conv_out, n_bc), _view(conv_out, n_bc))
    st = m.cache.state if m.cache is not None else None
    init = st.recurrent_state(i) if st is not None else None
    final = None
    if init is not None and q == 1:
        y = _step(m, mb, a, xs, dt, bc, init)
    else:
        y, final = _scan(m, mb, (pre, a), xs, dt, bc, init)
        if st is None:
            final = None  # return_final_states=False: the states die with the scan
        elif init is None:
            st.init_recurrent(i)  # update_recurrent_state copies the final state into it
    if mb.gated_norm:
        normed = _gated_norm(m, mb, pre, y, gate)
    else:  # FalconH1Mixer without mamba_rms_norm: scan_output * silu(gate)
        sig = m.o.silu(gate)
        normed = m.o.mul(y, sig, y.n)
        del sig
    del y
    low = s.cast(normed, dtype)  # scan_output.to(dtype), the mixer input's dtype
    out = m.linear(low, f"{pre}.out_proj")
    del low, normed, xs, bc, conv_out, dt, gate, proj, final, a
    s.region = prev
    return out


@register(MIXERS, "mamba2")
def mixer(m: CausalLM, i: int, x: T, *_: object) -> tuple[T, None]:
    """The same mixer as the token mixer of a two-sub-layer layer (GraniteMoeHybridMambaLayer, BambaMixer:
    NemotronHMamba2Mixer's ops): (output, None)."""
    return mamba2(m, i, x), None


@register(BLOCKS, "single")
def single_layer(
    m: CausalLM, i: int, hidden_states: T, cos: T | None, sin: T | None, mask: T | None
) -> tuple[T, T | None]:
    """NemotronHBlock.forward: the residual, one norm, the layer's mixer (Mamba-2, attention or MLP), the
    residual add."""
    o, s = m.o, m.s
    kind = m.spec.resolved_layer_types[i]
    residual = hidden_states
    s.tr.where = f"layer {i} {kind}"
    hidden_states = m.region_norm(hidden_states, f"layers.{i}.norm0")
    weights = None
    if kind == "mamba":
        out = mamba2(m, i, hidden_states)
    elif kind == "mlp":
        out = mlp.mlp(m, i, hidden_states)
    else:
        out, weights = attention.attention(m, i, hidden_states, cos, sin, mask)
    del hidden_states
    s.region = "hidden_states"
    return o.add(residual, out), weights
