"""Self-attention as transformers 5.24 runs it, on symbolic tensors: projections, rotary, cache, kernel.

* ``LlamaAttention.forward``: q/k/v projections viewed into heads, optional q/k norms (Qwen3 per head, OLMo-2
  over the whole projection), rotary (``apply_rotary_pos_emb``: ``(x * cos) + (rotate_half(x) * sin)``), the
  cache update (the concatenations become the keys and values), the kernel, ``o_proj``. A fused projection
  (:attr:`ArchTraits.fused_qkv`) is one linear split into views.
* ``DeepseekV3Attention`` (MLA): low-rank q, the compressed latent and the shared rope key cached as they are,
  re-expanded by ``kv_b_proj`` for every cached token (``expand_kv``) before the kernel.
* Kernels (``integrations/sdpa_attention.py``, ``eager_attention_forward``): SDPA with grouped heads through
  ``enable_gqa`` when there is no mask, packed queries for a single token, else K/V repeated to every head;
  the fused kernel returns the output (already in [b, q, heads, d] layout) and an fp32 log-sum-exp; torch's
  math path (fp32 copies, fp32 scores) when the fused kernel cannot take the inputs (unequal head dims, K/V
  broadcast under a mask); eager: scores, scaling, mask, softmax (fp32 unless the architecture keeps the
  activation dtype), probabilities returned to the decoder layer.

The functions take the :class:`~gpumem_gui.core.replay.model.CausalLM` they run in as ``m``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumem_gui.core.replay import chunked, cohere, dsa, gptj, output_gate, rope_partial, sinks
from gpumem_gui.core.replay.memory import T

if TYPE_CHECKING:
    from gpumem_gui.core.replay.config import ReplayConfig
    from gpumem_gui.core.replay.context import CausalLM
    from gpumem_gui.core.spec.model import ModelSpec

# SDPA takes grouped K/V heads (enable_gqa) only up to this head dim (use_gqa_in_sdpa)
_GQA_MAX_HEAD_DIM = 256


def sdpa_mask(spec: ModelSpec, cfg: ReplayConfig, sliding: bool) -> bool:
    """Whether SDPA gets a materialised (boolean) mask: always for an architecture that never skips it, else
    only for a sliding layer once the keys reach the window (``masking_utils._ignore_causal_mask_sdpa``:
    ``kv_length >= local_attention_size`` needs the mask; a causal layer uses ``is_causal``, a single query
    needs no mask)."""
    if cfg.attn == "flash":
        return False
    if spec.traits.always_mask:
        return True
    return sliding and spec.sliding_window is not None and cfg.kv_len >= spec.sliding_window


def bool_mask_elems(spec: ModelSpec, cfg: ReplayConfig) -> int:
    """Elements of SDPA's boolean mask [b, 1, q, kv] (one per batch row)."""
    return cfg.batch * cfg.q * cfg.kv_len


def attention(m: CausalLM, i: int, x: T, cos: T | None, sin: T | None, mask: T | None) -> tuple[T, T | None]:
    """One layer's self-attention from its normed input; returns (output, attention weights or None)."""
    s = m.s
    prev, s.region = s.region, "attention"
    if dsa.applies(m):  # DeepseekV32Attention: MLA with the sparse-attention indexer (replay/dsa.py)
        out, weights = dsa.mla(m, i, x, cos, sin, mask)
    elif m.spec.mla is not None:
        out, weights = _mla(m, i, x, cos, sin, mask)
    elif m.spec.traits.attention_code == "gptj":  # GPTJAttention (replay/gptj.py)
        out, weights = gptj.attention(m, i, x, cos, sin, mask)
    else:
        out, weights = _mha(m, i, x, cos, sin, mask)
    if m.spec.traits.residual_dropout:
        out = m.o.dropout(out, m.cfg.dropout)
    s.region = prev
    return out, weights


def _mha(m: CausalLM, i: int, x: T, cos: T | None, sin: T | None, mask: T | None) -> tuple[T, T | None]:
    o, s, spec, cfg = m.o, m.s, m.spec, m.cfg
    pre = f"layers.{i}.self_attn"
    t = cfg.tokens
    a, kvh, d = spec.num_attention_heads, spec.num_kv_heads, spec.head_dim
    if m.has(f"{pre}.qkv_proj.weight"):
        # one fused projection split into views (GPT-2 c_attn, Phi-3 qkv_proj, Falcon query_key_value)
        qkv = m.linear(x, f"{pre}.qkv_proj")
        q, k, v = T(qkv.st, t * a * d, qkv.dt), T(qkv.st, t * kvh * d, qkv.dt), T(qkv.st, t * kvh * d, qkv.dt)
        s.node("split", (qkv,), (q, k, v))
        del qkv
        gate = None
    else:
        # Llama 4's weightless L2 q/k norm runs after the rotary (chunked.rotate_and_scale)
        norm_first = spec.qk_norm not in ("none", "l2") and not spec.traits.qk_norm_after_rope
        q, gate = output_gate.split_q(m, x, pre)  # Qwen3NextAttention: q_proj also yields an output gate
        if norm_first:
            q = m.norm(q, f"{pre}.q_norm")
        k = o.view(m.linear(x, f"{pre}.k_proj"), copy_grad=True)
        if norm_first:
            k = m.norm(k, f"{pre}.k_norm")
        v = o.view(m.linear(x, f"{pre}.v_proj"), copy_grad=True)
    if spec.traits.key_scaled:  # FalconH1Attention: key_states * key_multiplier
        k = o.mul(k, None)
    if chunked.applies(m):  # Llama4TextAttention: complex rotary, L2 q/k norm, temperature tuning
        q, k = chunked.rotate_and_scale(m, i, q, k, cos)
    elif cos is not None and sin is not None and i not in spec.nope_layers:  # NoPE layers skip the rotary
        if spec.traits.rope_upcast:  # Cohere2: fp32 copies of q and k (replay/cohere.py)
            q, k = cohere.rope(m, q, k, cos, sin)
        else:
            q, k = (rope_partial.partial_rope if rope_partial.applies(spec) else rope)(m, q, k, cos, sin)
    if spec.traits.query_position_scale:  # Ministral3Attention: query_states * get_llama_4_attn_scale(...)
        q = rope_partial.position_scale(m, q)
    if spec.traits.qk_norm_after_rope:  # HunYuanDenseV1Attention: query/key_layernorm after the rotary
        q = m.norm(q, f"{pre}.q_norm")
        k = m.norm(k, f"{pre}.k_norm")
    if spec.transformers_expands_kv:
        kvh = a  # FalconAttention broadcasts the grouped K/V to every head before the cache (a copy each)
        k, v = o.clone(k.view(t * a * d)), o.clone(v.view(t * a * d))
    if m.cache is not None:
        k, v = m.cache.update(i, k, v, cfg.q)
    out, weights = kernel(m, q, k, v, mask, a, kvh, d, d, layer=i)
    del q, k, v
    return m.linear(output_gate.apply(m, out, gate), f"{pre}.o_proj"), weights


def rope(m: CausalLM, q: T, k: T, cos: T, sin: T) -> tuple[T, T]:
    """apply_rotary_pos_emb: ``(q * cos) + (rotate_half(q) * sin)``, rotate_half = cat(-x2, x1)."""
    if m.spec.traits.rotary_half_tables:  # gpt-oss _apply_rotary_emb
        return sinks.rope(m, q, k, cos, sin)
    o = m.o

    def rot(x: T) -> T:
        x1 = o.slice_half(x)
        x2 = o.slice_half(x)
        return o.cat(o.neg(x2), x1)

    q_embed = o.add(o.mul(q, cos, q.n), o.mul(rot(q), sin, q.n))
    k_embed = o.add(o.mul(k, cos, k.n), o.mul(rot(k), sin, k.n))
    if m.spec.traits.rope_tables_fp32:  # Olmo3: fp32 products, ``.to(q_type)`` / ``.to(k_type)``
        return m.s.cast(q_embed, q.dt), m.s.cast(k_embed, k.dt)
    return q_embed, k_embed


def _split(m: CausalLM, x: T, sizes: tuple[int, ...]) -> tuple[T, ...]:
    """torch.split into views; the backward concatenates the parts' gradients (one new tensor)."""
    outs = tuple(T(x.st, n, x.dt) for n in sizes)
    m.s.node("split", (x,), outs)
    return outs


def _mla(m: CausalLM, i: int, x: T, cos: T | None, sin: T | None, mask: T | None) -> tuple[T, T | None]:
    """DeepseekV3Attention.forward and expand_kv (transformers 5.24). Every local of forward (q_states and
    its split views, compressed_kv, the normed latent or the cache's, the rotated parts, the query and the
    expanded key/value) lives until it returns, after o_proj; as ``replay/dsa.mla`` does for V3.2."""
    o, s, spec, cfg = m.o, m.s, m.spec, m.cfg
    ml = spec.mla
    assert ml is not None
    pre = f"layers.{i}.self_attn"
    b, t, a = cfg.batch, cfg.tokens, spec.num_attention_heads
    nope, rot, r, vd = ml.qk_nope_head_dim, ml.qk_rope_head_dim, ml.kv_lora_rank, ml.v_head_dim
    if m.has(f"{pre}.q_a_proj.weight"):
        q_states = m.linear(m.norm(m.linear(x, f"{pre}.q_a_proj"), f"{pre}.q_a_layernorm"), f"{pre}.q_b_proj")
    else:
        q_states = m.linear(x, f"{pre}.q_proj")
    q_states = o.view(q_states, copy_grad=True)
    # KimiLinearAttention (no rotary): the viewed q_states are the query, not split
    q_pass, q_rot = _split(m, q_states, (t * a * nope, t * a * rot)) if cos is not None else (q_states, None)
    compressed_kv = m.linear(x, f"{pre}.kv_a_proj_with_mqa")
    kv_nope, k_rot = _split(m, compressed_kv, (t * r, t * rot))
    kv_nope = m.norm(kv_nope, f"{pre}.kv_a_layernorm")
    if cos is not None and sin is not None:
        q_rot, k_rot = rope(m, q_rot, k_rot, cos, sin)
    if m.cache is not None:
        kv_nope, k_rot = m.cache.update(i, kv_nope, k_rot, cfg.q)
    query_states = o.cat(q_pass, q_rot) if q_rot is not None else q_pass
    if spec.traits.query_position_scale:  # Mistral4Attention: query_states * get_llama_4_attn_scale(...)
        query_states = rope_partial.position_scale(m, query_states)
    # expand_kv: kv_b_proj over every cached token, k_nope/value split into views, the rope key broadcast to
    # every head and copied with k_nope into a new key tensor
    kv = b * cfg.kv_len
    expanded = o.view(m.linear(kv_nope, f"{pre}.kv_b_proj"), copy_grad=True)
    k_nope, value_states = _split(m, expanded, (kv * a * nope, kv * a * vd))
    del expanded
    key_states = s.new(kv * a * (nope + rot), query_states.dt)
    s.node("copy", (k_nope, k_rot), (key_states,))
    del k_nope
    out, weights = kernel(m, query_states, key_states, value_states, mask, a, a, nope + rot, vd)
    if ml.head_gate:  # BailingHybridAttention: out * sigmoid(g_proj(x).float()).to(dtype), per head
        g32 = s.cast(m.linear(x, f"{pre}.g_proj"), "f32")
        sig = s.new(g32.n, "f32")
        s.node("copy", (g32,), (sig,), (sig,))
        del g32
        out = o.mul(out, s.cast(sig, out.dt), out.n)
        del sig
    out = m.linear(out, f"{pre}.o_proj")
    del q_states, q_pass, q_rot, compressed_kv, kv_nope, k_rot, query_states, key_states, value_states
    return out, weights


def kernel(
    m: CausalLM, q: T, k: T, v: T, mask: T | None, a: int, kvh: int, kd: int, vd: int, layer: int = -1
) -> tuple[T, T | None]:
    """The attention implementation: SDPA (fused or math), or eager (with gpt-oss's sinks of ``layer``);
    output [b, q, a * vd]."""
    if m.cfg.attn == "eager" and m.spec.attention_sinks:
        return sinks.eager(m, layer, q, k, v, mask, a, kvh, vd)
    if m.cfg.attn == "eager" and m.spec.traits.attention_code == "gptj":  # fp32 scores (replay/gptj.py)
        return gptj.eager(m, q, k, v, mask, a, vd)
    if m.cfg.attn == "eager":
        return _eager(m, q, k, v, mask, a, kvh, vd)
    return _sdpa(m, q, k, v, mask, a, kvh, kd, vd), None


def _repeat_kv(m: CausalLM, x: T, n_rep: int) -> T:
    """``x[:, :, None].expand(...).reshape(b, kvh * n_rep, s, d)``: a view when there is one KV head (the
    merged dimension has size 1), a copy otherwise."""
    if n_rep == 1:
        return x
    if m.spec.num_kv_heads == 1:
        return T(x.st, x.n * n_rep, x.dt, x.rg, x.fn, x.idx)
    out = m.s.new(x.n * n_rep, x.dt)
    m.s.node("copy", (x,), (out,))
    return out


def _sdpa(m: CausalLM, q: T, k: T, v: T, mask: T | None, a: int, kvh: int, kd: int, vd: int) -> T:
    s, cfg, spec = m.s, m.cfg, m.spec
    b, sq = cfg.batch, cfg.q
    groups = a // kvh
    broadcast = spec.traits.sdpa_broadcast_kv
    if groups > 1 and not broadcast and mask is not None and sq > 1:
        # use_gqa_in_sdpa needs no mask; a single query is packed instead; otherwise K/V are repeated
        k, v = _repeat_kv(m, k, groups), _repeat_kv(m, v, groups)
    q, k, v = s.ac_cast(q), s.ac_cast(k), s.ac_cast(v)  # type: ignore[assignment]
    if cfg.attn == "sdpa" and (kd != vd or (broadcast and groups > 1 and mask is not None)):
        return _math(m, q, k, v, mask, a, kvh, kd, vd)
    bias = None
    if mask is not None and mask.dt == "bool":
        # the boolean mask becomes an additive float mask in the query dtype (sdp convert_boolean_attn_mask),
        # which the kernel saves for backward
        bias = s.new(mask.n, q.dt)
    out = s.new(b * sq * a * vd, q.dt)
    lse = s.new(b * a * sq, "f32")
    s.node("multi", (q, k, v), (out, lse), (q, k, v, out, lse, bias))
    del lse, bias
    return out  # (b, q, a, d): transpose(1, 2).contiguous() of the kernel's output is a no-op


def _math(m: CausalLM, q: T, k: T, v: T, mask: T | None, a: int, kvh: int, kd: int, vd: int) -> T:
    """torch's ``_scaled_dot_product_attention_math`` for 16-bit inputs (traced op by op, torch 2.13): a
    boolean mask converted to the query dtype; q/k/v copied to fp32; q and k^T scaled by sqrt(scale) (the
    scaled k dies after the matmul); a causal call builds an fp32 [q, kv] bias; fp32 scores, plus the mask,
    softmax; the probabilities cast back, multiplied by V in fp32, cast back, then made contiguous."""
    s, cfg = m.s, m.cfg
    b, sq, kv = cfg.batch, cfg.q, cfg.kv_len
    n = b * a * sq * kv
    bias = s.new(mask.n, q.dt) if mask is not None and mask.dt == "bool" else None
    q32 = s.new(b * a * sq * kd, "f32")
    k32 = s.new(b * kvh * kv * kd, "f32")
    v32 = s.new(b * kvh * kv * vd, "f32")
    q32s = s.new(b * a * sq * kd, "f32")
    causal = s.new(sq * kv, "f32") if mask is None and sq > 1 else None
    k32s = s.new(b * kvh * kv * kd, "f32")
    scores = s.new(n, "f32")
    del k32s
    if mask is not None or causal is not None:
        added = s.new(n, "f32")
        del scores
        scores = added
        del added
    probs32 = s.new(n, "f32")
    del scores
    probs = s.new(n, q.dt)
    out32 = s.new(b * a * sq * vd, "f32")
    s.node("multi", (q, k, v), (out32,), (q32s, k32, v32, probs32))
    del probs, probs32, q32, k32, v32, q32s, causal, bias
    raw = s.cast(out32, q.dt)
    del out32
    out = s.new(raw.n, raw.dt)
    s.node("pass", (raw,), (out,))
    return out


def _eager(m: CausalLM, q: T, k: T, v: T, mask: T | None, a: int, kvh: int, vd: int) -> tuple[T, T]:
    """eager_attention_forward: matmul, * scaling, soft-capping (Gemma-2), + mask, softmax (fp32 and cast
    back, or in the activation dtype), dropout, matmul with V, transpose(1, 2).contiguous()."""
    o, s, cfg, spec = m.o, m.s, m.cfg, m.spec
    b, sq, kv = cfg.batch, cfg.q, cfg.kv_len
    n = b * a * sq * kv
    key_states = _repeat_kv(m, k, a // kvh)
    value_states = _repeat_kv(m, v, a // kvh)
    attn_weights = o.mul(o.bmm(q, key_states, n), None)
    cap = spec.traits.attn_logit_softcapping
    if cap:
        attn_weights = o.mul(o.tanh(o.mul(attn_weights, None)), None)
    if mask is not None:
        attn_weights = o.add(attn_weights, mask, n)
    if spec.traits.eager_softmax_fp32:
        # softmax(..., dtype=float32): the input is converted first, the output saved, then cast back
        f32 = s.cast(attn_weights, "f32")
        sm = s.new(n, "f32")
        s.node("copy", (f32,), (sm,), (sm,))
        del f32, attn_weights
        attn_weights = s.cast(sm, q.dt)
        del sm
    else:
        sm = s.new(n, attn_weights.dt)
        s.node("copy", (attn_weights,), (sm,), (sm,))
        attn_weights = sm
        del sm
    attn_weights = o.dropout(attn_weights, cfg.attn_dropout)
    if spec.mla is not None and b > 1 and kv > 1:
        # MLA's value is a split view of kv_b_proj's [b, h, kv, nope + vd] output (DeepseekV3Attention.
        # expand_kv): matmul's reshape to [b * h, kv, vd] cannot view it, so it copies (measured on the
        # eager decode of a batch of 2: -2.9 % without it)
        value_states = o.clone(value_states)
    attn_output = o.bmm(attn_weights, value_states, b * sq * a * vd)
    del key_states, value_states
    # the probabilities are returned as attn_weights; the decoder layer holds them until it returns
    return o.clone(attn_output), attn_weights
