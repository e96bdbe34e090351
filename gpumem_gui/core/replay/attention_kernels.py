"""The attention kernels and the pieces every attention variant shares (transformers 5.24
``integrations/sdpa_attention.py``, ``eager_attention_forward``, ``apply_rotary_pos_emb``): SDPA (fused or
torch's math path), eager, ``repeat_kv``, the rotary, ``torch.split`` into views, SDPA's mask.

They sit below the variants (:mod:`.dsa`, :mod:`.gptj`, :mod:`.sinks`) and the dispatcher (:mod:`.attention`):
a variant with a kernel or rotary of its own registers it in :data:`EAGER` / :data:`ROTARY` when its module
is imported (:mod:`.attention` imports them all), so that nothing here imports a variant.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from gpumem_gui.core.replay import tricks
from gpumem_gui.core.replay.memory import T

if TYPE_CHECKING:
    from gpumem_gui.core.replay.config import ReplayConfig
    from gpumem_gui.core.replay.context import CausalLM
    from gpumem_gui.core.spec.model import ModelSpec

# eager kernels of attention variants, (m, layer, q, k, v, mask, heads, kv heads, v head dim) -> (out,
# probabilities): "sinks" (gpt-oss, replay/sinks.py), "gptj" (fp32 scores, replay/gptj.py)
EAGER: dict[str, Callable[..., tuple[T, T]]] = {}
# rotaries of attention variants, (m, q, k, cos, sin) -> (q, k): "half_tables" (gpt-oss, replay/sinks.py)
ROTARY: dict[str, Callable[..., tuple[T, T]]] = {}


def _variant(table: dict[str, Callable[..., tuple[T, T]]], key: str) -> Callable[..., tuple[T, T]]:
    """A registered variant; its absence is a bug of the replay's imports, never a silent fallback."""
    fn = table.get(key)
    if fn is None:
        raise RuntimeError(f"attention variant {key!r} is not registered (replay/attention.py imports it)")
    return fn


def sdpa_mask(spec: ModelSpec, cfg: ReplayConfig, sliding: bool) -> bool:
    """Whether SDPA gets a materialised (boolean) mask: always for an architecture that never skips it, else
    only for a sliding layer once the keys reach the window (``masking_utils._ignore_causal_mask_sdpa``:
    ``kv_length >= local_attention_size`` needs the mask; a causal layer uses ``is_causal``, a single query
    needs no mask)."""
    if cfg.attn == "flash":
        return False
    if spec.traits.always_mask:
        return True
    if cfg.static_len and cfg.past:
        # a static cache after the prefill: generate()'s all-ones attention_mask is padded with zeros to
        # max_cache_len (prepare_padding_mask), so the mask cannot be skipped; the prefill (q_offset 0)
        # skips it
        return True
    if (
        cfg.images
        and spec.vision is not None
        and spec.vision.tower is not None
        and spec.vision.tower.block_mask
    ):
        return True  # a block mask over each image's tokens OR-ed into every mask (spec/vision.py)
    return sliding and spec.sliding_window is not None and cfg.kv_len >= spec.sliding_window


def bool_mask_elems(spec: ModelSpec, cfg: ReplayConfig) -> int:
    """Elements of SDPA's boolean mask [b, 1, q, kv] (one per batch row)."""
    return cfg.batch * cfg.q * cfg.kv_len


def rope(m: CausalLM, q: T, k: T, cos: T, sin: T) -> tuple[T, T]:
    """apply_rotary_pos_emb: ``(q * cos) + (rotate_half(q) * sin)``, rotate_half = cat(-x2, x1)."""
    if m.spec.traits.rotary_half_tables:  # gpt-oss _apply_rotary_emb (replay/sinks.py)
        return _variant(ROTARY, "half_tables")(m, q, k, cos, sin)
    o = m.o
    if m.cfg.compile and m.s.grad_enabled:  # one fused kernel each, keeping cos / sin (replay/tricks.py)
        dt = q.dt if m.spec.traits.rope_tables_fp32 else None  # Olmo3's .to(q_type) fused in
        return _fused_rope(m, q, cos, sin, dt), _fused_rope(m, k, cos, sin, dt)

    def rot(x: T) -> T:
        x1 = o.slice_half(x)
        x2 = o.slice_half(x)
        return o.cat(o.neg(x2), x1)

    q_embed = o.add(o.mul(q, cos, q.n), o.mul(rot(q), sin, q.n))
    k_embed = o.add(o.mul(k, cos, k.n), o.mul(rot(k), sin, k.n))
    if m.spec.traits.rope_tables_fp32:  # Olmo3: fp32 products, ``.to(q_type)`` / ``.to(k_type)``
        return m.s.cast(q_embed, q.dt), m.s.cast(k_embed, k.dt)
    return q_embed, k_embed


def _fused_rope(m: CausalLM, x: T, cos: T, sin: T, dt: str | None) -> T:
    """``(x * cos) + (rotate_half(x) * sin)`` compiled: one output (in ``dt`` when the code casts it back)."""
    return tricks.fused_pointwise(m.s, (x, cos, sin), (cos, sin), dt)


def split(m: CausalLM, x: T, sizes: tuple[int, ...]) -> tuple[T, ...]:
    """torch.split into views; the backward concatenates the parts' gradients (one new tensor)."""
    outs = tuple(T(x.st, n, x.dt) for n in sizes)
    m.s.node("split", (x,), outs)
    return outs


def kernel(
    m: CausalLM, q: T, k: T, v: T, mask: T | None, a: int, kvh: int, kd: int, vd: int, layer: int = -1
) -> tuple[T, T | None]:
    """The attention implementation: SDPA (fused or math), or eager (with gpt-oss's sinks of ``layer``);
    output [b, q, a * vd]."""
    if m.cfg.attn == "eager" and m.spec.attention_sinks:  # gpt-oss's sinks (replay/sinks.py)
        return _variant(EAGER, "sinks")(m, layer, q, k, v, mask, a, kvh, vd)
    if m.cfg.attn == "eager" and m.spec.traits.attention_code == "gptj":  # fp32 scores (replay/gptj.py)
        return _variant(EAGER, "gptj")(m, layer, q, k, v, mask, a, kvh, vd)
    if m.cfg.attn == "eager":
        return _eager(m, q, k, v, mask, a, kvh, vd)
    return _sdpa(m, q, k, v, mask, a, kvh, kd, vd), None


def repeat_kv(m: CausalLM, x: T, n_rep: int) -> T:
    """``x[:, :, None].expand(...).reshape(b, kvh * n_rep, s, d)``: a view when there is one KV head (the
    merged dimension has size 1), a copy otherwise."""
    if n_rep == 1:
        return x
    if m.spec.num_kv_heads == 1:
        return T(x.st, x.n * n_rep, x.dt, x.rg, x.fn, x.idx)
    out = m.s.new(x.n * n_rep, x.dt)
    m.s.node("copy", (x,), (out,))
    return out


def bmm_operand(m: CausalLM, x: T, n_rep: int) -> T:
    """What torch.matmul hands bmm for a ``repeat_kv``'d operand: one KV head expanded over the query heads
    is a view (:func:`repeat_kv`), and matmul's ``expand(...).reshape(batch x heads, ...)`` copies it when
    there are several sequences (the batch's stride is not heads x the heads' stride 0):
    aten/src/ATen/native/LinearAlgebra.cpp ``_matmul_impl``. bmm saves the copy for backward."""
    if n_rep == 1 or m.spec.num_kv_heads != 1 or not m.cfg.batch > 1:
        return x
    out = m.s.new(x.n, x.dt)
    m.s.node("copy", (x,), (out,))
    return out


def _sdpa(m: CausalLM, q: T, k: T, v: T, mask: T | None, a: int, kvh: int, kd: int, vd: int) -> T:
    s, cfg, spec = m.s, m.cfg, m.spec
    b, sq = cfg.batch, cfg.q
    groups = a // kvh
    broadcast = spec.traits.sdpa_broadcast_kv
    if groups > 1 and not broadcast and mask is not None and sq > 1:
        # use_gqa_in_sdpa needs no mask; a single query is packed instead; otherwise K/V are repeated
        k, v = repeat_kv(m, k, groups), repeat_kv(m, v, groups)
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
    key_states = repeat_kv(m, k, a // kvh)
    value_states = repeat_kv(m, v, a // kvh)
    attn_weights = o.mul(o.bmm(q, bmm_operand(m, key_states, a // kvh), n), None)
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
    attn_output = o.bmm(attn_weights, bmm_operand(m, value_states, a // kvh), b * sq * a * vd)
    del key_states, value_states
    # the probabilities are returned as attn_weights; the decoder layer holds them until it returns
    return o.clone(attn_output), attn_weights
