"""DeepSeek-V4's forward on symbolic tensors (transformers 5.24
``models/deepseek_v4/modeling_deepseek_v4.py``), ``ArchTraits.model_forward == "deepseek_v4"``:

* ``DeepseekV4Model.forward``: the embedding, ``position_ids``, one eager sliding-window mask
  (``create_sliding_window_causal_mask``: ``[b, 1, q, kv]`` in the activation dtype, the same for every
  layer), the embedding expanded into ``hc_mult`` contiguous streams, the ``main`` and ``compress`` rotary
  tables, every decoder layer, ``DeepseekV4HyperHead`` and the fp32-weight final norm.
* ``DeepseekV4HyperConnection``: the streams flattened to fp32 and normalised, ``F.linear`` with the fp32
  ``fn``, the ``pre`` / ``post`` / ``comb`` weights (sigmoid, 2 x sigmoid, softmax + Sinkhorn-Knopp
  iterations over ``[hc, hc]``), the streams collapsed by ``pre`` (an fp32 product, summed, cast back).
* ``DeepseekV4DecoderLayer``: ``post * out + comb^T @ streams`` after the attention (:mod:`.dsv4_attention`)
  and after ``DeepseekV4SparseMoeBlock`` (the sqrt-softplus router or the hash router's ``tid2eid`` lookup,
  the grouped_mm experts with their clamped gate, the clamped shared MLP).

Every layer is replayed (inference included): the compressed layers' cache is a rule of the length whose
transient tensors depend on the layer's own kind.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from gpumem_gui.core.replay import dsv4_attention, inputs
from gpumem_gui.core.replay.dsv4_attention import LayerCache
from gpumem_gui.core.replay.dsv4_ops import op, tables, unweighted_norm, weighted_norm
from gpumem_gui.core.replay.ffn import clamp, gated
from gpumem_gui.core.replay.memory import T
from gpumem_gui.core.replay.mlp import _experts
from gpumem_gui.core.replay.registry import MODELS, register
from gpumem_gui.core.spec.compressed import layer_cache_bytes

if TYPE_CHECKING:
    from gpumem_gui.core.replay.config import LayerPlan
    from gpumem_gui.core.replay.context import CausalLM


def _chain(m: CausalLM, x: T, ops: int, n: Any) -> T:
    """``ops`` elementwise ops in a row (``x * scale + base``, sigmoid, ``+ eps``), each a new tensor."""
    for _ in range(ops):
        x = op(m, n, x.dt, (x,), (x,))
    return x


def _hyper(m: CausalLM, name: str, hs: T) -> tuple[T, T, T]:
    """DeepseekV4HyperConnection.forward: (post, comb, collapsed)."""
    o, s, spec, cfg, v4 = m.o, m.s, m.spec, m.cfg, m.spec.deepseek_v4
    assert v4 is not None
    n, h, t = v4.hc_mult, spec.hidden_size, cfg.tokens
    flat = s.cast(hs, "f32")
    normed = unweighted_norm(m, flat, n * h)
    del flat
    mixes = o.linear(normed, m.param(f"{name}.fn"), None, (2 + n) * n, n * h)
    del normed
    pre_w = T(mixes.st, t * n, mixes.dt, mixes.rg, mixes.fn, mixes.idx)  # split views
    comb_w = T(mixes.st, t * n * n, mixes.dt, mixes.rg, mixes.fn, mixes.idx)
    pre = _chain(m, pre_w, 4, t * n)  # sigmoid(pre_w * pre_scale + pre_b) + hc_eps
    post = _chain(m, pre_w, 4, t * n)  # 2 * sigmoid(post_w * post_scale + post_b)
    comb = _chain(m, comb_w, 4, t * n * n)  # softmax(comb_w * comb_scale + comb_b) + hc_eps
    del pre_w, comb_w, mixes
    for _ in range(2 * v4.hc_sinkhorn_iters - 1):  # comb / (comb.sum(dim) + hc_eps), rows then columns
        total = _chain(m, comb, 2, t * n)
        comb = o.mul(comb, total, t * n * n)
        del total
    prod = o.mul(pre, hs, t * n * h)  # (pre.unsqueeze(-1) * hidden_streams) in fp32
    del pre
    summed = op(m, t * h, prod.dt, (prod,))
    del prod
    collapsed = s.cast(summed, hs.dt)
    return post, comb, collapsed


def _mix(m: CausalLM, post: T, comb: T, out: T, hs: T) -> T:
    """``post.to(dtype).unsqueeze(-1) * out.unsqueeze(-2) + matmul(comb.to(dtype).transpose(-1, -2), hs)``."""
    o, s = m.o, m.s
    a = o.mul(s.cast(post, hs.dt), out, hs.n)
    del post, out
    mm = o.bmm(s.cast(comb, hs.dt), hs, hs.n)
    del comb
    return o.add(a, mm)


def _moe(m: CausalLM, i: int, x: T) -> T:
    """DeepseekV4SparseMoeBlock.forward: the router's logits live until it returns."""
    o, s, spec, cfg, v4 = m.o, m.s, m.spec, m.cfg, m.spec.deepseek_v4
    assert v4 is not None and spec.moe is not None
    t, e, k, pre = cfg.tokens, spec.moe.num_experts, spec.moe.experts_per_token, f"layers.{i}.mlp"
    s.region = "mlp"
    logits = m.linear(x, f"{pre}.gate")
    soft = op(m, t * e, logits.dt, (logits,), (logits,))  # sqrtsoftplus: softplus(x).sqrt()
    scores = op(m, t * e, soft.dt, (soft,), (soft,))
    del soft
    if i in v4.hash_layers:  # DeepseekV4HashRouter: tid2eid[input_ids]
        indices = s.new(t * k, "i64")
    else:  # DeepseekV4TopKRouter: topk(scores + e_score_correction_bias).indices
        biased = s.new(t * e, "f32")
        vals, indices = s.new(t * k, "f32"), s.new(t * k, "i64")
        del biased, vals
    weights = op(m, t * k, scores.dt, (scores,), (indices,))  # scores.gather(1, indices)
    del scores
    total = _chain(m, weights, 2, t)  # weights.sum(dim=-1) + 1e-20
    weights = o.mul(weights, total, t * k)
    del total
    weights = o.mul(weights, None)  # * routed_scaling_factor
    routed = _experts(m, pre, x, weights)
    del weights, indices
    sh = f"{pre}.shared_experts"  # DeepseekV4MLP: both projections clamped
    gate = clamp(m, m.linear(x, f"{sh}.gate_proj"))
    up = clamp(m, m.linear(x, f"{sh}.up_proj"))
    prod = gated(m, gate, up)
    del gate, up
    shared = m.linear(prod, f"{sh}.down_proj")
    del prod
    out = o.add(routed, shared)
    del logits
    s.region = "hidden_states"
    return out


def layer(
    m: CausalLM, i: int, tabs: dict[str, tuple[T, T]], mask: T | None, c: LayerCache | None, hs: T
) -> T:
    """DeepseekV4DecoderLayer.forward over the ``[b, q, hc_mult, hidden]`` streams."""
    s = m.s
    s.tr.where = f"layer {i} attention"
    # ``collapsed`` is a local of the layer: it lives until the second hyper-connection rebinds it;
    # ``attn_output, _ = self.self_attn(...)``: the output and the probabilities live until it returns
    post, comb, collapsed = _hyper(m, f"layers.{i}.attn_hc", hs)
    normed = weighted_norm(m, collapsed, f"layers.{i}.input_layernorm")
    attn_output, _weights = dsv4_attention.attention(m, i, normed, tabs, mask, c)
    del normed
    hs = _mix(m, post, comb, attn_output, hs)
    del post, comb
    s.tr.where = f"layer {i} MLP"
    post, comb, collapsed = _hyper(m, f"layers.{i}.ffn_hc", hs)
    normed = weighted_norm(m, collapsed, f"layers.{i}.post_attention_layernorm")
    out = _moe(m, i, normed)
    del normed
    out = _mix(m, post, comb, out, hs)
    del attn_output, _weights, collapsed
    return out


def _caches(m: CausalLM, layers: list[int]) -> dict[int, LayerCache]:
    """The compressed layers' caches (inference): what ``past`` tokens left in each (the kinds' rule)."""
    if m.cache is None:
        return {}
    s, cfg, v4 = m.s, m.cfg, m.spec.deepseek_v4
    assert v4 is not None
    out = {}
    for i in layers:
        kind = v4.attention.layer_types[i]
        if kind == "sliding_attention":
            continue
        held = []
        if cfg.past > 0:
            nbytes = cfg.batch * layer_cache_bytes(v4.attention, kind, cfg.past, round(cfg.kv_bytes))
            held.append(T(s.storage(nbytes, "kv_cache"), nbytes, "u8"))
        out[i] = LayerCache(held)
    m.cache.own.update(out)  # the cache outlives the forward
    return out


def _head(m: CausalLM, hs: T) -> T:
    """DeepseekV4HyperHead (the streams collapsed by sigmoid weights, in fp32) and the final norm."""
    o, s, spec, cfg, v4 = m.o, m.s, m.spec, m.cfg, m.spec.deepseek_v4
    assert v4 is not None
    n, h, t = v4.hc_mult, spec.hidden_size, cfg.tokens
    s.tr.where = "final norm"
    s.region = "norm"
    flat = s.cast(hs, "f32")
    normed = unweighted_norm(m, flat, n * h)
    del flat
    mixes = o.linear(normed, m.param("hc_head.hc_fn"), None, n, n * h)
    del normed
    pre = _chain(m, mixes, 4, t * n)
    del mixes
    prod = o.mul(pre, hs, t * n * h)
    del pre, hs
    summed = op(m, t * h, prod.dt, (prod,))
    del prod
    out = s.cast(summed, m.cfg.param_dt)
    del summed
    return weighted_norm(m, out, "norm")


@register(MODELS, "deepseek_v4")
def model(m: CausalLM, ids: T, plan: LayerPlan) -> T:
    """DeepseekV4Model.forward over the plan's layers (and, in inference, the ones it skips: every layer is
    replayed); returns the final norm's output."""
    s, spec, cfg, v4 = m.s, m.spec, m.cfg, m.spec.deepseek_v4
    assert v4 is not None
    s.tr.where = "embedding"
    s.region = "hidden_states"
    inputs_embeds, _keep = inputs.embed(m, ids)
    dt = inputs_embeds.dt
    s.region = "inputs"
    position_ids = s.new(cfg.q, "i64")  # arange(q) + past_seen
    s.region = "mask"
    kept = min(cfg.past, v4.attention.sliding_window - 1) + cfg.q  # DynamicSlidingWindowLayer.get_mask_sizes
    mask = s.new(cfg.batch * cfg.q * kept, dt)
    s.region = "hidden_states"
    hs = op(m, cfg.tokens * v4.hc_mult * spec.hidden_size, dt, (inputs_embeds,))  # expand(...).contiguous()
    s.region = "rope"
    tabs = {"main": tables(m, cfg.q, dt), "compress": tables(m, cfg.q, dt)}
    s.region = "hidden_states"
    layers = sorted({j for first, i in plan.segments for j in range(first if m.cache else i, i + 1)})
    caches = _caches(m, layers)
    for i in layers:
        c = caches.get(i)
        call = partial(layer, m, i, tabs, mask, c)
        hs = s.checkpoint(call, hs) if cfg.grad_ckpt and (i + 1) % cfg.ckpt_every == 0 else call(hs)
        if c is not None:
            c.done()
    del position_ids, mask, tabs
    return _head(m, hs)
