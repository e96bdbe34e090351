"""Chunked local attention, complex rotary, L2 q/k norm, temperature tuning and score-scaled MoE as
transformers 5.24 runs them (``models/llama4/modeling_llama4.py``, ``masking_utils.py``), on symbolic tensors.

* ``Llama4TextRotaryEmbedding.forward``: ``position_ids.float() * inv_freq``,
  ``torch.polar(ones_like, freqs)`` (complex64, 8 bytes per pair: counted as two fp32 elements),
  ``* attention_scaling`` into a new table.
* ``apply_rotary_emb``: q and k copied to fp32, viewed as complex, multiplied by the table (each product a new
  complex tensor that saves the table), viewed back and cast to the activation dtype.
* ``Llama4TextL2Norm`` (rotary layers with ``use_qk_norm``): fp32 copy, pow, mean, + eps, rsqrt, product,
  cast.
* temperature tuning (NoPE layers): a per-position fp32 scale, ``q * scale`` promoted to fp32, cast back.
* ``create_chunked_causal_mask``: with sdpa a boolean [b, 1, q, kv] mask once the mask's key length reaches
  ``attention_chunk_size`` (``_ignore_causal_mask_sdpa`` local_attention_size), the key length being the
  chunked layer's ``get_mask_sizes``: ``chunk - 1 + q`` once ``chunk`` tokens are cached, else ``past + q``.
* ``Llama4TextMoe.forward``: router logits, top-k, ``full_like(-inf).scatter_``, fp32 sigmoid cast back; the
  input repeated once per expert and scaled by its score; ``Llama4TextExperts`` bmm over all experts
  (gate_up, chunk, act(gate) * up, down); the shared expert; the routed outputs summed over experts and added
  in place.

Nothing here branches on a model type: the replay calls these on the traits and fields that ask for them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumem_gui.core.replay import ffn
from gpumem_gui.core.replay.memory import T

if TYPE_CHECKING:
    from gpumem_gui.core.replay.context import CausalLM


def applies(m: CausalLM) -> bool:
    """Whether the attention takes :func:`rotate_and_scale` instead of the rotate_half rotary."""
    t = m.spec.traits
    return t.rope_complex or t.attn_temperature_tuning or m.spec.qk_norm == "l2"


def complex_rotary(m: CausalLM) -> tuple[T, T]:
    """Llama4TextRotaryEmbedding.forward: the complex64 ``freqs_cis`` [1, q, d / 2] (returned twice, as the
    model's (cos, sin) slots; one tensor)."""
    s, spec = m.s, m.spec
    half = m.cfg.q * (spec.head_dim // 2)
    pos = s.new(m.cfg.q, "f32")  # position_ids[..., None].float()
    freqs = s.new(half, "f32")
    del pos
    ones = s.new(half, "f32")
    polar = s.new(2 * half, "f32")
    del ones, freqs
    table = s.new(2 * half, "f32")  # freqs_cis * attention_scaling
    del polar
    return table, table


def _complex_rope(m: CausalLM, q: T, k: T, table: T) -> tuple[T, T]:
    s, o = m.s, m.o
    q32, k32 = s.cast(q, "f32"), s.cast(k, "f32")
    q_out, k_out = o.mul(q32, table, q32.n), o.mul(k32, table, k32.n)
    del q32, k32
    return s.cast(q_out, q.dt), s.cast(k_out, k.dt)


def _l2_norm(m: CausalLM, x: T) -> T:
    """Llama4TextL2Norm.forward: ``_norm(x.float()).type_as(x)`` over each head."""
    s, o = m.s, m.o
    xf = s.cast(x, "f32")
    variance = o.mean_last(o.pow2(xf), m.spec.head_dim)
    out = o.mul(xf, o.rsqrt(o.add(variance, None)), xf.n)
    del variance, xf
    return s.cast(out, x.dt)


def _temperature(m: CausalLM, q: T) -> T:
    """``attn_scales`` from the positions (i64 arange, fp32 steps of [q] each), ``q * attn_scales`` (fp32 by
    promotion, saving the scales) cast back."""
    s = m.s
    positions = s.new(m.cfg.q, "i64")
    scales = s.new(m.cfg.q, "f32")
    del positions
    scaled = m.o.mul(q, scales, q.n)
    del scales
    return s.cast(scaled, q.dt)


def rotate_and_scale(m: CausalLM, i: int, q: T, k: T, table: T | None) -> tuple[T, T]:
    """Llama4TextAttention.forward between the projections and the cache: the complex rotary and the L2 q/k
    norm on rotary layers, temperature tuning on NoPE layers."""
    spec = m.spec
    rotary = i not in spec.nope_layers
    if rotary and table is not None:
        q, k = _complex_rope(m, q, k, table)
    if rotary and spec.qk_norm == "l2":
        q = _l2_norm(m, q)
        k = _l2_norm(m, k)
    if not rotary and spec.traits.attn_temperature_tuning:
        q = _temperature(m, q)
    return q, k


def mask_kv(m: CausalLM) -> int:
    """The key length of a chunked layer's mask (DynamicSlidingWindowLayer.get_mask_sizes before the
    forward: ``cumulative_length`` is the past)."""
    cfg, chunk = m.cfg, m.spec.attention_chunk_size or 0
    return chunk - 1 + cfg.q if cfg.past >= chunk else cfg.past + cfg.q


def chunked_mask(m: CausalLM, dt: str) -> T | None:
    """create_chunked_causal_mask: eager's float [b, 1, q, kv] mask; sdpa's boolean one once the keys reach
    the chunk (``_ignore_causal_mask_sdpa`` with local_attention_size), else None (is_causal)."""
    cfg = m.cfg
    kv = mask_kv(m)
    if cfg.attn == "eager":
        return m.s.new(cfg.batch * cfg.q * kv, dt)
    if cfg.attn == "flash" or kv < (m.spec.attention_chunk_size or 0):
        return None
    return m.s.new(cfg.batch * cfg.q * kv, "bool")


def _router(m: CausalLM, x: T, pre: str) -> tuple[T, T]:
    """Llama4Router.forward: (sigmoid scores over all experts in the logits' dtype, router logits)."""
    s = m.s
    moe = m.spec.moe
    assert moe is not None
    t, e, k = m.cfg.tokens, moe.num_experts, moe.experts_per_token
    logits = m.linear(x, f"{pre}.gate")
    top = s.new(t * k, logits.dt)  # torch.topk: values and indices
    top_idx = s.new(t * k, "i64")
    s.node("copy", (logits,), (top,), (top_idx,))
    full = s.new(t * e, logits.dt)  # full_like(-inf)
    scattered = T(full.st, full.n, full.dt)  # .scatter_(1, indices, values)
    s.node("copy", (top,), (scattered,), (top_idx,))
    del full, top, top_idx
    f32 = s.cast(scattered, "f32")
    del scattered
    sig = s.new(t * e, "f32")
    s.node("copy", (f32,), (sig,), (sig,))
    del f32
    scores = s.cast(sig, logits.dt)
    del sig
    return scores, logits


def _experts(m: CausalLM, pre: str, routed_in: T) -> T:
    """Llama4TextExperts.forward: bmm over every expert's rows, gate/up chunks (views), act(gate) * up."""
    o, s, spec = m.o, m.s, m.spec
    moe = spec.moe
    assert moe is not None
    rows, fe, h = routed_in.n // spec.hidden_size, moe.expert_intermediate_size, spec.hidden_size
    gate_up = o.bmm(routed_in, m.param(f"{pre}.experts.gate_up_proj"), rows * 2 * fe)
    gate = T(gate_up.st, rows * fe, gate_up.dt)
    s.node("pass", (gate_up,), (gate,))
    up = T(gate_up.st, rows * fe, gate_up.dt)
    s.node("pass", (gate_up,), (up,))
    prod = ffn.gated(m, gate, up)  # up * act_fn(gate)
    del gate, up
    out = o.bmm(prod, m.param(f"{pre}.experts.down_proj"), rows * h)
    del prod, gate_up
    return out


def scaled_input_moe(m: CausalLM, i: int, x: T) -> T:
    """Llama4TextMoe.forward from the normed input; returns the block's output."""
    o, s, spec = m.o, m.s, m.spec
    moe = spec.moe
    assert moe is not None
    pre = f"layers.{i}.mlp"
    t, e, h = m.cfg.tokens, moe.num_experts, spec.hidden_size
    scores, router_logits = _router(m, x, pre)
    repeated = s.new(e * t * h, x.dt)  # hidden_states.repeat(num_experts, 1)
    s.node("copy", (x,), (repeated,))
    column = s.new(e * t, scores.dt)  # router_scores.transpose(0, 1).reshape(-1, 1): a copy
    s.node("copy", (scores,), (column,))
    routed_in = o.mul(repeated, column, e * t * h)
    del repeated, column
    # router_scores, routed_in and routed_out are locals of the forward: they live until it returns
    routed_out = _experts(m, pre, routed_in)
    out = ffn.shared(m, pre, x)  # Llama4TextMLP of the expert width
    summed = s.new(t * h, routed_out.dt)  # routed_out.reshape(E, -1, h).sum(dim=0)
    s.node("pass", (routed_out,), (summed,))
    added = T(out.st, out.n, out.dt)  # out.add_(...): in place
    s.node("pass", (out, summed), (added,))
    del summed, out, router_logits, scores, routed_in, routed_out
    return added
