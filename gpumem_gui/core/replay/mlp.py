"""Feed-forward blocks on symbolic tensors: gated and plain MLPs, Phi-3's fused gate_up, and MoE.

* ``LlamaMLP.forward``: ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``; ``Phi3MLP``: one ``gate_up_proj``
  chunked into views; GPT-2 / OPT / BLOOM / GPT-NeoX: ``fc2(act(fc1(x)))`` (+ residual dropout).
* MoE with transformers' grouped_mm experts (``integrations/moe.py`` ``grouped_mm_experts_forward``): router
  linear, fp32 softmax, top-k (renormalised in place unless the architecture keeps the raw weights), tokens
  sorted by expert and gathered (t x k rows), gate_up and down grouped matmuls in the experts' dtype
  (grouped_mm is not autocast-enabled: the input is cast to the weight dtype), routing weights applied, rows
  un-permuted and summed over k; a shared expert (Qwen2-MoE, DeepSeek) runs beside them.

The functions take the :class:`~gpumem_gui.core.replay.model.CausalLM` they run in as ``m``; the building
blocks the MoE variants share (activation, dense MLP, grouped matmul, shared expert) are in :mod:`.ffn`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumem_gui.core.replay import adapters, chunked, moe_bias, moe_lora, moe_per_expert, routers
from gpumem_gui.core.replay.ffn import act, clamp, dense, gated, grouped, shared
from gpumem_gui.core.replay.memory import T

if TYPE_CHECKING:
    from gpumem_gui.core.replay.context import CausalLM


def mlp(m: CausalLM, i: int, x: T) -> T:
    """The feed-forward of layer ``i`` from its normed input."""
    s = m.s
    prev, s.region = s.region, "mlp"
    out = moe(m, i, x) if m.spec.is_moe_layer(i) else dense(m, f"layers.{i}.mlp", x)
    s.region = prev
    return out


def _route(m: CausalLM, x: T, pre: str) -> tuple[T, T]:
    """TopKRouter.forward: router logits, fp32 softmax, top-k (renormalised in place: the in-place div saves
    a clone of the original values and the sum); returns (router logits, routing weights in their dtype).
    DeepSeek's router works in fp32 throughout (:func:`_route_fp32`)."""
    s, spec = m.s, m.spec
    moe_spec = spec.moe
    assert moe_spec is not None
    if spec.traits.router == "fp32":
        return _route_fp32(m, x, pre)
    if spec.traits.router in routers.ROUTERS:  # sparsemixer, sigmoid (replay/routers.py)
        return routers.ROUTERS[spec.traits.router](m, x, pre)
    t, e, k = m.cfg.tokens, moe_spec.num_experts, moe_spec.experts_per_token
    router_logits = m.linear(x, f"{pre}.gate")
    f32 = s.cast(router_logits, "f32")
    probs = s.new(t * e, "f32")
    s.node("copy", (f32,), (probs,), (probs,))
    del f32
    top = s.new(t * k, "f32")
    top_idx = s.new(t * k, "i64")
    s.node("copy", (probs,), (top,), (top_idx,))
    del probs
    if spec.traits.router_renormalize:
        total = s.new(t, "f32")
        s.node("copy", (top,), (total,))
        original = s.new(t * k, "f32")
        s.node("pass", (top,), (original,))
        top2 = T(top.st, top.n, top.dt)
        s.node("mul", (original, total), (top2,), (original, total))
        top = top2
        del original, total, top2
    return router_logits, s.cast(top, router_logits.dt)


def _experts(m: CausalLM, pre: str, x: T, routing_weights: T) -> T:
    """grouped_mm_experts_forward (``integrations/moe.py``): every local lives until it returns; only the
    rebound ones (``proj_out``, ``weighted_out``) free their previous tensor on the way."""
    o, s, spec = m.o, m.s, m.spec
    moe_spec = spec.moe
    assert moe_spec is not None
    t, h, e = m.cfg.tokens, spec.hidden_size, moe_spec.num_experts
    fe, n_s = moe_spec.expert_intermediate_size, m.cfg.tokens * moe_spec.experts_per_token
    expert_ids_g = s.new(n_s, "i64")  # torch.sort(expert_ids): values and permutation
    perm = s.new(n_s, "i64")
    token_idx = s.new(n_s, "i64")  # perm // num_top_k
    selected = s.new(n_s * h, x.dt)  # hidden_states[perm // num_top_k]
    s.node("copy", (x,), (selected,), (token_idx,))
    del token_idx
    sample_weights_g = s.new(n_s, routing_weights.dt)
    s.node("copy", (routing_weights,), (sample_weights_g,), (perm,))
    histc_input = s.new(n_s, "f32")  # expert_ids_g.float() (CPU/MPS histc)
    tokens_per_expert = s.new(e, "f32")
    offsets = s.new(e, "i32")
    up_rows = 2 * fe if spec.mlp_gated else fe
    proj_out = grouped(m, selected, moe_lora.stack(m, f"{pre}.experts.gate_up_proj"), n_s * up_rows)
    if spec.mlp_gated:  # _default_apply_gate: chunk into gate/up views, act(gate) * up
        gate = T(proj_out.st, n_s * fe, proj_out.dt)
        s.node("pass", (proj_out,), (gate,))
        up = T(proj_out.st, n_s * fe, proj_out.dt)
        s.node("pass", (proj_out,), (up,))
        if spec.traits.experts_gate == "clamped_act_mul":  # DeepseekV4Experts._apply_gate
            gate, up = clamp(m, gate), clamp(m, up)
        proj_out = gated(m, gate, up)
        del gate, up
    else:
        proj_out = act(m, proj_out)
    proj_out = grouped(m, proj_out, moe_lora.stack(m, f"{pre}.experts.down_proj"), n_s * h)
    weighted_out = o.mul(proj_out, sample_weights_g, n_s * h)
    inv_perm = s.new(n_s, "i64")
    arange = s.new(n_s, "i64")
    del arange
    unperm = s.new(n_s * h, weighted_out.dt)  # weighted_out[inv_perm]
    s.node("copy", (weighted_out,), (unperm,), (inv_perm,))
    weighted_out = unperm
    del unperm
    final = s.new(t * h, weighted_out.dt)  # .view(t, k, h).sum(dim=1)
    s.node("pass", (weighted_out,), (final,))
    del expert_ids_g, perm, selected, sample_weights_g, histc_input, tokens_per_expert, offsets
    del proj_out, weighted_out, inv_perm
    return s.cast(final, x.dt)


def _route_fp32(m: CausalLM, x: T, pre: str) -> tuple[T, T]:
    """DeepseekV2TopkRouter / DeepseekV3TopkRouter: ``F.linear(x.float(), weight.float())`` (fp32 copies of
    the input and the router weight), fp32 scores (softmax, or sigmoid + correction bias), group-limited top-k
    (``masked_fill``), the top-k weights scaled by ``routed_scaling_factor``, left in fp32."""
    s, spec = m.s, m.spec
    moe_spec = spec.moe
    assert moe_spec is not None
    t, e, k, h = m.cfg.tokens, moe_spec.num_experts, moe_spec.experts_per_token, spec.hidden_size
    x32 = s.cast(x, "f32")
    w32 = s.cast(adapters.router_weight(m, pre), "f32")
    router_logits = m.o.linear(x32, w32, None, e, h)
    del x32, w32
    scores = s.new(t * e, "f32")
    s.node("copy", (router_logits,), (scores,), (scores,))
    choice = s.new(t * e, "f32")  # scores (+ e_score_correction_bias), masked outside the chosen groups
    top = s.new(t * k, "f32")
    top_idx = s.new(t * k, "i64")
    s.node("copy", (scores,), (top,), (top_idx,))
    del choice
    weights = m.o.mul(top, None)  # * routed_scaling_factor
    del top, scores
    return router_logits, weights


def moe(m: CausalLM, i: int, x: T) -> T:
    """A sparse MoE block (see the module docstring): the router's logits and weights live until the block
    returns (``_, routing_weights, selected_experts = self.gate(...)``), the shared expert runs after the
    routed ones, on the block's input."""
    if m.spec.traits.router_topk_softmax:  # GptOssMLP: its own router, biased experts (replay/moe_bias.py)
        return moe_bias.moe(m, i, x)
    if m.spec.traits.moe_scaled_input:  # Llama4TextMoe: every expert on every token (replay/chunked.py)
        return chunked.scaled_input_moe(m, i, x)
    o, s = m.o, m.s
    moe_spec = m.spec.moe
    assert moe_spec is not None
    pre = f"layers.{i}.mlp"
    x = routers.input_jitter(m, x)  # Phi-MoE / MiniMax-M2 training: the input scaled by noise in place
    first = m.spec.traits.shared_expert_first and moe_spec.shared_expert_intermediate_size
    sh_out = shared(m, pre, x) if first else None  # Qwen2MoeSparseMoeBlock: the shared expert runs first
    router_logits, routing_weights = _route(m, x, pre)
    if m.cfg.expert_linears:  # transformers 4.x: a loop over per-expert MLP modules
        final = moe_per_expert.experts(m, pre, x, routing_weights)
    else:
        final = _experts(m, pre, x, routing_weights)
    if moe_spec.shared_expert_intermediate_size:
        if sh_out is None:
            sh_out = shared(m, pre, x)
        if moe_spec.shared_expert_gate:
            g = m.linear(x, f"{pre}.shared_expert_gate")
            sig = s.new(g.n, g.dt)
            s.node("copy", (g,), (sig,), (sig,))
            del g
            sh_out = o.mul(sig, sh_out, sh_out.n)
            del sig
        final = o.add(final, sh_out)
    del router_logits, routing_weights
    return final
