"""T5's attention on symbolic tensors: the relative position bias and the attention kernels
(transformers 5.24 ``models/t5/modeling_t5.py`` ``T5Attention``, ``integrations/sdpa_attention.py``).

* ``T5Attention.compute_bias``: int64 position grids, ``_relative_position_bucket`` (bidirectional in the
  encoder, causal in the decoder; every intermediate a new [q, k] tensor, the log buckets through fp32), the
  ``relative_attention_bias`` lookup ([q, k, heads] in the weight dtype) permuted into a [1, heads, q, k]
  view. The first block of each stack computes it and the stack passes it to every later block; a
  cross-attention computes no bias: a zero [1, heads, q, k] tensor in the query dtype instead.
* ``sdpa_attention_forward``: ``create_position_bias_mask`` turns the bias into the float mask
  (``contiguous()``: a copy of the permuted view; a causal call with several queries: ``torch.where`` over a
  boolean [q, k] grid), the fused kernel returns the output and an fp32 log-sum-exp.
* T5's ``eager_attention_forward``: ``matmul * scaling`` (scaling 1.0, still a new tensor; ``matmul`` copies
  an operand that is a transposed view of a projection), ``+ position_bias``, ``+ mask``, softmax in the
  activation dtype, dropout, ``matmul``, ``transpose(1, 2).contiguous()``; the probabilities are returned to
  the block, which holds them as ``_`` until the next sub-layer's replace them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumem_gui.core.replay.memory import T

if TYPE_CHECKING:
    from gpumem_gui.core.replay.context import Seq2SeqLike as Seq2SeqLM


def _bucket(m: Seq2SeqLM, n: int, bidirectional: bool) -> T:
    """``_relative_position_bucket`` over ``n`` = q x k relative positions (int64 in, int64 out). UMT5's
    (``bias_every_layer``) keeps its fp32 ``log_ratio`` as a local until it returns."""
    s = m.s
    if bidirectional:
        gt = s.new(n, "bool")  # relative_position > 0
        as_long = s.new(n, "i64")  # .to(torch.long)
        del gt
        scaled = s.new(n, "i64")  # * num_buckets
        del as_long
        buckets = s.new(n, "i64")  # 0 + ...: relative_buckets becomes a tensor
        del scaled
        rel = s.new(n, "i64")  # torch.abs(relative_position)
    else:
        zeros = s.new(n, "i64")  # torch.zeros_like(relative_position)
        least = s.new(n, "i64")  # torch.min(...)
        del zeros
        rel = s.new(n, "i64")  # -torch.min(...)
        del least
        buckets = None
    is_small = s.new(n, "bool")  # relative_position < max_exact
    x = s.new(n, "f32")  # relative_position.float()
    for _ in range(3):  # / max_exact; torch.log; / math.log(max_distance / max_exact)
        y = s.new(n, "f32")
        del x
        x = y
        del y
    y = s.new(n, "f32")  # * (num_buckets - max_exact)
    del x
    as_long = s.new(n, "i64")  # .to(torch.long)
    log_ratio = y if m.s2s.bias_every_layer else None  # UMT5: log_ratio = log_ratio * (...), a local
    del y
    large = s.new(n, "i64")  # max_exact + ...
    del as_long
    full = s.new(n, "i64")  # torch.full_like(...)
    least = s.new(n, "i64")  # torch.min(...)
    del large, full
    chosen = s.new(n, "i64")  # torch.where(is_small, relative_position, relative_position_if_large)
    if buckets is None:
        buckets = s.new(n, "i64")  # 0 + torch.where(...)
        del chosen
    else:
        del chosen  # relative_buckets += torch.where(...): in place
    del rel, is_small, least, log_ratio
    return buckets


def compute_bias(m: Seq2SeqLM, i: int, q: int, k: int, bidirectional: bool) -> T:
    """``T5Attention.compute_bias(q, k)`` of block ``i``: the [1, heads, q, k] bias (a permuted view of the
    [q, k, heads] lookup)."""
    s = m.s
    prev, s.region = s.region, "mask"
    arange = s.new(q, "i64")
    context_position = s.new(q, "i64")  # arange(q)[:, None] + past_seen_tokens
    del arange
    memory_position = s.new(k, "i64")  # arange(k)[None, :]
    relative_position = s.new(q * k, "i64")
    buckets = _bucket(m, q * k, bidirectional)
    w = m.param(f"layers.{i}.self_attn.relative_attention_bias.weight")
    values = s.new(q * k * m.spec.num_attention_heads, w.dt)
    s.node("copy", (w,), (values,), (buckets,))
    del context_position, memory_position, relative_position, buckets
    s.region = prev
    return values


def zero_bias(m: Seq2SeqLM, q: int, k: int, dt: str) -> T:
    """A block without a bias table and no bias passed to it: ``torch.zeros((1, heads, q, k))``."""
    s = m.s
    prev, s.region = s.region, "mask"
    out = s.new(m.spec.num_attention_heads * q * k, dt)
    s.region = prev
    return out


def sdpa(
    m: Seq2SeqLM, qs: T, k: T, v: T, bias: T | None, q: int, kv: int, contiguous: bool, causal: bool
) -> T:
    """``sdpa_attention_forward`` with T5's position bias (BART: none, ``is_causal`` in the decoder's
    self-attention); output [b, q, heads * d_kv]."""
    s, spec = m.s, m.spec
    b, a, d = m.cfg.batch, spec.num_attention_heads, spec.head_dim
    prev, s.region = s.region, "mask"
    if bias is None:  # BART: no mask at all
        mask = None
    elif causal and q > 1:  # create_position_bias_mask: torch.where(causal_mask, position_bias, min_dtype)
        ar_q, ar_k = s.new(q, "i64"), s.new(kv, "i64")
        grid = s.new(q * kv, "bool")
        del ar_q, ar_k
        mask = s.new(a * q * kv, bias.dt)
        del grid
    elif contiguous:  # the permuted lookup: .contiguous() copies it
        mask = s.new(a * q * kv, bias.dt)
    else:  # the zero bias: contiguous already
        mask = bias
    s.region = prev
    out = s.new(b * q * a * d, qs.dt)
    lse = s.new(b * a * q, "f32")
    s.node("multi", (qs, k, v, mask), (out, lse), (qs, k, v, out, lse, mask))
    del lse, mask
    return out


def _flat(m: Seq2SeqLM, x: T, view: bool) -> T | None:
    """``torch.matmul``'s ``reshape`` of a 4-D operand to 3-D: a copy of a [b, heads, len, d_kv] transposed
    view of a projection with more than one token (its batch and head dimensions do not merge); None when
    the operand is used as it is (a cache concatenation, a single token)."""
    if not view:
        return None
    out = m.s.new(x.n, x.dt)
    m.s.node("pass", (x,), (out,))
    return out


def eager(
    m: Seq2SeqLM, qs: T, k: T, v: T, bias: T | None, mask: T | None, q: int, kv: int, kv_views: bool
) -> tuple[T, T]:
    """T5's ``eager_attention_forward``: (output [b, q, heads * d_kv], probabilities). ``kv_views``: the keys
    and values are the projections' transposed views (no cache), which ``matmul`` copies."""
    o, s, spec = m.o, m.s, m.spec
    b, a, d = m.cfg.batch, spec.num_attention_heads, spec.head_dim
    n = b * a * q * kv
    q_flat = _flat(m, qs, q > 1)
    k_flat = _flat(m, k, kv_views and kv > 1)
    raw = o.bmm(q_flat or qs, k_flat or k, n)
    del q_flat, k_flat
    scores = o.mul(raw, None)  # * scaling
    del raw
    if bias is not None:  # T5's position bias (BartAttention has none)
        scores = o.add(scores, bias, n)
    if mask is not None:
        scores = o.add(scores, mask, n)
    probs = s.new(n, scores.dt)
    s.node("copy", (scores,), (probs,), (probs,))
    del scores
    probs = o.dropout(probs, m.cfg.attn_dropout)
    v_flat = _flat(m, v, kv_views and kv > 1)
    out = o.bmm(probs, v_flat or v, b * q * a * d)
    del v_flat
    contiguous = s.new(out.n, out.dt)  # transpose(1, 2).contiguous()
    s.node("pass", (out,), (contiguous,))
    del out
    return contiguous, probs
