"""gpt-oss's attention and norm on symbolic tensors (``models/gpt_oss/modeling_gpt_oss.py``, transformers
5.24).

* ``eager_attention_forward`` with attention sinks (:attr:`ModelSpec.attention_sinks`): the scaled, masked
  scores concatenated with each head's sink logit (``module.sinks`` expanded to [b, heads, q, 1]), the row max
  subtracted, a softmax in the scores' dtype, the sink column sliced off (a view of the probabilities, which
  the decoder layer keeps), matmul with V. There is no SDPA path (``_supports_sdpa = False``): the default
  ``sdpa`` falls back to eager (``replay/config.attn_as_run``); FlashAttention kernels take the sinks as
  ``s_aux`` and keep only their log-sum-exp, as the fused path already replays.
* ``_apply_rotary_emb`` (:attr:`ArchTraits.rotary_half_tables`): cos/sin of head_dim / 2, each head chunked
  in two, ``cat(x1 * cos - x2 * sin, x2 * cos + x1 * sin)``.
* ``GptOssRMSNorm`` (:attr:`ArchTraits.norm_product_fp32`): ``(weight * fp32 states).to(input_dtype)``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumem_gui.core.replay import attention_kernels as kernels
from gpumem_gui.core.replay.memory import T, promote
from gpumem_gui.core.replay.registry import NORMS, register

if TYPE_CHECKING:
    from gpumem_gui.core.replay.context import CausalLM


@register(NORMS, "norm_product_fp32")
def norm(m: CausalLM, x: T, w: T, width: int) -> T:
    """GptOssRMSNorm.forward: fp32 states normalised, multiplied by the weight (an fp32 product), cast back;
    the normalised states live until the cast returns."""
    o, s = m.o, m.s
    input_dtype = x.dt
    hs = s.cast(x, "f32")
    variance = o.mean_last(o.pow2(hs), width)
    hs = o.mul(hs, o.rsqrt(o.add(variance, None)))
    del variance
    prod = o.mul(w, hs, hs.n)
    out = s.cast(prod, input_dtype)
    del prod, hs
    return out


def _halves(m: CausalLM, x: T) -> tuple[T, T]:
    """torch.chunk(x, 2, dim=-1): two views, one SplitBackward (one gradient of x's size)."""
    a, b = T(x.st, x.n // 2, x.dt), T(x.st, x.n // 2, x.dt)
    m.s.node("split", (x,), (a, b))
    return a, b


def _rotate(m: CausalLM, x: T, cos: T, sin: T) -> T:
    """_apply_rotary_emb: each product dies once its sum exists; both halves once the cat exists."""
    o = m.o
    x1, x2 = _halves(m, x)
    half = x.n // 2
    a, b = o.mul(x1, cos, half), o.mul(x2, sin, half)
    first = o.add(a, b)
    del a, b
    c, d = o.mul(x2, cos, half), o.mul(x1, sin, half)
    second = o.add(c, d)
    del c, d, x1, x2
    return o.cat(first, second)


def rope(m: CausalLM, q: T, k: T, cos: T, sin: T) -> tuple[T, T]:
    """gpt_oss apply_rotary_pos_emb: q, then k."""
    return _rotate(m, q, cos, sin), _rotate(m, k, cos, sin)


def eager(
    m: CausalLM,
    i: int,
    q: T,
    k: T,
    v: T,
    mask: T | None,
    a: int,
    kvh: int,
    vd: int,
    kv_len: object = None,
) -> tuple[T, T]:
    """gpt_oss eager_attention_forward (see the module docstring); returns (output, probabilities view).
    ``attn_weights`` keeps the scores until it is rebound to the probabilities; ``combined_logits`` lives to
    the return. ``kv_len``: the keys' length when it is not the run's (DeepSeek-V4's compressed entries)."""
    o, s, cfg = m.o, m.s, m.cfg
    b, sq, kv = cfg.batch, cfg.q, cfg.kv_len if kv_len is None else kv_len
    n, n1, rows = b * a * sq * kv, b * a * sq * (kv + 1), b * a * sq
    key_states = kernels.repeat_kv(m, k, a // kvh)
    value_states = kernels.repeat_kv(m, v, a // kvh)
    keys = kernels.bmm_operand(m, key_states, a // kvh)  # one KV head over a batch: matmul copies it
    scores_raw = o.bmm(q, keys, n)
    del keys
    attn_weights = o.mul(scores_raw, None)
    del scores_raw
    if mask is not None:
        attn_weights = o.add(attn_weights, mask, n)
    # module.sinks.reshape(1, -1, 1, 1).expand(b, -1, q, -1): a view of the parameter
    sink = m.param(f"layers.{i}.self_attn.sinks").view(rows)
    combined = s.new(n1, promote(attn_weights.dt, sink.dt))
    s.node("pass", (attn_weights, sink), (combined,))
    # .max(dim=-1, keepdim=True).values: the indices (saved for backward) die with the returned tuple, before
    # the subtraction
    top = s.new(rows, combined.dt)
    top_idx = s.new(rows, "i64")
    s.node("copy", (combined,), (top,), (top_idx,))
    del top_idx
    shifted = s.new(n1, combined.dt)
    s.node("pass", (combined, top), (shifted,))
    del top
    combined = shifted
    del shifted
    probs = s.new(n1, combined.dt)  # F.softmax(..., dtype=combined_logits.dtype) saves its output
    s.node("copy", (combined,), (probs,), (probs,))
    scores = T(probs.st, n, probs.dt)  # probs[..., :-1]: a view; SliceBackward makes a full-size gradient
    s.node("copy", (probs,), (scores,))
    del probs
    attn_weights = s.cast(o.dropout(scores, cfg.attn_dropout), value_states.dt)
    del scores
    values = kernels.bmm_operand(m, value_states, a // kvh)
    attn_output = o.bmm(attn_weights, values, b * sq * a * vd)
    del key_states, value_states, values
    out = o.clone(attn_output)  # transpose(1, 2).contiguous()
    del attn_output, combined
    return out, attn_weights


kernels.EAGER["sinks"] = eager
kernels.ROTARY["half_tables"] = rope
