"""gpt-oss's MoE block on symbolic tensors (``models/gpt_oss/modeling_gpt_oss.py``, ``integrations/moe.py``;
transformers 5.24).

* ``GptOssTopKRouter`` (:attr:`ArchTraits.router_topk_softmax`): logits of a linear with bias, ``torch.topk``
  of the logits (values and indices), a softmax over the k values in their dtype. ``GptOssMLP.forward`` keeps
  the logits (``_``) until it returns.
* ``GptOssExperts`` through ``grouped_mm_experts_forward`` (transformers' default experts implementation,
  ``has_bias=True``, ``is_transposed=True``): as the bias-free experts of :mod:`.mlp`, plus each projection's
  bias gathered per routed row (``gate_up_proj_bias[expert_ids_g]``, ``down_proj_bias[expert_ids_g]``) and
  added in place, and the gate of :attr:`ArchTraits.experts_gate`: gpt-oss's clamped SwiGLU
  (``GptOssExperts._apply_gate``) over the interleaved gate/up columns, or ``act(gate) * up``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumem_gui.core.replay import ffn
from gpumem_gui.core.replay.memory import T

if TYPE_CHECKING:
    from gpumem_gui.core.replay.context import CausalLM


def _route(m: CausalLM, x: T, pre: str, k: int) -> tuple[T, T, T]:
    """GptOssTopKRouter.forward -> (logits, scores, indices); the top-k values die at its return."""
    s, t = m.s, m.cfg.tokens
    router_logits = m.linear(x, f"{pre}.gate")
    top = s.new(t * k, router_logits.dt)
    top_idx = s.new(t * k, "i64")
    s.node("copy", (router_logits,), (top,), (top_idx,))  # TopkBackward saves the indices
    scores = s.new(t * k, top.dt)
    s.node("copy", (top,), (scores,), (scores,))  # softmax saves its output
    del top
    return router_logits, scores, top_idx


def _gather_bias(m: CausalLM, name: str, rows: int, width: int) -> T | None:
    """``bias[expert_ids_g]``: one bias row per routed row (IndexBackward saves the indices; its gradient is
    a zero-filled copy of the whole bias)."""
    if not m.has(name):
        return None
    b = m.param(name)
    out = m.s.new(rows * width, b.dt)
    m.s.node("copy", (b,), (out,))
    return out


def _add_(m: CausalLM, x: T, bias: T | None) -> T:
    """``out.add_(bias)``: in place (AddBackward saves nothing)."""
    if bias is None:
        return x
    out = T(x.st, x.n, x.dt)
    m.s.node("pass", (x, bias), (out,))
    return out


def _clamped_swiglu(m: CausalLM, proj: T) -> T:
    """GptOssExperts._apply_gate: strided views of the gate and up columns, each clamped into a new tensor
    (ClampBackward saves the view, so the projection), gate * sigmoid(gate * alpha), (up + 1) * glu."""
    o, s = m.o, m.s
    half = proj.n // 2
    gate_v, up_v = T(proj.st, half, proj.dt), T(proj.st, half, proj.dt)
    s.node("copy", (proj,), (gate_v,))  # gate_up[..., ::2]: SliceBackward, a full-size gradient
    s.node("copy", (proj,), (up_v,))  # gate_up[..., 1::2]
    gate = s.new(half, proj.dt)
    s.node("copy", (gate_v,), (gate,), (gate_v,))
    up = s.new(half, proj.dt)
    s.node("copy", (up_v,), (up,), (up_v,))
    del gate_v, up_v
    scaled = o.mul(gate, None)  # gate * alpha
    sig = s.new(half, proj.dt)
    s.node("copy", (scaled,), (sig,), (sig,))  # sigmoid saves its result
    del scaled
    glu = o.mul(gate, sig)
    del sig
    out = o.mul(o.add(up, None), glu)
    del gate, up, glu
    return out


def _gate(m: CausalLM, proj: T, fe: int, rows: int) -> T:
    if m.spec.traits.experts_gate == "clamped_swiglu":
        return _clamped_swiglu(m, proj)
    if not m.spec.mlp_gated:
        return ffn.act(m, proj)
    s = m.s
    gate, up = T(proj.st, rows * fe, proj.dt), T(proj.st, rows * fe, proj.dt)
    s.node("pass", (proj,), (gate,))
    s.node("pass", (proj,), (up,))
    return m.o.mul(ffn.act(m, gate), up)


def _experts(m: CausalLM, pre: str, x: T, weights: T) -> T:
    """grouped_mm_experts_forward with biases (see the module docstring): every local lives until it
    returns; ``selected_biases`` and ``proj_out`` free their previous tensor when rebound."""
    o, s, spec = m.o, m.s, m.spec
    moe_spec = spec.moe
    assert moe_spec is not None
    t, h, e = m.cfg.tokens, spec.hidden_size, moe_spec.num_experts
    fe, n_s = moe_spec.expert_intermediate_size, t * moe_spec.experts_per_token
    up_rows = 2 * fe if spec.mlp_gated else fe
    expert_ids_g = s.new(n_s, "i64")  # torch.sort(expert_ids): values and permutation
    perm = s.new(n_s, "i64")
    token_idx = s.new(n_s, "i64")  # perm // num_top_k
    selected = s.new(n_s * h, x.dt)
    s.node("copy", (x,), (selected,), (token_idx,))
    del token_idx
    sample_weights_g = s.new(n_s, weights.dt)
    s.node("copy", (weights,), (sample_weights_g,), (perm,))
    histc_input = s.new(n_s, "f32")  # expert_ids_g.float() (CPU histc)
    tokens_per_expert = s.new(e, "f32")
    offsets = s.new(e, "i32")
    biases = _gather_bias(m, f"{pre}.experts.gate_up_proj_bias", n_s, up_rows)
    gate_up = m.param(f"{pre}.experts.gate_up_proj")
    proj_out = _add_(m, ffn.grouped(m, selected, gate_up, n_s * up_rows), biases)
    proj_out = _gate(m, proj_out, fe, n_s)
    biases = _gather_bias(m, f"{pre}.experts.down_proj_bias", n_s, h)
    proj_out = _add_(m, ffn.grouped(m, proj_out, m.param(f"{pre}.experts.down_proj"), n_s * h), biases)
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
    del expert_ids_g, perm, selected, sample_weights_g, histc_input, tokens_per_expert, offsets, biases
    del proj_out, weighted_out, inv_perm
    return s.cast(final, x.dt)


def moe(m: CausalLM, i: int, x: T) -> T:
    """GptOssMLP.forward: the router's logits (``_``) live until it returns."""
    moe_spec = m.spec.moe
    assert moe_spec is not None
    pre = f"layers.{i}.mlp"
    router_logits, scores, indices = _route(m, x, pre, moe_spec.experts_per_token)
    out = _experts(m, pre, x, scores)
    del router_logits, scores, indices
    return out
