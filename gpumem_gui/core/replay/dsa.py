"""DeepSeek Sparse Attention (transformers 5.24 ``models/deepseek_v32/modeling_deepseek_v32.py``) on symbolic
tensors: ``DeepseekV32Attention.forward`` (MLA whose locals all live until the return), its lightning indexer
``DeepseekV32Indexer.forward`` (``@torch.no_grad``) and the top-k mask folded into the attention mask.

* indexer: ``wq_b(q_resid)``, ``k_norm(wk(x))`` (a LayerNorm), half-split rotary of the first
  ``qk_rope_head_dim`` channels, the concatenated indexer key cache (``cache.update_indexer``), fp32 scores
  ``matmul(q.float(), k^T.float().unsqueeze(1))`` whose broadcast key operand torch's matmul expands into a
  ``[b * q, d, kv]`` copy, scaled, ReLU'd, weighted by ``weights_proj`` (``x.to(weight dtype)``), masked
  (``masked_fill(~mask)`` for SDPA's boolean mask, ``+ mask`` for eager's float one), ``topk`` (fp32 values,
  int64 indices) cast to int32;
* the sparse mask: ``new_ones`` bool ``[b, q, kv]`` scattered (out of place) with ``indices.long()``, then
  ``mask & ~index_mask`` (boolean) or ``mask.masked_fill(index_mask, min)`` (float).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumem_gui.core.replay import attention_kernels as attention
from gpumem_gui.core.replay.memory import T
from gpumem_gui.core.replay.registry import AFTER_LAYERS

if TYPE_CHECKING:
    from gpumem_gui.core.replay.context import CausalLM


def applies(m: CausalLM) -> bool:
    return m.spec.mla is not None and m.spec.mla.indexer is not None


def mla(m: CausalLM, i: int, x: T, cos: T | None, sin: T | None, mask: T | None) -> tuple[T, T | None]:
    """DeepseekV32Attention.forward and AXK1Attention.expand_kv."""
    o, s, spec, cfg = m.o, m.s, m.spec, m.cfg
    ml = spec.mla
    assert ml is not None
    pre = f"layers.{i}.self_attn"
    t, a = cfg.tokens, spec.num_attention_heads
    nope, rot, r, vd = ml.qk_nope_head_dim, ml.qk_rope_head_dim, ml.kv_lora_rank, ml.v_head_dim
    q_resid = m.norm(m.linear(x, f"{pre}.q_a_proj"), f"{pre}.q_a_layernorm")
    q_states = o.view(m.linear(q_resid, f"{pre}.q_b_proj"), copy_grad=True)
    q_pass, q_rot = attention.split(m, q_states, (t * a * nope, t * a * rot))
    compressed_kv = m.linear(x, f"{pre}.kv_a_proj_with_mqa")
    kv_pass, k_rot = attention.split(m, compressed_kv, (t * r, t * rot))
    k_pass = m.norm(kv_pass, f"{pre}.kv_a_layernorm")
    if cos is not None and sin is not None:
        q_rot, k_rot = attention.rope(m, q_rot, k_rot, cos, sin)
    if m.cache is not None:
        k_pass, k_rot = m.cache.update(i, k_pass, k_rot, cfg.q)
    query_states = o.cat(q_pass, q_rot)
    kv = cfg.batch * cfg.kv_len
    expanded = o.view(m.linear(k_pass, f"{pre}.kv_b_proj"), copy_grad=True)
    k_nope, value_states = attention.split(m, expanded, (kv * a * nope, kv * a * vd))
    del expanded
    key_states = s.new(kv * a * (nope + rot), query_states.dt)
    s.node("copy", (k_nope, k_rot), (key_states,))
    del k_nope
    topk = _topk(m, i, x, q_resid, cos, sin, mask)
    sparse_mask, index_mask = _sparse_mask(m, topk, mask, query_states.dt)
    out, weights = attention.kernel(
        m, query_states, key_states, value_states, sparse_mask, a, a, nope + rot, vd
    )
    out = m.linear(out, f"{pre}.o_proj")
    # every local (q_resid, q_states' views, compressed_kv's, the expanded K/V, both masks) lives until here
    del q_resid, q_pass, q_rot, compressed_kv, kv_pass, k_rot, k_pass, query_states, key_states, value_states
    del topk, sparse_mask, index_mask
    return out, weights


def _topk(m: CausalLM, i: int, x: T, q_resid: T, cos: T | None, sin: T | None, mask: T | None) -> T:
    """This layer's top-k indices: its indexer's, or (GlmMoeDsaAttention ``skip_topk``) the previous
    layer's. When the model's loop carries them (GlmMoeDsaModel), the previous layer's stay alive until this
    layer returns; the ones before that are gone."""
    ml = m.spec.mla
    assert ml is not None and ml.indexer is not None
    ix = ml.indexer
    prev: T | None = getattr(m, "dsa_topk", None)
    m.dsa_topk_older = None  # type: ignore[attr-defined]
    if ix.has_indexer(i):
        top = indexer(m, i, x, q_resid, cos, sin, mask)
    elif prev is not None:
        top = prev
    else:  # the full layer before it ran unreplayed: its indices as the loop hands them on
        top = m.s.new(m.cfg.batch * m.cfg.q * min(ix.topk, m.cfg.kv_len), "i32")
    if ix.carries_topk:
        m.dsa_topk_older, m.dsa_topk = prev, top  # type: ignore[attr-defined]
    return top


def _layer_norm(m: CausalLM, x: T, name: str) -> T:
    """nn.LayerNorm (weight and bias): the output, and fp32 mean / rstd per row (saved for backward)."""
    s = m.s
    w, b = m.param(f"{name}.weight"), m.param(f"{name}.bias")
    rows = x.n // m.shape[f"{name}.weight"][0]
    out = s.new(x.n, x.dt)
    mean, rstd = s.new(rows, "f32"), s.new(rows, "f32")
    s.node("multi", (x, w, b), (out,), (x, w, b, mean, rstd))
    return out


def indexer(m: CausalLM, i: int, x: T, q_resid: T, cos: T | None, sin: T | None, mask: T | None) -> T:
    """DeepseekV32Indexer.forward under no_grad; returns the int32 top-k indices [b, q, topk]."""
    o, s, spec, cfg = m.o, m.s, m.spec, m.cfg
    assert spec.mla is not None and spec.mla.indexer is not None
    ix, rot = spec.mla.indexer, spec.mla.qk_rope_head_dim
    pre = f"layers.{i}.self_attn.indexer"
    grad, s.grad_enabled = s.grad_enabled, False
    b, t, sq, kvl = cfg.batch, cfg.tokens, cfg.q, cfg.kv_len
    h, d = ix.n_heads, ix.head_dim
    q = m.linear(q_resid, f"{pre}.wq_b")
    q_rot, q_pass = attention.split(m, q, (t * h * rot, t * h * (d - rot)))
    k = _layer_norm(m, m.linear(x, f"{pre}.wk"), f"{pre}.k_norm")
    k_rot, k_pass = attention.split(m, k, (t * rot, t * (d - rot)))
    if cos is not None and sin is not None:
        q_rot, k_rot = attention.rope(m, q_rot, k_rot, cos, sin)
    q = o.cat(q_rot, q_pass)
    k = o.cat(k_rot, k_pass)
    if m.cache is not None:
        k = m.cache.update_indexer(i, sq)
    q32, k32 = s.cast(q, "f32"), s.cast(k, "f32")
    # matmul expands the key operand to [b, q, d, kv] and reshapes it to [b * q, d, kv]: a view for one
    # sequence (the stride-0 query dim merges with the size-1 batch), a copy for several
    k_wide = s.new(b * sq * d * kvl, "f32") if b > 1 else None
    raw = s.new(b * sq * h * kvl, "f32")
    del k_wide
    scaled = o.mul(raw, None)  # the fp32 copies and the product die with the statement
    del raw, q32, k32
    scores = o.mul(scaled, None)  # F.relu
    del scaled
    w_dt = m.param(f"{pre}.weights_proj.weight").dt
    proj = m.linear(s.cast(x, w_dt) if x.dt != w_dt else x, f"{pre}.weights_proj")
    weights = o.mul(s.cast(proj, "f32") if proj.dt != "f32" else proj, None)
    del proj
    index_scores = s.new(b * sq * kvl, "f32")
    if mask is not None and mask.dt == "bool":
        inv = s.new(mask.n, "bool")
        index_scores = o.mul(index_scores, None)  # masked_fill(~mask, -inf)
        del inv
    elif mask is not None:
        index_scores = o.add(index_scores, mask, index_scores.n)
    k_top = min(ix.topk, kvl)
    values, idx64 = s.new(b * sq * k_top, "f32"), s.new(b * sq * k_top, "i64")
    top = s.new(b * sq * k_top, "i32")
    # the indexer's locals (q, k and their rotary parts, scores, weights, index_scores) live until its return
    del values, idx64, q, k, q_rot, q_pass, k_rot, k_pass, scores, weights, index_scores
    s.grad_enabled = grad
    return top


def _sparse_mask(m: CausalLM, top: T, mask: T | None, dt: str) -> tuple[T | None, T]:
    """The eager / SDPA paths: index_mask = new_ones(...).scatter(-1, top.long(), False), folded into the
    attention mask (a new tensor)."""
    s, cfg = m.s, m.cfg
    n = cfg.batch * cfg.q * cfg.kv_len
    ones = s.new(n, "bool")
    idx64 = s.new(top.n, "i64")
    index_mask = s.new(n, "bool")
    del ones, idx64
    if mask is None:
        return None, index_mask
    if mask.dt == "bool":
        inv = s.new(n, "bool")
        out = s.new(mask.n, "bool")
        del inv
        return out, index_mask
    return s.new(mask.n, dt), index_mask


def release(m: CausalLM) -> None:
    """The end of the model's layer loop: the top-k indices it carried (GlmMoeDsaModel) are no longer held."""
    if getattr(m, "dsa_topk", None) is not None or getattr(m, "dsa_topk_older", None) is not None:
        m.dsa_topk = m.dsa_topk_older = None  # type: ignore[attr-defined]


AFTER_LAYERS.append(release)
