"""Gemma 4's forward (``models/gemma4/modeling_gemma4.py``, transformers 5.24), op by op: Gemma4TextModel
(per-layer inputs, one rotary table per layer type with its own head dim, the slicing of the KV-shared layers'
inputs to ``logits_to_keep``), Gemma4TextDecoderLayer (the dense MLP and the MoE block side by side, the
per-layer input gate, ``*= layer_scalar``) and Gemma4TextAttention (per-layer head dims and KV heads,
``attention_k_eq_v``, KV sharing). Used when :attr:`ModelSpec.gemma4` is set; Gemma4RMSNorm is Gemma 3n's
(:func:`.altup.norm`)."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING

from gpumem_gui.core.replay import attention, inputs, mlp
from gpumem_gui.core.replay.altup import norm, rope_one, stores_kv
from gpumem_gui.core.replay.memory import T
from gpumem_gui.core.replay.registry import MODELS, register
from gpumem_gui.core.spec import gemma4 as g4

if TYPE_CHECKING:
    from gpumem_gui.core.replay.config import LayerPlan
    from gpumem_gui.core.replay.context import CausalLM


def _per_layer_inputs(m: CausalLM, inputs_embeds: T) -> T:
    """get_per_layer_inputs (the packed table's rows times embed_scale, reshaped) then
    project_per_layer_inputs (the projection times its scale, reshaped, normed; the sum times 1/sqrt(2))."""
    o, s, spec, cfg = m.o, m.s, m.spec, m.cfg
    p = spec.gemma4.per_layer_input_size  # type: ignore[union-attr]
    w = m.param("embed_tokens_per_layer.weight")
    raw = s.new(cfg.tokens * spec.num_layers * p, w.dt)
    s.node("copy", (w,), (raw,))
    per_layer = o.mul(raw, None)  # * embed_scale
    del raw
    proj = o.mul(m.linear(inputs_embeds, "per_layer_model_projection"), None)  # * projection scale
    normed = norm(m, proj, "per_layer_projection_norm", p)
    del proj
    out = o.mul(o.add(normed, per_layer), None)
    del normed, per_layer
    return out


def _rotary(m: CausalLM, x: T, d: int) -> tuple[T, T]:
    """Gemma4TextRotaryEmbedding.forward for one layer type: fp32 cos/sin [1, q, d] cast to x's dtype."""
    s = m.s
    return s.cast(s.new(m.cfg.q * d, "f32"), x.dt), s.cast(s.new(m.cfg.q * d, "f32"), x.dt)


def _slices(m: CausalLM) -> bool:
    """Gemma4TextModel._maybe_slice_kv_shared_inputs: from the first KV-shared layer on, a prefill that keeps
    the last logit (an int ``logits_to_keep``, not flash) runs on that token only."""
    cfg = m.cfg
    return bool(m.spec.kv_shared_layers) and cfg.logits_to_keep > 0 and cfg.q > 1 and cfg.attn != "flash"


@register(MODELS, "gemma4")
def model(m: CausalLM, ids: T, plan: LayerPlan) -> T:
    """Gemma4TextModel.forward over the plan's layers; returns the final norm's output."""
    s, spec, cfg = m.s, m.spec, m.cfg
    h = spec.hidden_size
    s.region = "hidden_states"
    inputs_embeds, _keep = inputs.embed(m, ids)
    per_layer_inputs = _per_layer_inputs(m, inputs_embeds) if spec.gemma4.per_layer_input_size else None  # type: ignore[union-attr]
    s.region = "mask"
    masks = inputs.masks(m, inputs_embeds.dt)
    s.region = "inputs"
    position_ids = s.new(cfg.q, "i64")
    s.region = "rope"
    types = spec.resolved_layer_types
    rotary = {
        kind: _rotary(m, inputs_embeds, g4.head_dim(spec, types.index(kind))) for kind in sorted(set(types))
    }
    s.region = "hidden_states"
    hidden_states = inputs_embeds
    shared: dict[str, tuple[T, T]] = {}
    first_shared = min(spec.kv_shared_layers, default=spec.num_layers)
    full_cfg, sliced = cfg, False
    for first, i in plan.segments:
        if i > first and m.cache is not None:  # layers first..i-1 run unreplayed: their caches grow
            m.cache.skip(first, i, full_cfg.q)  # (a KV-shared layer has none)
        if i >= first_shared and not sliced and _slices(m):  # [:, -logits_to_keep:] views from here on
            sliced = True
            keep = full_cfg.logits_to_keep
            m.cfg = replace(full_cfg, q=keep, past=full_cfg.past + full_cfg.q - keep)
            hidden_states = T(hidden_states.st, m.cfg.tokens * h, hidden_states.dt)
            masks = {k: T(v.st, m.cfg.tokens * full_cfg.kv_len, v.dt) for k, v in masks.items()}
        if i > first:  # the last unreplayed layer's output (on the kept positions once sliced)
            hidden_states = s.new(m.cfg.tokens * h, hidden_states.dt)
        kind = types[i]
        cos, sin = rotary[kind]
        pli = per_layer_inputs
        if pli is not None and sliced:
            pli = T(pli.st, m.cfg.tokens * spec.num_layers * spec.gemma4.per_layer_input_size, pli.dt)  # type: ignore[union-attr]
        args = (hidden_states, cos, sin, masks.get(kind), pli)
        if cfg.grad_ckpt and (i + 1) % cfg.ckpt_every == 0:  # GradientCheckpointingLayer
            hidden_states = s.checkpoint(partial(_layer_call, m, i, shared), *args, position_ids)
        else:
            hidden_states = layer(m, i, *args, shared)
        del args
    s.tr.where = "final norm"
    del shared, position_ids
    if not cfg.lm_head:
        return hidden_states
    s.region = "norm"
    return norm(m, hidden_states, "norm", h)  # sliced: m.cfg keeps the kept positions for the head


def _layer_call(m: CausalLM, i: int, shared: dict[str, tuple[T, T]], *args: T | None) -> T:
    """The checkpointed call of :func:`layer` (its last argument, position_ids, is only kept)."""
    hidden_states, cos, sin, mask, per_layer_inputs, _position_ids = args
    assert hidden_states is not None and cos is not None and sin is not None
    return layer(m, i, hidden_states, cos, sin, mask, per_layer_inputs, shared)


def _attention(
    m: CausalLM, i: int, x: T, cos: T, sin: T, mask: T | None, shared: dict[str, tuple[T, T]]
) -> T:
    """Gemma4TextAttention.forward: q_proj, q_norm, the rotary; on a KV-shared layer the stored layer's keys
    and values, otherwise k_proj and v_proj (or the k projection again, attention_k_eq_v), k_norm, the
    rotary, the weightless v_norm, the cache update (a 'store' layer keeps what the update returns)."""
    o, s, spec = m.o, m.s, m.spec
    pre = f"layers.{i}.self_attn"
    a, kvh, d = spec.num_attention_heads, g4.kv_heads(spec, i), g4.head_dim(spec, i)
    kind = spec.resolved_layer_types[i]
    prev, s.region = s.region, "attention"
    q = rope_one(m, norm(m, m.linear(x, f"{pre}.q_proj"), f"{pre}.q_norm", d), cos, sin)
    if i in spec.kv_shared_layers:
        k, v = shared[kind]
    else:
        k_raw = o.view(m.linear(x, f"{pre}.k_proj"), copy_grad=True)
        v_raw = o.view(m.linear(x, f"{pre}.v_proj"), copy_grad=True) if g4.has_v_proj(spec, i) else k_raw
        k = rope_one(m, norm(m, k_raw, f"{pre}.k_norm", d), cos, sin)
        del k_raw
        v = norm(m, v_raw, None, d)
        del v_raw
        if m.cache is not None:
            k, v = m.cache.update(i, k, v, m.cfg.q)
        if stores_kv(spec, i):
            shared[kind] = (k, v)
    out, _weights = attention.kernel(m, q, k, v, mask, a, kvh, d, d, layer=i)
    del q, k, v, _weights
    result = m.linear(out, f"{pre}.o_proj")
    s.region = prev
    return result


def _router(m: CausalLM, x: T, pre: str) -> tuple[T, T, T]:
    """Gemma4TextRouter.forward: the weightless norm, ``* scale * scalar_root_size``, proj, the fp32
    softmax (returned: the layer keeps it as ``_``), top-k, ``/=`` their sum in place (saves a clone and the
    sum), ``* per_expert_scale[top_k_index]``; returns (probabilities, fp32 weights, indices)."""
    o, s = m.o, m.s
    moe = m.spec.moe
    assert moe is not None
    t, e, k = m.cfg.tokens, moe.num_experts, moe.experts_per_token
    normed = norm(m, x, None, m.spec.hidden_size)
    scaled = o.mul(o.mul(normed, m.param(f"{pre}.scale"), normed.n), None)
    del normed
    scores = m.linear(scaled, f"{pre}.proj")
    del scaled
    f32 = s.cast(scores, "f32")
    probs = s.new(t * e, "f32")
    s.node("copy", (f32,), (probs,), (probs,))
    del f32, scores
    top, top_idx = s.new(t * k, "f32"), s.new(t * k, "i64")
    s.node("copy", (probs,), (top,), (top_idx,))
    total = s.new(t, "f32")
    s.node("copy", (top,), (total,))
    original = s.new(t * k, "f32")
    s.node("pass", (top,), (original,))
    top2 = T(top.st, top.n, top.dt)
    s.node("mul", (original, total), (top2,), (original, total))
    del original, total, top
    scale = m.param(f"{pre}.per_expert_scale")
    picked = s.new(t * k, scale.dt)
    s.node("copy", (scale,), (picked,), (top_idx,))
    weights = o.mul(top2, picked, t * k)
    del top2, picked
    return probs, weights, top_idx


def _feed_forward(m: CausalLM, i: int, residual: T) -> tuple[T, list[T]]:
    """The dense MLP on pre_feedforward_layernorm's output and, with the MoE block, the experts on the
    residual (routed by it) beside it: ``post_feedforward_layernorm_1(mlp) + post_feedforward_layernorm_2(
    experts)``; returns the output and the MoE block's locals, which live until the layer returns."""
    o, s, spec = m.o, m.s, m.spec
    h, pre = spec.hidden_size, f"layers.{i}"
    s.region = "norm"
    x = norm(m, residual, f"{pre}.norm2", h)
    s.region = "mlp"
    dense = mlp.dense(m, f"{pre}.mlp", x)
    del x
    if spec.moe is None:
        s.region = "hidden_states"
        return dense, []
    dense_normed = norm(m, dense, f"{pre}.post_feedforward_layernorm_1", h)
    _probs, weights, _idx = _router(m, residual, f"{pre}.router")
    x2 = norm(m, residual, f"{pre}.pre_feedforward_layernorm_2", h)
    routed = mlp._experts(m, pre, x2, weights)
    del x2
    routed_normed = norm(m, routed, f"{pre}.post_feedforward_layernorm_2", h)
    del routed
    out = o.add(dense_normed, routed_normed)
    del dense
    s.region = "hidden_states"
    return out, [dense_normed, routed_normed, _probs, weights, _idx]


def layer(
    m: CausalLM,
    i: int,
    hidden_states: T,
    cos: T,
    sin: T,
    mask: T | None,
    per_layer_inputs: T | None,
    shared: dict[str, tuple[T, T]],
) -> T:
    """Gemma4TextDecoderLayer.forward."""
    o, s, spec = m.o, m.s, m.spec
    h, pre = spec.hidden_size, f"layers.{i}"
    s.tr.where = f"layer {i} attention"
    s.region = "norm"
    normed = norm(m, hidden_states, f"{pre}.norm0", h)
    s.region = "hidden_states"
    attn = _attention(m, i, normed, cos, sin, mask, shared)
    del normed
    attn = norm(m, attn, f"{pre}.norm1", h)
    residual = o.add(hidden_states, attn)
    del attn
    s.tr.where = f"layer {i} MLP"
    ff, held = _feed_forward(m, i, residual)
    ff = norm(m, ff, f"{pre}.norm3", h)
    out = o.add(residual, ff)
    del ff, residual
    if per_layer_inputs is not None:  # the per-layer input gate
        gate = mlp.act(m, m.linear(out, f"{pre}.per_layer_input_gate"))
        gated = o.mul(gate, per_layer_inputs, gate.n)  # per_layer_inputs[:, :, i, :]
        del gate
        proj = norm(m, m.linear(gated, f"{pre}.per_layer_projection"), f"{pre}.post_per_layer_input_norm", h)
        del gated
        out = o.add(out, proj)
        del proj
    scaled = T(out.st, out.n, out.dt)  # hidden_states *= self.layer_scalar (in place)
    s.node("pass", (out,), (scaled,))
    del held
    return scaled
