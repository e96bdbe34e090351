"""The output projection and the cross-entropy the losses of :mod:`.loss` share."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumem_gui.core.replay import adapters, block
from gpumem_gui.core.replay.autograd import Sim
from gpumem_gui.core.replay.memory import T

if TYPE_CHECKING:
    from gpumem_gui.core.replay.context import CausalLM


def head_logits(m: CausalLM, x: T) -> T:
    """The output projection of ``x`` (the head, or the tied embedding) with the TP gather and Gemma-2's
    final soft-capping, as :meth:`.model.CausalLM.head` does for all positions."""
    s, spec = m.s, m.spec
    d, v = spec.token_embedding_dim, spec.vocab_size
    if m.has("lm_head.weight"):
        logits = m.linear(x, "lm_head")
    else:
        w = m.param("embed_tokens.weight")
        logits = m.o.linear(x, w, m.w("lm_head.bias"), v, d)
        if "lm_head.lora_A" in m.p:
            logits = adapters.lora(m, x, logits, "lm_head", v, d)
    logits = block.gather_logits(m, logits)
    s.tr.retag(logits.st, logits.st.kind, "logits")  # type: ignore[arg-type]
    if spec.final_logit_softcapping:
        logits = m.o.tanh(m.o.mul(logits, None))
        logits = m.o.mul(logits, None)
    return logits


def cross_entropy_sum(s: Sim, logits: T, labels: T) -> T:
    """``F.cross_entropy(logits.float(), labels, reduction="sum")``: the upcast dies after log_softmax, whose
    output is saved by log_softmax and nll_loss."""
    lf = s.cast(logits, "f32")
    ls = s.new(lf.n, "f32")
    s.node("copy", (lf,), (ls,), (ls,))
    del lf
    out = s.new(1, "f32")
    total_weight = s.new(1, "f32")
    s.node("copy", (ls,), (out,), (labels, total_weight))
    return out
