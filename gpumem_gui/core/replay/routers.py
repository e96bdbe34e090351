"""MoE routers beyond transformers' TopKRouter and DeepSeek's fp32 router (:mod:`.mlp`), on symbolic tensors.

* ``sparsemixer`` (``models/phimoe/modeling_phimoe.py``, transformers 5.24): PhimoeTopKRouter is an
  nn.Linear, its logits in the activation dtype; two rounds pick one expert each: under ``no_grad`` the
  row maximum, ``scores.abs().clamp(min=max)`` and the boolean mask ``(max - scores) / factor > 2 eps``; the
  masked logits (``masked_fill``), their softmax (activation dtype) and the chosen probability
  (``gather``); the second round masks the first choice out of a copy (``torch.scatter``). Both rounds'
  weights and indices are concatenated ([t, 2]). In training, the choice is a Gumbel sample
  (``exponential_().log()`` of an ``empty_like``) and PhimoeMultiplier saves the multiplier, the choice and
  the masked probabilities.
* ``sigmoid`` (``models/minimax_m2/modeling_minimax_m2.py`` MiniMaxM2TopKRouter): logits in the activation
  dtype, ``sigmoid(logits.float())``, plus the fp32 ``e_score_correction_bias`` for the choice, ``gather``
  of the top-k sigmoid scores, renormalised in place and kept in fp32.

The functions take the :class:`~gpumem_gui.core.replay.model.CausalLM` they run in as ``m`` and return
(router logits, routing weights) as :func:`.mlp._route` does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumem_gui.core.replay import adapters
from gpumem_gui.core.replay.memory import T

if TYPE_CHECKING:
    from gpumem_gui.core.replay.context import CausalLM


def _threshold_mask(m: CausalLM, t: int, e: int, dt: str) -> tuple[T, T, T]:
    """``with torch.no_grad()``: (row max values, indices) of the (masked) logits, ``factor`` and the boolean
    mask; returns (factor, mask, max indices); the max values die with the comparison."""
    s = m.s
    top, idx = s.new(t, dt), s.new(t, "i64")
    absolute = s.new(t * e, dt)
    factor = s.new(t * e, dt)  # .clamp(min=...) of the abs
    del absolute
    diff = s.new(t * e, dt)
    ratio = s.new(t * e, dt)
    del diff
    mask = s.new(t * e, "bool")
    del ratio, top
    return factor, mask, idx


def _round(m: CausalLM, scores: T, masked_from: T, t: int, e: int) -> tuple[T, T, T, T]:
    """One selection: the masked logits' softmax and the chosen probability; returns (multiplier, choice,
    masked probabilities, factor) — the factor is held until the next round rebinds it."""
    s, dt = m.s, scores.dt
    factor, mask, idx = _threshold_mask(m, t, e, dt)
    gates = s.new(t * e, dt)  # masked_from.masked_fill(mask, -inf)
    s.node("copy", (masked_from,), (gates,), (mask,))
    if s.grad_enabled:  # Gumbel sample: empty_like().exponential_().log(), gates - noise, max(dim=-1)
        noise = s.new(t * e, dt)
        logn = s.new(t * e, dt)
        del noise
        diff = s.new(t * e, dt)
        del logn
        choice_v, idx = s.new(t, dt), s.new(t, "i64")
        del diff, choice_v
    del mask
    probs = s.new(t * e, dt)  # torch.softmax(masked_gates, dim=-1)
    s.node("copy", (gates,), (probs,), (probs,))
    del gates
    mult = s.new(t, dt)  # masked_gates.gather(dim=-1, index=selected_experts)
    s.node("copy", (probs,), (mult,), (idx,))
    if s.grad_enabled:  # max, rand_like > 0.75, logical_or, add(0.3333, alpha=0.6667).type_as, Multiplier
        mx, mx_i = s.new(t, dt), s.new(t, "i64")
        rnd = s.new(t, dt)
        eq, gt = s.new(t, "bool"), s.new(t, "bool")
        del rnd
        either = s.new(t, "bool")
        del eq, gt, mx, mx_i
        one = s.new(t, "f32")
        del either
        mask_one = s.cast(one, dt)
        del one
        out = s.new(t, dt)
        s.node("copy", (scores,), (out,), (mult, idx, probs))
        del mask_one
        mult = out
    return mult, idx, probs, factor


def sparsemixer(m: CausalLM, x: T, pre: str) -> tuple[T, T]:
    """PhimoeTopKRouter.forward and sparsemixer (see the module docstring); top-2 whatever top_k says."""
    s, o = m.s, m.o
    moe_spec = m.spec.moe
    assert moe_spec is not None
    t, e = m.cfg.tokens, moe_spec.num_experts
    scores = m.linear(x, f"{pre}.gate")
    mult1, idx1, probs1, factor = _round(m, scores, scores, t, e)
    masked_scores = s.new(t * e, scores.dt)  # torch.scatter(scores, -1, selected_experts, -inf)
    s.node("copy", (scores,), (masked_scores,), (idx1,))
    del factor
    mult2, idx2, probs2, factor = _round(m, scores, masked_scores, t, e)
    multiplier = o.cat(mult1, mult2)
    selected = s.new(2 * t, "i64")
    del mult1, mult2, idx1, idx2, probs1, probs2, factor, masked_scores, selected
    return scores, multiplier


def sigmoid_router(m: CausalLM, x: T, pre: str) -> tuple[T, T]:
    """MiniMaxM2TopKRouter.forward (see the module docstring)."""
    s = m.s
    moe_spec = m.spec.moe
    assert moe_spec is not None
    t, e, k = m.cfg.tokens, moe_spec.num_experts, moe_spec.experts_per_token
    router_logits = m.linear(x, f"{pre}.gate")
    f32 = s.cast(router_logits, "f32")
    weights = s.new(t * e, "f32")  # sigmoid(router_logits.float())
    s.node("copy", (f32,), (weights,), (weights,))
    del f32
    choice = s.new(t * e, "f32")  # + e_score_correction_bias
    top_v, top_idx = s.new(t * k, "f32"), s.new(t * k, "i64")
    del top_v
    top = s.new(t * k, "f32")  # routing_weights.gather(1, top_k_index)
    s.node("copy", (weights,), (top,), (top_idx,))
    total = s.new(t, "f32")  # top_k_weights /= top_k_weights.sum(dim=-1, keepdim=True)
    s.node("copy", (top,), (total,))
    original = s.new(t * k, "f32")
    s.node("pass", (top,), (original,))
    top2 = T(top.st, top.n, top.dt)
    s.node("mul", (original, total), (top2,), (original, total))
    del original, total, top, weights, choice, top_idx
    return router_logits, top2


def input_jitter(m: CausalLM, x: T) -> T:
    """``hidden_states *= torch.empty_like(hidden_states).uniform_(1 - noise, 1 + noise)`` in training, once
    per :attr:`ArchTraits.moe_input_jitter`: in place, the noise saved by MulBackward until backward."""
    s = m.s
    if not s.grad_enabled:
        return x
    for _ in range(m.spec.traits.moe_input_jitter):
        noise = s.new(x.n, x.dt)
        out = T(x.st, x.n, x.dt)
        s.node("mul", (x,), (out,), (noise,))
        del noise
        x = out
    return x


# ArchTraits.router -> the router's replay
ROUTERS = {"sparsemixer": sparsemixer, "sigmoid": sigmoid_router}


def fp32_softmax_router(m: CausalLM, x: T, pre: str) -> tuple[T, T]:
    """Ernie4_5_MoeTopKRouter.forward under ``maybe_autocast(enabled=False)``: ``F.linear(x.float(),
    weight.float())`` (the weight is kept fp32: ``_keep_in_fp32_modules_strict``), fp32 softmax, top-k of
    ``moe_statics(probs)`` (probs + bias, a new tensor), ``gather``, divided by the clamped sum (a new
    tensor), cast to the activation dtype."""
    s, o = m.s, m.o
    moe_spec = m.spec.moe
    assert moe_spec is not None
    t, e, k, h = m.cfg.tokens, moe_spec.num_experts, moe_spec.experts_per_token, m.spec.hidden_size
    x32 = s.cast(x, "f32")
    w32 = s.cast(adapters.router_weight(m, pre), "f32")
    router_logits = o.linear(x32, w32, None, e, h)
    del x32, w32
    probs = s.new(t * e, "f32")
    s.node("copy", (router_logits,), (probs,), (probs,))
    biased = s.new(t * e, "f32")
    top_v, top_idx = s.new(t * k, "f32"), s.new(t * k, "i64")
    del top_v, biased
    top = s.new(t * k, "f32")
    s.node("copy", (probs,), (top,), (top_idx,))
    del probs
    total = s.new(t, "f32")
    s.node("copy", (top,), (total,))
    clamped = s.new(t, "f32")
    s.node("pass", (total,), (clamped,))
    del total
    weights = s.new(t * k, "f32")
    s.node("mul", (top, clamped), (weights,), (top, clamped))
    del top, clamped, top_idx
    return router_logits, s.cast(weights, x.dt)


ROUTERS["fp32_softmax"] = fp32_softmax_router


def sigmoid_scaled_router(m: CausalLM, x: T, pre: str) -> tuple[T, T]:
    """Lfm2MoeTopKRouter.forward: ``F.linear`` logits and their sigmoid in the activation dtype; with the
    expert bias (``sigmoid_bias``) the top-k of ``scores + expert_bias`` (an fp32 sum) and ``gather`` of the
    scores, else (``sigmoid_topk``) the top-k of the scores; ``/ (sum + 1e-6)`` (norm_topk_prob) and
    ``* routed_scaling_factor``: each a new tensor in the activation dtype."""
    s = m.s
    moe_spec = m.spec.moe
    assert moe_spec is not None
    t, e, k = m.cfg.tokens, moe_spec.num_experts, moe_spec.experts_per_token
    router_logits = m.linear(x, f"{pre}.gate")
    dt = router_logits.dt
    scores = s.new(t * e, dt)  # router_logits.sigmoid()
    s.node("copy", (router_logits,), (scores,), (scores,))
    top, top_idx = s.new(t * k, dt), s.new(t * k, "i64")
    if m.spec.traits.router == "sigmoid_bias":
        del top
        choice = s.new(t * e, "f32")  # routing_weights + expert_bias (fp32 buffer)
        top_v, top_idx = s.new(t * k, "f32"), s.new(t * k, "i64")
        del choice, top_v
        top = s.new(t * k, dt)  # torch.gather(routing_weights, 1, selected_experts)
    s.node("copy", (scores,), (top,), (top_idx,))
    del scores
    if m.spec.traits.router_renormalize:
        total = s.new(t, dt)  # routing_weights.sum(dim=-1, keepdim=True)
        s.node("copy", (top,), (total,))
        eps = s.new(t, dt)  # + 1e-6
        s.node("pass", (total,), (eps,))
        del total
        top = m.o.mul(top, eps, t * k)  # the division saves both operands
        del eps
    weights = m.o.mul(top, None)  # * routed_scaling_factor
    del top, top_idx
    return router_logits, weights


ROUTERS["sigmoid_bias"] = ROUTERS["sigmoid_topk"] = sigmoid_scaled_router


def softmax_fp32_weights_router(m: CausalLM, x: T, pre: str) -> tuple[T, T]:
    """MiniMaxTopKRouter.forward: logits in the activation dtype, ``softmax(logits.float())``, top-k,
    ``router_top_value /= sum`` in place (the in-place division saves a clone of the values and the sum),
    the weights left in fp32 (so the experts' weighted outputs are fp32)."""
    s = m.s
    moe_spec = m.spec.moe
    assert moe_spec is not None
    t, e, k = m.cfg.tokens, moe_spec.num_experts, moe_spec.experts_per_token
    router_logits = m.linear(x, f"{pre}.gate")
    f32 = s.cast(router_logits, "f32")
    probs = s.new(t * e, "f32")
    s.node("copy", (f32,), (probs,), (probs,))
    del f32
    top, top_idx = s.new(t * k, "f32"), s.new(t * k, "i64")
    s.node("copy", (probs,), (top,), (top_idx,))
    del probs
    total = s.new(t, "f32")
    s.node("copy", (top,), (total,))
    original = s.new(t * k, "f32")
    s.node("pass", (top,), (original,))
    top2 = T(top.st, top.n, top.dt)
    s.node("mul", (original, total), (top2,), (original, total))
    del original, total, top, top_idx
    return router_logits, top2


ROUTERS["softmax_fp32_weights"] = softmax_fp32_weights_router
