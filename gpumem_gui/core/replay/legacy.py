"""Decoder blocks whose modeling files keep their own attention code: Falcon and BLOOM (transformers 5.24).

* ``FalconDecoderLayer`` / ``FalconAttention``: ``_split_heads`` takes query/key/value out of the fused
  projection as views or index copies, ``transpose(1, 2).reshape(...)`` copies them into heads, rotary (or
  ALiBi folded into the mask by ``FalconModel``), the cache update; SDPA, or its own eager path (scores scaled
  in place, softmax in the activation dtype; with ALiBi, fp32 scores and logits); the dense projection. The
  block keeps the attention output to the end, adds it into the MLP output in place (parallel attention) and
  the residual with ``dropout_add``.
* ``BloomBlock`` / ``BloomAttention`` (eager only): views of the fused projection, ``alibi.baddbmm`` scores,
  the float mask added, softmax in fp32 cast back, context merged into heads; the residual is added inside the
  attention and inside the MLP (``dropout_add``); ``BloomGelu`` keeps its tanh temporaries.

The model's layer loop of both keeps the previous layer's ``(hidden_states, attn_weights)`` until the next
layer returns (``outputs = block(...)``), which the model code follows through the weights each block returns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumem_gui.core.replay.attention import kernel, rope
from gpumem_gui.core.replay.memory import T
from gpumem_gui.core.replay.registry import BLOCKS, register

if TYPE_CHECKING:
    from gpumem_gui.core.replay.context import CausalLM


def _split_heads(m: CausalLM, qkv: T) -> tuple[T, T, T]:
    """FalconAttention._split_heads, then ``.transpose(1, 2).reshape(b, heads, q, d)`` of each part: the new
    decoder architecture index-copies k/v, broadcasts them to every head and flattens all three (copies,
    which the reshape copies again); multi-query keeps q a view (the reshape copies it) and index-copies one
    k/v head (whose transpose is a view); multi-head views all three (the reshape copies each)."""
    s, spec, cfg = m.s, m.spec, m.cfg
    t, a, d, kvh = cfg.tokens, spec.num_attention_heads, spec.head_dim, spec.num_kv_heads
    dt = qkv.dt
    if spec.transformers_expands_kv:
        k_idx, v_idx = s.new(t * kvh * d, dt), s.new(t * kvh * d, dt)
        flat = [s.new(t * a * d, dt) for _ in range(3)]
        del k_idx, v_idx
        out = []
        for _ in range(3):
            out.append(s.new(t * a * d, dt))
            del flat[0]
        return out[0], out[1], out[2]
    if kvh < a:
        k, v = s.new(t * kvh * d, dt), s.new(t * kvh * d, dt)
        return s.new(t * a * d, dt), k, v
    q = s.new(t * a * d, dt)
    k = s.new(t * a * d, dt)
    return q, k, s.new(t * a * d, dt)


def falcon_attention(
    m: CausalLM, i: int, x: T, cos: T | None, sin: T | None, mask: T | None
) -> tuple[T, T | None]:
    """FalconAttention.forward: SDPA (or FlashAttention-2) through the shared kernels; eager with its own code
    (rotary: scores scaled in place, softmax of scores + mask in the activation dtype; ALiBi: fp32 scores and
    logits, softmax of logits + mask back in the activation dtype), the probabilities returned."""
    o, s, spec, cfg = m.o, m.s, m.spec, m.cfg
    prev, s.region = s.region, "attention"
    pre = f"layers.{i}.self_attn"
    b, sq, kv = cfg.batch, cfg.q, cfg.kv_len
    a, d = spec.num_attention_heads, spec.head_dim
    kvh = a if spec.transformers_expands_kv else spec.num_kv_heads
    fused_qkv = m.linear(x, f"{pre}.qkv_proj")
    q, k, v = _split_heads(m, fused_qkv)
    if cos is not None and sin is not None:
        q, k = rope(m, q, k, cos, sin)
    if m.cache is not None:
        k, v = m.cache.update(i, k, v, sq)
    n = b * a * sq * kv
    weights: T | None = None
    if cfg.attn != "eager":
        out, _ = kernel(m, q, k, v, mask, a, kvh, d, d)
    elif spec.position_embedding == "alibi":
        matmul_result = o.bmm(q, k, n)
        scores = s.cast(matmul_result, "f32")
        logits = s.new(n, "f32")  # scores + alibi, then *= inv_norm_factor in place
        summed = s.new(n, "f32")  # logits + mask
        cast = s.cast(summed, q.dt)  # softmax(..., dtype=hidden dtype) converts its input first
        del summed
        weights = s.new(n, q.dt)
        del cast
        ctx = o.bmm(weights, v, b * sq * a * d)
        out = o.clone(ctx)  # _merge_heads: view, permute, reshape
        del ctx, matmul_result, scores, logits
    else:
        scores = o.bmm(q, k, n)  # /= sqrt(head_dim) in place
        summed = s.new(n, q.dt)  # scores + mask
        weights = s.new(n, q.dt)
        del summed, scores
        ctx = o.bmm(weights, v, b * sq * a * d)
        out = o.clone(ctx)  # view, permute(0, 2, 1, 3), reshape
        del ctx
    del q, k, v, fused_qkv
    out = m.linear(out, f"{pre}.o_proj")
    s.region = prev
    return out, weights


@register(BLOCKS, "falcon")
def falcon_layer(
    m: CausalLM, i: int, hidden_states: T, cos: T | None, sin: T | None, mask: T | None
) -> tuple[T, T | None]:
    """FalconDecoderLayer.forward."""
    o, s, spec = m.o, m.s, m.spec
    residual = hidden_states
    s.tr.where = f"layer {i} attention"
    two_ln = spec.parallel_attn_mlp and spec.norms_per_layer == 2
    attention_ln = m.region_norm(hidden_states, f"layers.{i}.norm0")
    mlp_ln = m.region_norm(hidden_states, f"layers.{i}.norm1") if two_ln else None
    attention_output, weights = falcon_attention(m, i, attention_ln, cos, sin, mask)
    s.region = "hidden_states"
    if not spec.parallel_attn_mlp:
        residual = o.add(attention_output, residual)  # dropout_add
        mlp_ln = m.region_norm(residual, f"layers.{i}.norm1")
    elif mlp_ln is None:
        mlp_ln = attention_ln
    del attention_ln
    s.tr.where = f"layer {i} MLP"
    from gpumem_gui.core.replay.mlp import mlp

    mlp_output = mlp(m, i, mlp_ln)
    del mlp_ln
    s.region = "hidden_states"
    # mlp_output += attention_output (in place) for the parallel block, then dropout_add(mlp_output, residual)
    return o.add(mlp_output, residual), weights


def bloom_layer(m: CausalLM, i: int, hidden_states: T, alibi: T | None, mask: T | None) -> tuple[T, T | None]:
    """BloomBlock.forward with BloomAttention (eager) and BloomMLP."""
    o, s, spec, cfg = m.o, m.s, m.spec, m.cfg
    b, sq, kv = cfg.batch, cfg.q, cfg.kv_len
    a, d = spec.num_attention_heads, spec.head_dim
    n = b * a * sq * kv
    s.tr.where = f"layer {i} attention"
    layernorm_output = m.region_norm(hidden_states, f"layers.{i}.norm0")
    s.region = "attention"
    pre = f"layers.{i}.self_attn"
    fused_qkv = m.linear(layernorm_output, f"{pre}.qkv_proj")
    k, v = T(fused_qkv.st, b * sq * a * d, fused_qkv.dt), T(fused_qkv.st, b * sq * a * d, fused_qkv.dt)
    if m.cache is not None:
        k, v = m.cache.update(i, k, v, sq)
    query_layer = s.new(b * sq * a * d, fused_qkv.dt)  # reshape(b * heads, q, d) of a transposed view: a copy
    scores = s.new(n, query_layer.dt)  # alibi.baddbmm(q, k^T)
    s.node("multi", (query_layer, k, alibi), (scores,), (query_layer, k))
    attn_weights = o.add(scores, mask, n) if mask is not None else scores
    f32 = s.cast(attn_weights, "f32")
    probs32 = s.new(n, "f32")
    s.node("copy", (f32,), (probs32,), (probs32,))
    del f32
    probs = s.cast(probs32, query_layer.dt)
    del probs32
    probs = o.dropout(probs, cfg.attn_dropout)
    ctx = o.bmm(probs, v, b * sq * a * d)
    out = o.clone(ctx)  # _merge_heads
    del ctx, query_layer, k, v, fused_qkv, scores, attn_weights
    out = m.linear(out, f"{pre}.o_proj")
    s.region = "hidden_states"
    attention_output = o.add(out, hidden_states)  # dropout_add(output, residual) inside the attention
    del out
    s.tr.where = f"layer {i} MLP"
    layernorm_output = m.region_norm(attention_output, f"layers.{i}.norm1")
    s.region = "mlp"
    h = m.linear(layernorm_output, f"layers.{i}.mlp.up_proj")
    g = _bloom_gelu(m, h)
    del h
    inter = m.linear(g, f"layers.{i}.mlp.down_proj")
    del g
    s.region = "hidden_states"
    return o.add(inter, attention_output), probs


def _bloom_gelu(m: CausalLM, x: T) -> T:
    """GeLUFunction.forward: ``x * 0.5 * (1.0 + tanh(0.79788456 * x * (1 + 0.044715 * x * x)))``, saving x."""
    s = m.s
    a = s.new(x.n, x.dt)  # x * 0.5
    b = s.new(x.n, x.dt)  # 0.79788456 * x
    c = s.new(x.n, x.dt)  # 0.044715 * x
    c2 = s.new(x.n, x.dt)  # * x
    del c
    c3 = s.new(x.n, x.dt)  # 1 + ...
    del c2
    f = s.new(x.n, x.dt)  # b * c3
    del b, c3
    g = s.new(x.n, x.dt)  # tanh
    del f
    h = s.new(x.n, x.dt)  # 1 + tanh
    del g
    out = s.new(x.n, x.dt)
    del a, h
    s.node("copy", (x,), (out,), (x,))
    return out


@register(BLOCKS, "bloom")
def _bloom_block(
    m: CausalLM, i: int, hidden_states: T, cos: T | None, sin: T | None, mask: T | None
) -> tuple[T, T | None]:
    """:func:`bloom_layer` in the blocks' calling convention: ALiBi's bias instead of the rotary tables."""
    return bloom_layer(m, i, hidden_states, m.alibi_bias, mask)
