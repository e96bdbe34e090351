"""Kimi Delta Attention on symbolic tensors (``models/kimi_linear/modeling_kimi_linear.py``
``KimiLinearDeltaAttention.forward``, ``chunk_kimi_delta_attention``, ``recurrent_kimi_delta_attention``;
``models/bailing_hybrid/modeling_bailing_hybrid.py`` ``BailingHybridDeltaAttention``, transformers 5.24).

A gated DeltaNet whose decay is per channel, not per head: the torch fallback (what the traces measure, and
what a GPU without fla's ``chunk_kda`` kernel runs) builds an fp32 decay mask ``[b, heads, chunks, chunk,
chunk, head_dim]`` (64 x head_dim floats per padded position and head) and two products of that size for the
intra-chunk attention, then solves the chunk's triangular system row by row (a Python loop over the chunk's
rows, each cloning a [i, i] block). The projections, the causal conv and the cache's conv / recurrent states
are the gated DeltaNet's (:mod:`.linear_attention`, :mod:`.delta_rule`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumem_gui.core.replay import causal_conv
from gpumem_gui.core.replay.delta_rule import _l2norm, _to_f32, new_op
from gpumem_gui.core.replay.memory import T
from gpumem_gui.core.replay.registry import MIXERS, register
from gpumem_gui.core.replay.scan import run_scan
from gpumem_gui.core.replay.sym import chunks

if TYPE_CHECKING:
    from gpumem_gui.core.replay.autograd import Node, Sim
    from gpumem_gui.core.replay.context import CausalLM
    from gpumem_gui.core.replay.memory import Storage
    from gpumem_gui.core.spec.linear import LinearAttentionSpec


def _bcast(m: CausalLM, n: object, a: T, b: T, saves: bool = True) -> T:
    """An fp32 product of ``n`` elements whose operands broadcast; a difference saves nothing. Its backward
    (MulBackward0) returns both gradients at the output's size, the engine's validate_outputs then sums each
    down to its operand's shape (``at::sum_to``): two full-size temporaries at once (a difference's first
    gradient is the incoming one itself)."""
    out = m.s.new(n, "f32")
    m.s.node("custom", (a, b), (out,), (a, b) if saves else (), _bw_bcast if saves else _bw_sub)
    return out


def _bw_bcast(sim: Sim, nd: Node, gout: list[Storage | None], first: bool = True) -> list[Storage | None]:
    n_out = nd.out_meta[0][0]
    full: list[Storage | None] = []
    for i, e in enumerate(nd.edges):
        keep = not first and i == 0  # SubBackward0 hands the incoming gradient on as the first one
        full.append(None if e is None else gout[0] if keep else sim.storage(n_out * 4, "temporaries"))
    out: list[Storage | None] = []
    for i, g in enumerate(full):
        n_in = nd.in_meta[i][0]
        out.append(g if g is None or n_in >= n_out else sim.storage(n_in * 4, "temporaries"))
    del full
    return out


def _bw_sub(sim: Sim, nd: Node, gout: list[Storage | None]) -> list[Storage | None]:
    return _bw_bcast(sim, nd, gout, first=False)


def _forget_gate(m: CausalLM, pre: str, x: T, la: LinearAttentionSpec) -> T:
    """KimiLinearForgetGate: f_b_proj(f_a_proj(x)).float() + dt_bias, ``-exp(A_log) * softplus`` (a where of
    exp / log), fp32 out; BailingHybridForgetGate: f_proj(x).float() + dt_bias, ``lower_bound * sigmoid(
    exp(A_log) * g)`` (kda_safe_gate) or ``-exp(A_log) * softplus(g)``, cast to the activation dtype."""
    n = x.n // m.spec.hidden_size * la.key_dim
    if la.kda_gates == "low_rank":
        raw = m.linear(m.linear(x, f"{pre}.forget_gate.f_a_proj"), f"{pre}.forget_gate.f_b_proj")
    else:
        raw = m.linear(x, f"{pre}.forget_gate.f_proj")
    g = new_op(m, n, "f32", m.s.cast(raw, "f32"), m.param(f"{pre}.forget_gate.dt_bias"))
    del raw
    rate = new_op(m, la.key_heads, "f32", m.param(f"{pre}.forget_gate.A_log"), keep_out=True)  # A_log.exp()
    if la.kda_gates == "low_rank":
        cond = new_op(m, n, "bool", g)  # g > 20.0
        e = new_op(m, n, "f32", g, keep_out=True)  # torch.exp(g)
        one = new_op(m, n, "f32", e)  # 1.0 + exp(g)
        del e
        log = new_op(m, n, "f32", one, saved=(one,))
        del one
        sp = new_op(m, n, "f32", g, log, saved=(cond,))  # torch.where
        del cond, log, g
        neg = new_op(m, la.key_heads, "f32", rate)
        return _bcast(m, n, neg, sp)
    if la.kda_gates == "full_safe":
        scaled = _bcast(m, n, rate, g)
        del g
        sig = new_op(m, n, "f32", scaled, keep_out=True)
        del scaled
        out = new_op(m, n, "f32", sig)  # lower_bound * sigmoid
    else:
        sp = new_op(m, n, "f32", g, saved=(g,))  # F.softplus
        del g
        neg = new_op(m, la.key_heads, "f32", rate)
        out = _bcast(m, n, neg, sp)
    return m.s.cast(out, x.dt)  # gate.to(hidden_states.dtype)


def _gated_norm(m: CausalLM, pre: str, x: T, gate: T, rows: object) -> T:
    """KimiLinearRMSNormGated (sigmoid): fp32 normalise, times the fp32 weight, times sigmoid of the fp32
    gate, cast back to the input dtype."""
    s, dt = m.s, x.dt
    hs = s.cast(x, "f32")
    var = new_op(m, rows, "f32", new_op(m, hs.n, "f32", hs, saved=(hs,)))
    inv = new_op(m, rows, "f32", new_op(m, rows, "f32", var), keep_out=True)
    del var
    hs = new_op(m, hs.n, "f32", hs, inv, saved=(hs, inv))
    del inv
    w = s.cast(m.param(f"{pre}.o_norm.weight"), "f32")
    hs = _bcast(m, hs.n, w, hs)
    g32 = s.cast(gate, "f32")
    sig = new_op(m, g32.n, "f32", g32, keep_out=True)
    del g32
    out = new_op(m, hs.n, "f32", hs, sig, saved=(hs, sig))
    del hs, sig
    return s.cast(out, dt)


@register(MIXERS, "kda")
def kda(m: CausalLM, i: int, x: T, *_: object) -> tuple[T, None]:
    """KimiLinearDeltaAttention.forward from the normed input; returns (output, None)."""
    s, la = m.s, m.spec.linear_attention
    assert la is not None
    prev, s.region = s.region, "attention"
    pre, t = f"layers.{i}.self_attn", m.cfg.tokens
    q, k, v = (m.linear(x, f"{pre}.{p}") for p in ("q_proj", "k_proj", "v_proj"))
    held = [new_op(m, q.n + k.n + v.n, q.dt, q, k, v)]  # torch.cat(...).transpose(1, 2): a view of the cat
    del q, k, v
    conv = causal_conv.conv(m, i, held.pop(), pre)
    query, key, value = (T(conv.st, t * la.key_dim, conv.dt, conv.rg, conv.fn, conv.idx) for _ in range(3))
    g = _forget_gate(m, pre, x, la)
    beta = new_op(m, t * la.key_heads, x.dt, m.linear(x, f"{pre}.b_proj"), keep_out=True)  # sigmoid
    st = m.cache.state if m.cache is not None else None
    init = st.recurrent_state(i) if st is not None else None
    if init is not None and m.cfg.q == 1:
        core = _recurrent(m, la, (query, key, value), g, beta, init)
    else:
        core = _chunk(m, la, (query, key, value), g, beta, init)
    if st is not None and init is None:
        st.init_recurrent(i)  # update_recurrent_state copies the final state into it
    del query, key, value, conv, g, beta
    if la.kda_gates == "low_rank":
        gate = m.linear(m.linear(x, f"{pre}.g_a_proj"), f"{pre}.g_b_proj")
    else:
        gate = m.linear(x, f"{pre}.g_proj")
    core = _gated_norm(m, pre, core, gate, t * la.key_heads)
    del gate
    out = m.linear(core, f"{pre}.o_proj")
    del core
    s.region = prev
    return out, None


def _prepare(m: CausalLM, la: LinearAttentionSpec, qkv: tuple[T, T, T], g: T, beta: T) -> tuple[T, ...]:
    """``x.transpose(1, 2).contiguous().to(float32)`` of q, k, v, beta, g; l2norm of q and k in fp32."""
    q = m.cfg.q
    query, key, value, beta, g = (_to_f32(m, x, q == 1) for x in (*qkv, beta, g))
    rows = m.cfg.batch * la.key_heads * q
    return _l2norm(m, query, rows), _l2norm(m, key, rows), value, beta, g


def _chunk(m: CausalLM, la: LinearAttentionSpec, qkv: tuple[T, T, T], g: T, beta: T, state: T | None) -> T:
    """chunk_kimi_delta_attention(use_qk_l2norm_in_kernel=True): the output in the input dtype; the fp32
    final state stays with the cache (``state`` read in place, or zeros)."""
    cfg, o = m.cfg, m.o
    b, c, d, dt = cfg.batch, la.chunk_size, la.key_head_dim, qkv[0].dt
    query, key, value, beta, g = _prepare(m, la, qkv, g, beta)
    nc = chunks(cfg.q, c)
    rows = b * la.key_heads * nc * c  # padded positions over all heads
    big = rows * c * d  # one [b, h, chunks, c, c, d] tensor
    query = new_op(m, rows * d, "f32", new_op(m, rows * d, "f32", query))  # F.pad(...) * scale
    key, value, g = (new_op(m, rows * d, "f32", x) for x in (key, value, g))
    beta = new_op(m, rows, "f32", beta)
    v_beta = _bcast(m, rows * d, value, beta)
    k_beta = _bcast(m, rows * d, key, beta)
    g = new_op(m, rows * d, "f32", g)  # cumsum(dim=-2)
    masks = [new_op(m, c * c, "bool", new_op(m, c * c, "bool")) for _ in range(2)]  # ones(...).triu
    diff = _bcast(m, big, g, g, saves=False)  # g.unsqueeze(-2) - g.unsqueeze(-3)
    diff = new_op(m, big, "f32", diff, saved=(masks[1],))  # masked_fill(strict_mask, -inf)
    decay = new_op(m, big, "f32", diff, keep_out=True)  # exp
    del diff
    prod = _bcast(m, big, k_beta, key)
    prod = new_op(m, big, "f32", prod, decay, saved=(prod, decay))
    attn = new_op(m, rows * c, "f32", prod)  # sum(-1)
    del prod
    attn = new_op(m, rows * c, "f32", new_op(m, rows * c, "f32", attn), saved=(masks[0],))  # -x, masked_fill
    attn = _solve_rows(m, attn, rows // c, c)
    attn = new_op(m, rows * c, "f32", attn, new_op(m, c * c, "f32"))  # + torch.eye
    value = o.bmm(attn, v_beta, rows * d)
    eg = new_op(m, rows * d, "f32", g, keep_out=True)
    k_cumdecay = o.bmm(attn, new_op(m, rows * d, "f32", k_beta, eg, saved=(k_beta, eg)), rows * d)
    del eg, attn, v_beta, k_beta
    last = state if state is not None else m.s.new(b * la.recurrent_state_elems, "f32")
    core = m.s.new(rows * d, "f32")  # zeros_like(value)
    mask = new_op(m, c * c, "bool", new_op(m, c * c, "bool"))
    n_iter = nc if m.s.grad_enabled else min(nc, 2)
    last = _scan(m, la, (query, key, value, g, decay, k_cumdecay), core, last, mask, n_iter)  # lives on
    flat = new_op(m, rows * d, "f32", core)  # [:, :, :s].transpose(1, 2).contiguous()
    del core
    return new_op(m, b * cfg.q * la.key_heads * d, dt, flat)  # .to(initial_dtype)


def _scan(
    m: CausalLM, la: LinearAttentionSpec, per_chunk: tuple[T, ...], core: T, last: T, mask: T, n: int
) -> T:
    """The inter-chunk loop, ``n`` iterations in steps that do not grow with ``n`` (:mod:`.scan`)."""

    def step(it: int, carry: T) -> T:
        return _scan_step(m, la, per_chunk, core, carry, mask, it == n - 1)

    return run_scan(m.s, n, step, last, lambda carry: carry)


def _solve_rows(m: CausalLM, attn: T, blocks: object, c: int) -> T:
    """``for i in range(1, chunk): attn[..., i, :i] = row + (row.unsqueeze(-1) * sub).sum(-2)`` with row and
    sub cloned: in training every iteration's row and sub stay saved for the product's backward."""
    for i in range(1, c):
        row = new_op(m, blocks * i, "f32", attn)  # type: ignore[operator]
        sub = new_op(m, blocks * i * i, "f32", attn)  # type: ignore[operator]
        prod = _bcast(m, blocks * i * i, row, sub)  # type: ignore[operator]
        red = new_op(m, blocks * i, "f32", prod)  # type: ignore[operator]
        del prod
        upd = new_op(m, red.n, "f32", row, red)
        del red, row, sub
        m.s.node("pass", (upd, attn), (attn,))  # the in-place slice assignment (CopySlices)
        del upd
    return attn


def _scan_step(
    m: CausalLM, la: LinearAttentionSpec, per_chunk: tuple[T, ...], core: T, last: T, mask: T, final: bool
) -> T:
    """One chunk of the inter-chunk loop: the decayed query against the state, the intra-chunk attention
    (two [b, h, c, c, d] products), v_new, the output slice, the new state."""
    o, b, c, d = m.o, m.cfg.batch, la.chunk_size, la.key_head_dim
    blk = b * la.key_heads * c * d
    q_i, k_i, v_i, g_i, dm_i, kc_i = (
        T(x.st, blk if x is not per_chunk[4] else blk * c, x.dt) for x in per_chunk
    )
    for src, view in zip(per_chunk, (q_i, k_i, v_i, g_i, dm_i, kc_i), strict=True):
        m.s.node("copy", (src,), (view,))
    eg = new_op(m, blk, "f32", g_i, keep_out=True)
    inter = o.bmm(new_op(m, blk, "f32", q_i, eg, saved=(q_i, eg)), last, blk)
    del eg
    prod = _bcast(m, blk * c, q_i, k_i)
    prod = new_op(m, blk * c, "f32", prod, dm_i, saved=(prod, dm_i))
    cc = b * la.key_heads * c * c  # [b, h, c, c]
    intra = new_op(m, cc, "f32", new_op(m, cc, "f32", prod), saved=(mask,))  # sum(-1), masked_fill
    del prod
    v_new = new_op(m, blk, "f32", v_i, o.bmm(kc_i, last, blk))
    out = new_op(m, blk, "f32", inter, o.bmm(intra, v_new, blk))
    del inter, intra
    m.s.node("pass", (out, core), (core,))  # core_attn_out[:, :, i] = ...
    del out
    grad = m.s.grad_enabled  # without a cache the last state is dropped (output_final_state=False)
    m.s.grad_enabled = grad and not (final and m.cache is None)
    small = b * la.key_heads * d
    e_last = new_op(m, small, "f32", g_i, keep_out=True)
    decayed = _bcast(m, last.n, last, e_last)
    e = _bcast(m, blk, g_i, g_i, saves=False)  # g_i[:, :, -1:] - g_i
    e = new_op(m, blk, "f32", e, keep_out=True)  # .exp()
    kd = new_op(m, blk, "f32", k_i, e, saved=(k_i, e))
    del e
    last = new_op(m, last.n, "f32", decayed, o.bmm(kd, v_new, last.n))
    del decayed, kd, v_new
    m.s.grad_enabled = grad
    return last


def _recurrent(m: CausalLM, la: LinearAttentionSpec, qkv: tuple[T, T, T], g: T, beta: T, state: T) -> T:
    """recurrent_kimi_delta_attention for one token after a cached state: fp32 copies, the state decayed per
    channel, read, corrected and read again, each an fp32 [b, h, dk, dv] temporary."""
    b, dt, dv = m.cfg.batch, qkv[0].dt, la.value_head_dim
    query, key, value, beta, g = _prepare(m, la, qkv, g, beta)
    query = new_op(m, query.n, "f32", query)  # * scale
    small = b * la.key_heads
    core = m.s.new(small * dv, "f32")  # zeros
    e = new_op(m, g.n, "f32", g, keep_out=True)  # g[:, i][..., None].exp()
    last = new_op(m, state.n, "f32", state, e, saved=(state, e))
    kv_mem = new_op(m, small * dv, "f32", new_op(m, last.n, "f32", last, key, saved=(last, key)))
    delta = new_op(m, small * dv, "f32", new_op(m, small * dv, "f32", value, kv_mem), beta)
    last = new_op(m, last.n, "f32", last, new_op(m, last.n, "f32", key, delta, saved=(key, delta)))
    read = new_op(m, small * dv, "f32", new_op(m, last.n, "f32", last, query, saved=(last, query)))
    m.s.node("pass", (read, core), (core,))
    del read, last, kv_mem, delta
    return new_op(m, small * dv, dt, core)
