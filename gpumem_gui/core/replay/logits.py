"""The output projection and the cross-entropy the losses of :mod:`.loss` share, eager or compiled.

Compiled (``torch.compile``, Inductor), ``F.cross_entropy(logits.float(), labels, ...)`` is one graph whose
upcast, ``log_softmax`` (row max, ``exp``, row sum, ``log``) and ``nll_loss`` gather are fused into row
reductions: no fp32 copy of the logits and no log-probabilities exist. What the min-cut partitioner
(``torch/_functorch/partitioners.py`` ``min_cut_rematerialization_partition``) keeps for backward is the
16-bit logits (the graph's input), the labels and two fp32 values per row (the row max and the log-sum-exp:
reductions, never recomputed, ``should_ban_recomputation`` ``ban_if_reduction``); backward recomputes the
softmax from them inside one fused kernel that writes the logits' gradient in their own dtype. Measured on
the CPU with Inductor (tests/reference/distributed/compile.json, validation/truth_compile.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpumem_gui.core.replay import adapters, block
from gpumem_gui.core.replay.autograd import Node, Sim
from gpumem_gui.core.replay.memory import DT_BYTES, Storage, T

if TYPE_CHECKING:
    from gpumem_gui.core.replay.context import CausalLM


def project(m: CausalLM, x: T, alone: bool = False) -> T:
    """The output projection of ``x``: the head, or the tied embedding (PEFT wraps a tied head like any
    nn.Linear); one forward call of the head module (FSDP2: a head unit of its own gathered around it;
    ``alone``: called by the loss after the model's forward returned)."""
    s, spec = m.s, m.spec
    d, v = spec.token_embedding_dim, spec.vocab_size
    s.hooks.module_forward(s, "head", True, alone)
    if m.has("lm_head.weight"):
        logits = m.linear(x, "lm_head")
    else:
        w = m.param("embed_tokens.weight")
        logits = m.o.linear(x, w, m.w("lm_head.bias"), v, d)
        if "lm_head.lora_A" in m.p:
            logits = adapters.lora(m, x, logits, "lm_head", v, d)
    s.hooks.module_forward(s, "head", False, alone)
    return logits


def head_logits(m: CausalLM, x: T, alone: bool = False) -> T:
    """The output projection of ``x`` with the TP gather and Gemma-2's final soft-capping, as
    :meth:`.model.CausalLM.head` does for all positions (``alone``: :func:`project`'s)."""
    s, spec = m.s, m.spec
    logits = block.gather_logits(m, project(m, x, alone))
    s.tr.retag(logits.st, logits.st.kind, "logits")  # type: ignore[arg-type]
    if spec.final_logit_softcapping:
        logits = m.o.tanh(m.o.mul(logits, None))
        logits = m.o.mul(logits, None)
    return logits


def causal_lm_loss(m: CausalLM, logits: T) -> T:
    """transformers ``ForCausalLMLoss`` (mean reduction) over the full logits: ``logits.float()``, the
    labels padded and shifted, ``cross_entropy`` = log_softmax + nll_loss (the fp32 copy dies after
    log_softmax, whose fp32 output both save). With ``compile_loss`` the model's forward is one compiled
    graph with its loss (``torch.compile(model)``; torchtitan's compiled ``cross_entropy_loss``): see
    :func:`compiled_cross_entropy`."""
    s, cfg = m.s, m.cfg
    s.tr.where = "loss"
    t, v = cfg.tokens, m.spec.vocab_size * cfg.logits_gather
    lf = logits if cfg.compile_loss else s.cast(logits, "f32")
    s.region = "inputs"
    padded = s.new(cfg.batch * (cfg.q + 1), "i64")
    # labels[..., 1:].contiguous(): a view for one sequence, a copy otherwise
    labels = s.new(t, "i64") if cfg.batch > 1 else padded
    s.region = "logits"
    if cfg.compile_loss:
        loss = compiled_cross_entropy(s, logits, labels, t, mean=True)
        s.region = "hidden_states"
        del labels, padded
        return loss
    ls = s.new(t * v, "f32")
    s.node("copy", (lf,), (ls,), (ls,))
    del lf
    s.region = "hidden_states"
    loss = s.new(1, "f32")
    total_weight = s.new(1, "f32")
    s.node("copy", (ls,), (loss,), (labels, total_weight))
    del ls, labels, total_weight, padded
    return loss


def cross_entropy_sum(s: Sim, logits: T, labels: T, compiled_rows: int = 0) -> T:
    """``F.cross_entropy(logits.float(), labels, reduction="sum")``: the upcast dies after log_softmax, whose
    output is saved by log_softmax and nll_loss; compiled (``compiled_rows``, the logits' rows, above 0):
    :func:`compiled_cross_entropy`."""
    if compiled_rows:
        return compiled_cross_entropy(s, logits, labels, compiled_rows)
    lf = s.cast(logits, "f32")
    ls = s.new(lf.n, "f32")
    s.node("copy", (lf,), (ls,), (ls,))
    del lf
    out = s.new(1, "f32")
    total_weight = s.new(1, "f32")
    s.node("copy", (ls,), (out,), (labels, total_weight))
    return out


def compiled_cross_entropy(s: Sim, logits: T, labels: T, rows: int, mean: bool = False) -> T:
    """``F.cross_entropy(logits.float(), labels, ...)`` compiled by Inductor over ``rows`` rows of logits (see
    the module docstring): the row max and log-sum-exp (fp32) are made and saved with the logits and the
    labels (and, for the mean, the count of labels that are not ignored); backward is one gradient of the
    logits' size and dtype."""
    amax = s.new(rows, "f32")
    lse = s.new(rows, "f32")
    total_weight = s.new(1, "f32") if mean else None
    out = s.new(1, "f32")
    s.node("custom", (logits,), (out,), (logits, labels, amax, lse, total_weight), ctx=grad_like_input)
    return out


def grad_like_input(sim: Sim, nd: Node, gout: list[Storage | None]) -> list[Storage | None]:
    """One new gradient of the input's size and dtype: ``SplitBackward`` (``torch.cat`` of the chunks'
    gradients) and the compiled cross-entropy's backward."""
    n, dt = nd.in_meta[0]
    return [sim.storage(round(n * DT_BYTES[dt]), "temporaries")]
