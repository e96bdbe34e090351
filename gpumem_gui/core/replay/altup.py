"""Gemma 3n's forward (``models/gemma3n/modeling_gemma3n.py``, transformers 5.24), op by op: the
per-layer inputs (Gemma3nTextModel.get_per_layer_inputs / project_per_layer_inputs), AltUp's stacked copies of
the hidden state, Gemma3nTextDecoderLayer (AltUp predict / correct, the Laurel block, the per-layer input
gate), the attention's KV sharing and the MLP's gaussian top-k. Used when :attr:`ModelSpec.altup` is set."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from gpumem_gui.core.replay import attention, inputs
from gpumem_gui.core.replay.memory import T
from gpumem_gui.core.replay.registry import MODELS, register

if TYPE_CHECKING:
    from gpumem_gui.core.replay.config import LayerPlan
    from gpumem_gui.core.replay.context import CausalLM


def _unary(m: CausalLM, x: T, dt: str | None = None) -> T:
    """One elementwise op into a new tensor (``x - y``, ``relu``, ``clamp``, ``sqrt``, ``pow``...)."""
    out = m.s.new(x.n, dt or x.dt)
    m.s.node("copy", (x,), (out,), (x,))
    return out


def norm(m: CausalLM, x: T, name: str | None, width: int) -> T:
    """Gemma3nRMSNorm.forward: ``x.float()``, ``pow(2).mean(-1) + eps``, ``torch.pow(.., -0.5)``, the product,
    ``* weight.float()`` (when ``with_scale``), ``type_as(x)``."""
    o, s = m.o, m.s
    xf = s.cast(x, "f32")
    ms = o.add(o.mean_last(o.pow2(xf), width), None)
    hs = o.mul(xf, _unary(m, ms), xf.n)
    del xf, ms
    if name is not None:
        hs = o.mul(hs, s.cast(m.param(f"{name}.weight"), "f32"), hs.n)
    return s.cast(hs, x.dt)


def _magnitude_matched(m: CausalLM, x: T, target: T, width: int) -> T:
    """``x * target_magnitude / sqrt(mean(x**2).clamp(1e-5))`` (Gemma3nTextModel.forward)."""
    o = m.o
    new_magnitude = _unary(m, _unary(m, o.mean_last(o.pow2(x), width)))
    return o.mul(o.mul(x, target, x.n), new_magnitude, x.n)


def _per_layer_inputs(m: CausalLM, ids: T, inputs_embeds: T) -> T:
    """get_per_layer_inputs (the id mask, torch.where, the scaled per-layer table) then
    project_per_layer_inputs (the projection scaled in place, its norm, the sum scaled by 1/sqrt(2))."""
    o, s, spec, cfg = m.o, m.s, m.spec, m.cfg
    a = spec.altup
    assert a is not None
    width = spec.num_layers * a.per_layer_input_size
    in_table = s.new(cfg.tokens, "bool")
    table_ids = s.new(cfg.tokens, "i64")
    del in_table
    w = m.param("embed_tokens_per_layer.weight")
    raw = s.new(cfg.tokens * width, w.dt)
    s.node("copy", (w,), (raw,), (table_ids,))
    del table_ids
    per_layer = o.mul(raw, None)  # * embed_scale
    del raw
    proj = m.linear(inputs_embeds, "per_layer_model_projection")  # *= scale: in place
    normed = norm(m, proj, "per_layer_projection_norm", a.per_layer_input_size)
    del proj
    summed = o.add(normed, per_layer)
    del normed, per_layer
    return o.mul(summed, None)


@register(MODELS, "altup")
def model(m: CausalLM, ids: T, plan: LayerPlan) -> T:
    """Gemma3nTextModel.forward over the plan's layers; returns the final norm's output."""
    o, s, spec, cfg = m.o, m.s, m.spec, m.cfg
    a = spec.altup
    assert a is not None
    h, t, k = spec.hidden_size, cfg.tokens, a.num_inputs
    s.region = "hidden_states"
    inputs_embeds, _keep = inputs.embed(m, ids)
    per_layer_inputs = _per_layer_inputs(m, ids, inputs_embeds)
    s.region = "mask"
    masks = inputs.masks(m, inputs_embeds.dt)
    s.region = "inputs"
    _position_ids = s.new(cfg.q, "i64")
    s.region = "hidden_states"
    target = _unary(m, o.mean_last(o.pow2(inputs_embeds), h))  # mean(h0 ** 2) ** 0.5
    streams = [inputs_embeds]
    _last_proj: T | None = None  # `altup_proj` of the last iteration, a local until the forward returns
    for j in range(1, k):
        _last_proj = m.linear(inputs_embeds, f"altup_projections.{j - 1}")
        streams.append(_magnitude_matched(m, _last_proj, target, h))
    hidden_states = s.new(k * t * h, inputs_embeds.dt)  # torch.stack
    s.node("pass", tuple(streams), (hidden_states,))
    s.region = "rope"
    rotary = {kind: inputs.rotary(m, hidden_states) for kind in sorted(set(spec.resolved_layer_types))}
    s.region = "hidden_states"
    shared: dict[str, tuple[T, T]] = {}
    for first, i in plan.segments:
        if i > first:  # layers first..i-1 run unreplayed: their output and their caches
            if m.cache is not None:
                m.cache.skip(first, i, cfg.q)
            hidden_states = s.new(k * t * h, hidden_states.dt)
        kind = spec.resolved_layer_types[i]
        cos, sin = rotary[kind]
        args = (hidden_states, cos, sin, masks.get(kind), per_layer_inputs)
        if cfg.grad_ckpt and (i + 1) % cfg.ckpt_every == 0:  # GradientCheckpointingLayer
            # the checkpoint keeps every tensor argument of the layer call (position_ids included)
            hidden_states = s.checkpoint(partial(_layer_call, m, i, shared), *args, _position_ids)
        else:
            hidden_states = layer(m, i, *args, shared)
        del args
    s.tr.where = "final norm"
    del target, _last_proj
    target = _unary(m, o.mean_last(o.pow2(hidden_states), h))
    streams = [hidden_states]  # hidden_states[0], a view of the last layer's output
    for j in range(1, k):
        proj = m.linear(hidden_states, f"altup_unembed_projections.{j - 1}")
        streams.append(_magnitude_matched(m, proj, target, h))
        del proj
    stacked = s.new(k * t * h, hidden_states.dt)
    s.node("pass", tuple(streams), (stacked,))
    mean = o.mean_last(stacked, k)  # torch.mean(dim=0)
    del stacked
    s.region = "norm"
    return norm(m, mean, "norm", h) if cfg.lm_head else mean


def _layer_call(m: CausalLM, i: int, shared: dict[str, tuple[T, T]], *args: T | None) -> T:
    """The checkpointed call of :func:`layer` (its last argument, position_ids, is only kept)."""
    hidden_states, cos, sin, mask, per_layer_inputs, _position_ids = args
    assert hidden_states is not None and cos is not None and sin is not None and per_layer_inputs is not None
    return layer(m, i, hidden_states, cos, sin, mask, per_layer_inputs, shared)


def _router(m: CausalLM, x: T, pre: str) -> T:
    """Gemma3nTextAltUp.compute_router_modalities: router_norm, * router_input_scale, modality_router,
    tanh of an fp32 copy, cast back."""
    k = m.spec.altup.num_inputs  # type: ignore[union-attr]
    normed = norm(m, x, f"{pre}.router_norm", m.spec.hidden_size)
    scaled = m.o.mul(normed, None)
    del normed
    routed = m.linear(scaled, f"{pre}.modality_router")
    del scaled
    assert routed.n == m.cfg.tokens * k
    return m.s.cast(m.o.tanh(m.s.cast(routed, "f32")), x.dt)


def _predict(m: CausalLM, hidden_states: T, pre: str) -> T:
    """Gemma3nTextAltUp.predict: the coefficients, torch.matmul of the permuted streams (reshaped into a
    copy), ``+= hidden_states`` in place, ``.contiguous()`` of the permuted result."""
    o, s = m.o, m.s
    k = m.spec.altup.num_inputs  # type: ignore[union-attr]
    modalities = _router(m, hidden_states.view(hidden_states.n // k), pre)
    coefs = m.linear(modalities, f"{pre}.prediction_coefs")
    del modalities
    # torch.matmul reshapes the permuted operands (autocast: their bf16 casts) into views: [b * q, h, K]
    permuted = o.view(s.ac_cast(hidden_states) or hidden_states)  # hidden_states.permute(1, 2, 3, 0)
    coefs_t = o.view(s.ac_cast(coefs) or coefs)  # .permute(0, 1, 3, 2)
    del coefs
    predictions = _in_place_add(m, o.bmm(permuted, coefs_t, hidden_states.n), hidden_states)
    del permuted, coefs_t
    return s.cast(o.clone(predictions), hidden_states.dt)  # .contiguous().type_as(hidden_states)


def _correct(m: CausalLM, predictions: T, activated: T, pre: str) -> T:
    """Gemma3nTextAltUp.correct: ``activated - predictions[0]`` repeated over the streams, the correction
    coefficients + 1, their product (``+= predictions`` in place)."""
    o = m.o
    k = m.spec.altup.num_inputs  # type: ignore[union-attr]
    modalities = _router(m, activated, pre)
    innovation = o.add(activated, predictions.view(activated.n))
    repeated = m.s.new(innovation.n * k, innovation.dt)
    m.s.node("copy", (innovation,), (repeated,))
    del innovation
    coefs = o.add(m.linear(modalities, f"{pre}.correction_coefs"), None)
    del modalities
    return _in_place_add(m, o.mul(repeated, coefs, repeated.n), predictions)


def _in_place_add(m: CausalLM, x: T, y: T) -> T:
    """``x += y``: a new version of ``x`` on the same storage (AddBackward saves nothing)."""
    added = T(x.st, x.n, x.dt)
    m.s.node("pass", (x, y), (added,))
    return added


def _mlp(m: CausalLM, i: int, x: T) -> T:
    """Gemma3nTextMLP.forward, with _gaussian_topk on the sparse layers (mean, std, cutoff, the shifted
    gate and its relu)."""
    o, spec = m.o, m.spec
    pre = f"layers.{i}.mlp"
    gate = m.linear(x, f"{pre}.gate_proj")
    if i in spec.altup.sparse_layers:  # type: ignore[union-attr]
        f = spec.intermediate_size
        mean = o.mean_last(gate, f)
        std = o.mean_last(gate, f)
        cutoff = o.add(mean, o.mul(std, None))
        del mean, std
        shifted = o.add(gate, cutoff, gate.n)
        del cutoff, gate
        gate = _unary(m, shifted)  # relu
        del shifted
    act = o.gelu_tanh(gate)
    up = m.linear(x, f"{pre}.up_proj")
    prod = o.mul(act, up)
    out = m.linear(prod, f"{pre}.down_proj")
    del gate, act, up, prod
    return out


def _attention(
    m: CausalLM, i: int, x: T, cos: T, sin: T, mask: T | None, shared: dict[str, tuple[T, T]]
) -> T:
    """Gemma3nTextAttention.forward: q_proj, q_norm, the rotary; on a KV-shared layer the stored layer's
    keys and values, otherwise k/v projections, k_norm, the weightless v_norm, the cache update (the last
    unshared layer of each type stores what the update returns)."""
    o, s, spec, cfg = m.o, m.s, m.spec, m.cfg
    pre = f"layers.{i}.self_attn"
    a, kvh, d = spec.num_attention_heads, spec.num_kv_heads, spec.head_dim
    kind = spec.resolved_layer_types[i]
    prev, s.region = s.region, "attention"
    q = norm(m, m.linear(x, f"{pre}.q_proj"), f"{pre}.q_norm", d)
    q = rope_one(m, q, cos, sin)
    if i in spec.kv_shared_layers:
        k, v = shared[kind]
    else:
        k = norm(m, o.view(m.linear(x, f"{pre}.k_proj"), copy_grad=True), f"{pre}.k_norm", d)
        k = rope_one(m, k, cos, sin)
        v = norm(m, o.view(m.linear(x, f"{pre}.v_proj"), copy_grad=True), None, d)
        if m.cache is not None:
            k, v = m.cache.update(i, k, v, cfg.q)
        if stores_kv(spec, i):
            shared[kind] = (k, v)
    out, _weights = attention.kernel(m, q, k, v, mask, a, kvh, d, d, layer=i)
    del q, k, v, _weights
    result = m.linear(out, f"{pre}.o_proj")
    s.region = prev
    return result


def rope_one(m: CausalLM, x: T, cos: T, sin: T) -> T:
    """apply_rotary_pos_emb on one tensor: ``(x * cos) + (rotate_half(x) * sin)``."""
    o = m.o
    x1, x2 = o.slice_half(x), o.slice_half(x)
    return o.add(o.mul(x, cos, x.n), o.mul(o.cat(o.neg(x2), x1), sin, x.n))


def stores_kv(spec: object, i: int) -> bool:
    """Gemma3nTextConfig.kv_sharing_modes 'store': the last unshared layer of its type."""
    types = spec.resolved_layer_types  # type: ignore[attr-defined]
    unshared = [j for j in range(len(types)) if j not in spec.kv_shared_layers]  # type: ignore[attr-defined]
    return bool(spec.kv_shared_layers) and max(j for j in unshared if types[j] == types[i]) == i  # type: ignore[attr-defined]


def layer(
    m: CausalLM,
    i: int,
    hidden_states: T,
    cos: T,
    sin: T,
    mask: T | None,
    per_layer_inputs: T,
    shared: dict[str, tuple[T, T]],
) -> T:
    """Gemma3nTextDecoderLayer.forward; every named intermediate stays alive until the layer returns."""
    o, s, spec = m.o, m.s, m.spec
    h, pre = spec.hidden_size, f"layers.{i}"
    s.tr.where = f"layer {i} attention"
    predictions = _predict(m, hidden_states, f"{pre}.altup")
    active = predictions.view(predictions.n // spec.altup.num_inputs)  # type: ignore[union-attr]
    s.region = "norm"
    active_normed = norm(m, active, f"{pre}.norm0", h)
    s.region = "hidden_states"
    left = m.linear(active_normed, f"{pre}.laurel.linear_left")
    right = m.linear(left, f"{pre}.laurel.linear_right")
    del left
    laurel_normed = norm(m, right, f"{pre}.laurel.post_laurel_norm", h)
    del right
    laurel_output = o.add(active_normed, laurel_normed)
    del laurel_normed
    attn = _attention(m, i, active_normed, cos, sin, mask, shared)
    attn = norm(m, attn, f"{pre}.norm1", h)
    attn_gated = o.add(active, attn)
    attn_laurel = o.mul(o.add(attn_gated, laurel_output), None)
    s.tr.where = f"layer {i} MLP"
    attn_norm = norm(m, attn_laurel, f"{pre}.norm2", h)
    s.region = "mlp"
    attn_ffw = _mlp(m, i, attn_norm)
    s.region = "hidden_states"
    attn_ffw_norm = norm(m, attn_ffw, f"{pre}.norm3", h)
    attn_ffw_laurel_gated = o.add(attn_laurel, attn_ffw_norm)
    corrected = _correct(m, predictions, attn_ffw_laurel_gated, f"{pre}.altup")
    first = o.clone(active)  # corrected_predictions[0].clone()
    first = o.mul(first, m.param(f"{pre}.altup.correct_output_scale"), first.n)
    gated = o.gelu_tanh(m.linear(first, f"{pre}.per_layer_input_gate"))
    first = o.mul(gated, per_layer_inputs, gated.n)  # per_layer_inputs[:, :, i, :]
    del gated
    first = norm(m, m.linear(first, f"{pre}.per_layer_projection"), f"{pre}.post_per_layer_input_norm", h)
    del predictions, active, active_normed, laurel_output, attn, attn_gated, attn_laurel, attn_norm
    corrected = _in_place_add(m, corrected, first)  # corrected_predictions[1:] += first_prediction
    del attn_ffw, attn_ffw_norm, attn_ffw_laurel_gated, first
    return corrected
