"""MiniMax's lightning attention and decoder layer on symbolic tensors (``models/minimax/modeling_minimax.py``
``MiniMaxLightningAttention.forward`` and ``MiniMaxDecoderLayer.forward``, transformers 5.24).

Lightning attention: ``qkv_proj`` and its SiLU, split into q, k, v views. A first forward walks the prompt in
blocks of ``block_size`` tokens (the last one shorter): per block ``Q K^T`` [b, h, n, n], times the diagonal
decay buffer, ``@ V`` (intra), ``(Q * query_decay) @ KV`` (inter), their sum appended to a list,
``(K * key_decay)^T V`` and the decayed running ``KV`` [b, h, d, d]; the loop's last locals live until the
layer returns. A cached forward walks token by token (``K^T V``, ``ratio * KV +``, ``Q @ KV``). The outputs
are concatenated, transposed and reshaped (a copy), RMS-normed, gated by ``sigmoid(output_gate(x))`` and
projected by ``out_proj``. ``torch.matmul`` of the [b, h, n, d] views of the [b, s, h, 3d] projection copies
them into contiguous batches when the batch has more than one sequence. The cache (``MiniMaxCache``) keeps
the final ``KV`` itself, in the values' dtype, per sequence and layer; a cached forward replaces it. Without
a cache (training) the last block's ``KV`` update feeds nothing: modelled without saved tensors, which
autograd frees with the dead branch and a checkpoint's recomputation does not keep.

This is transformers' own code on every device: MiniMax has no fused lightning kernel in transformers (vLLM
and SGLang have Triton ones, whose scratch differs).

Decoder layer: the norm's output is the residual (``residual = input_layernorm(x)``), and each sub-layer
ends in ``residual * alpha + out * beta`` (two products and a sum, whatever the factors).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumem_gui.core.replay import attention, mlp
from gpumem_gui.core.replay.delta_rule import new_op
from gpumem_gui.core.replay.memory import T, promote
from gpumem_gui.core.replay.registry import BLOCKS, register
from gpumem_gui.core.replay.scan import run_scan
from gpumem_gui.core.replay.sym import chunks

if TYPE_CHECKING:
    from gpumem_gui.core.replay.context import CausalLM


def _view(src: T, n: object) -> T:
    return T(src.st, n, src.dt, src.rg, src.fn, src.idx)


def _mm(m: CausalLM, a: T, b: T, n_out: object, batched: bool) -> T:
    """torch.matmul of two [b, h, ., .] tensors: contiguous copies of strided inputs first (``batched``:
    more than one sequence), then bmm, which saves each input the other's gradient needs."""
    if batched:
        a, b = new_op(m, a.n, a.dt, a), new_op(m, b.n, b.dt, b)
    return m.o.bmm(a, b, n_out)  # type: ignore[arg-type]


def _blockwise(m: CausalLM, i: int, qkv: T) -> tuple[T, T, list[T]]:
    """The first forward's block loop; returns (the concatenated outputs [b, h, s, d], the final KV, the
    loop's last locals)."""
    la, cfg = m.spec.linear_attention, m.cfg
    assert la is not None
    b, q, h, d, bs = cfg.batch, cfg.q, la.key_heads, la.key_head_dim, la.chunk_size
    bdt, vdt, batched = cfg.param_dt, qkv.dt, cfg.batch > 1
    st = m.cache.state if m.cache is not None else None
    kv = m.s.new(b * h * d * d, vdt)  # torch.zeros(b, h, d, d, dtype=value_states.dtype)
    outs: list[T] = []
    nb = chunks(q, bs)

    # the loop's variables, each replaced where the loop assigns it (the old value lives until then, and the
    # last ones outlive the loop, as Python keeps them)
    v: dict[str, T] = {"kv": kv}
    del kv

    def step(blk: int, v: dict[str, T]) -> dict[str, T]:
        n = bs if blk < nb - 1 else q - bs * (nb - 1)
        qb, kb, v["vb"] = _view(qkv, b * h * n * d), _view(qkv, b * h * n * d), _view(qkv, b * h * n * d)
        v["decay"] = new_op(m, h, bdt, new_op(m, h, bdt, new_op(m, h, bdt)))  # exp(-slope_rate * n)
        v["w_intra"] = w_intra = _mm(m, qb, kb, b * h * n * n, batched)
        weighted = new_op(m, w_intra.n, promote(w_intra.dt, bdt), w_intra)  # * diagonal_decay (a buffer)
        del w_intra
        v["o_intra"] = _mm(m, weighted, v["vb"], b * h * n * d, batched)
        del weighted
        q_dec = new_op(m, qb.n, promote(vdt, bdt), qb)  # * query_decay
        v["o_inter"] = _mm(m, q_dec, v["kv"], b * h * n * d, batched)
        del q_dec
        v["cur"] = m.o.add(v["o_inter"], v["o_intra"])
        outs.append(v["cur"])
        k_dec = new_op(m, kb.n, promote(vdt, bdt), kb)  # * key_decay
        if st is None and blk == nb - 1:  # the final KV feeds nothing without a cache: no saved tensors
            if batched:
                k_dec, v["vb"] = (
                    new_op(m, k_dec.n, k_dec.dt, k_dec),
                    new_op(m, v["vb"].n, v["vb"].dt, v["vb"]),
                )
            ka, va = m.s.ac_cast(k_dec), m.s.ac_cast(v["vb"])
            assert ka is not None and va is not None
            v["nxt"] = new_op(m, b * h * d * d, promote(ka.dt, va.dt), ka, va)
            del ka, va
        else:
            v["nxt"] = _mm(m, k_dec, v["vb"], b * h * d * d, batched)
        del k_dec
        kv = v["kv"]
        scaled = new_op(m, kv.n, promote(kv.dt, bdt), kv, v["decay"], saved=(v["decay"],))
        kv_dt = promote(scaled.dt, v["nxt"].dt)
        if st is not None and blk == nb - 1:  # set_linear_cache keeps this very tensor
            kv = st.new_state(i, kv.n, kv_dt)
            m.s.node("pass", (scaled, v["nxt"]), (kv,))
        else:
            kv = m.o.add(scaled, v["nxt"])
        v["kv"] = kv
        del scaled, kv
        return v

    # every block under autograd, in steps that do not grow with the blocks (replay/scan.py)
    v = run_scan(m.s, nb, step, v, lambda carry: carry["kv"], collected=outs)
    kv = v.pop("kv")
    last = [v[k] for k in ("w_intra", "o_intra", "o_inter", "cur", "nxt", "decay")]  # the loop's locals
    total = outs[0] if len(outs) == 1 else m.s.new(b * h * q * d, outs[0].dt)  # torch.cat(attn_output)
    if len(outs) > 1:
        m.s.node("pass", tuple(outs), (total,))
    return total, kv, last


def _tokenwise(m: CausalLM, i: int, qkv: T, kv: T) -> tuple[T, T, list[T]]:
    """A cached forward: ``ratio = exp(-slope_rate)`` and, per new token, ``K^T V``, ``ratio * KV + it``
    and ``Q @ KV`` [b, h, 1, d]; the new KV replaces the cache's."""
    la, cfg = m.spec.linear_attention, m.cfg
    assert la is not None
    st = m.cache.state if m.cache is not None else None
    assert st is not None
    b, q, h, d, bdt, batched = cfg.batch, cfg.q, la.key_heads, la.key_head_dim, cfg.param_dt, cfg.batch > 1
    ratio = new_op(m, h, bdt, new_op(m, h, bdt))
    kb, vb, qb = _view(qkv, b * h * d), _view(qkv, b * h * d), _view(qkv, b * h * d)
    cur_kv = _mm(m, kb, vb, b * h * d * d, batched)
    scaled = new_op(m, kv.n, promote(kv.dt, bdt), kv, ratio, saved=(ratio,))
    kv = st.new_state(i, kv.n, promote(scaled.dt, cur_kv.dt))
    m.s.node("pass", (scaled, cur_kv), (kv,))
    del scaled
    cur = _mm(m, qb, kv, b * h * d, batched)
    total = cur if q == 1 else m.s.new(b * h * q * d, cur.dt)  # torch.cat of one output per token
    if q != 1:
        m.s.node("pass", (cur,), (total,))
    return total, kv, [cur_kv, cur, ratio]


def lightning(m: CausalLM, i: int, x: T, *_: object) -> tuple[T, None]:
    """MiniMaxLightningAttention.forward from the normed input; returns (output, None)."""
    s, o, la = m.s, m.o, m.spec.linear_attention
    assert la is not None
    prev, s.region = s.region, "attention"
    pre = f"layers.{i}.self_attn"
    qkv = o.silu(m.linear(x, f"{pre}.qkv_proj"))  # apply_mask_to_padding_states: no padding mask
    st = m.cache.state if m.cache is not None else None
    init = st.recurrent_state(i) if st is not None else None
    if init is not None:
        attn, _kv, held = _tokenwise(m, i, qkv, init)
    else:
        attn, _kv, held = _blockwise(m, i, qkv)
    flat = new_op(m, attn.n, attn.dt, attn)  # transpose(1, 2).reshape(b, s, h * d): a copy
    del attn
    normed = m.norm(flat, f"{pre}.norm")
    del flat
    gate = m.linear(x, f"{pre}.output_gate")
    sig = new_op(m, gate.n, gate.dt, gate, keep_out=True)  # F.sigmoid
    del gate
    out = m.linear(o.mul(sig, normed), f"{pre}.out_proj")
    del sig, normed, held, qkv, _kv
    s.region = prev
    return out, None


def _scaled_sum(m: CausalLM, residual: T, out: T) -> T:
    """``residual * alpha + out * beta``: two products (python scalars) and their sum."""
    o = m.o
    return o.add(o.mul(residual, None), o.mul(out, None))


@register(BLOCKS, "minimax")
def minimax_layer(
    m: CausalLM, i: int, hidden_states: T, cos: T | None, sin: T | None, mask: T | None, *_: object
) -> tuple[T, T | None]:
    """MiniMaxDecoderLayer.forward: the normed input is the residual; lightning attention on the
    linear_attention layers, attention elsewhere; the MoE block; each sub-layer's scaled sum."""
    s = m.s
    s.tr.where = f"layer {i} attention"
    hidden_states = m.region_norm(hidden_states, f"layers.{i}.norm0")
    residual = hidden_states
    if m.spec.resolved_layer_types[i] == "linear_attention":
        hidden_states, weights = lightning(m, i, hidden_states)
    else:
        hidden_states, weights = attention.attention(m, i, hidden_states, cos, sin, mask)
    s.region = "hidden_states"
    hidden_states = _scaled_sum(m, residual, hidden_states)
    s.tr.where = f"layer {i} MLP"
    hidden_states = m.region_norm(hidden_states, f"layers.{i}.norm1")
    residual = hidden_states
    hidden_states = mlp.mlp(m, i, hidden_states)
    s.region = "hidden_states"
    return _scaled_sum(m, residual, hidden_states), weights
